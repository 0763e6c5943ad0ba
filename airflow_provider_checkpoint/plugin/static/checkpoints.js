// The Checkpoints page: plain JavaScript and SVG, no build step, nothing from a CDN.
// It calls the plugin's JSON endpoints (same origin: Airflow's _token cookie authenticates),
// shows times in the timezone chosen in the Airflow UI, and refreshes itself every 5 s.
"use strict";

const API = "../api";
const PAGE = 20;
const params = new URLSearchParams(location.search);
const dagId = params.get("dag_id");
let offset = 0;

function timezone() {
  const stored = localStorage.getItem("timezone"); // the Airflow UI's timezone selector
  let zone = stored;
  try { zone = JSON.parse(stored); } catch (e) { /* stored unquoted */ }
  try { new Intl.DateTimeFormat(undefined, { timeZone: zone }); return zone; } catch (e) {
    return Intl.DateTimeFormat().resolvedOptions().timeZone;
  }
}
const TZ = timezone();
const timeFormat = new Intl.DateTimeFormat(undefined, {
  timeZone: TZ, year: "numeric", month: "2-digit", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
});

function time(seconds) { return seconds == null ? "-" : timeFormat.format(new Date(seconds * 1000)); }

function duration(s) {
  if (s == null) return "-";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(1)}s`;
  let m = Math.floor(Math.round(s) / 60); const sec = Math.round(s) % 60;
  if (m < 60) return `${m}m ${String(sec).padStart(2, "0")}s`;
  let h = Math.floor(m / 60); m %= 60;
  if (h < 24) return `${h}h ${String(m).padStart(2, "0")}m`;
  const d = Math.floor(h / 24); h %= 24;
  return `${d}d ${String(h).padStart(2, "0")}h`;
}

function bytes(n) {
  if (n == null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  return u === 0 ? `${n} B` : `${v.toFixed(1)} ${units[u]}`;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "-" : String(c)));
  return node;
}

function badge(state) { return el("span", { class: `badge ${state}` }, state); }

function say(text, kind = "ok") {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = kind;
  box.hidden = false;
}

async function call(path, options = {}) {
  const r = await fetch(`${API}${path}`, {
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    ...options,
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
    const why = { 401: "not logged in", 403: "not allowed" }[r.status] || `HTTP ${r.status}`;
    throw new Error(`${why}: ${detail}`);
  }
  return body;
}

// -- charts: one SVG line per series, ids on the x axis -------------------------------
function chart(svg, rows, value, format) {
  const W = 480, H = 180, L = 64, R = 12, T = 12, B = 28;
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text != null) n.textContent = text;
    svg.append(n);
    return n;
  };
  const points = rows.filter((r) => value(r) != null).sort((a, b) => a.checkpoint_id - b.checkpoint_id);
  if (!points.length) { add("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"); return; }
  const max = Math.max(...points.map(value)) || 1;
  const ids = points.map((r) => r.checkpoint_id);
  const lo = Math.min(...ids), hi = Math.max(...ids);
  const x = (id) => L + (hi === lo ? (W - L - R) / 2 : ((id - lo) / (hi - lo)) * (W - L - R));
  const y = (v) => T + (1 - v / max) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    add("line", { class: "grid", x1: L, x2: W - R, y1: y(max * f), y2: y(max * f) });
    add("text", { x: L - 6, y: y(max * f) + 3, "text-anchor": "end" }, format(max * f));
  }
  add("polyline", { class: "series", points: points.map((r) => `${x(r.checkpoint_id)},${y(value(r))}`).join(" ") });
  for (const r of points) {
    const dot = add("circle", { class: `dot ${r.status}`, cx: x(r.checkpoint_id), cy: y(value(r)), r: 3.5 });
    const title = document.createElementNS(ns, "title");
    title.textContent = `checkpoint ${r.checkpoint_id}: ${format(value(r))}`;
    dot.append(title);
  }
  const step = Math.max(1, Math.ceil(points.length / 10));
  points.forEach((r, i) => {
    if (i % step === 0 || i === points.length - 1) {
      add("text", { x: x(r.checkpoint_id), y: H - 10, "text-anchor": "middle" }, r.checkpoint_id);
    }
  });
}

// -- views ---------------------------------------------------------------------------
async function showJobs() {
  document.getElementById("jobs-view").hidden = false;
  const jobs = await call("/jobs");
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...jobs.map((j) => {
    const latest = j.latest_completed || {};
    const row = el("tr", { class: "link" },
      el("td", {}, j.job_id), el("td", {}, j.dag_id), el("td", {}, badge(j.status)),
      el("td", {}, latest.checkpoint_id), el("td", {}, time(latest.completion_time)),
      el("td", { class: "mono" }, j.storage));
    row.addEventListener("click", () => { location.search = `?dag_id=${encodeURIComponent(j.dag_id)}`; });
    return row;
  }));
  document.getElementById("no-jobs").hidden = jobs.length > 0;
}

function malformedCell(r) {
  const perSource = Object.entries(r.source_malformed || {}).map(([uid, n]) => `${uid}: ${n}`).join(", ");
  return el("td", { class: "num", title: perSource }, r.malformed_records == null ? "-" : r.malformed_records);
}

function restoredFrom(r) { return r.restored_from_url || (r.restored_from == null ? "-" : `checkpoint ${r.restored_from}`); }

async function showJob() {
  document.getElementById("job-view").hidden = false;
  const [s, page, chartPage] = await Promise.all([
    call(`/dags/${encodeURIComponent(dagId)}/status`),
    call(`/dags/${encodeURIComponent(dagId)}/history?offset=${offset}&limit=${PAGE}`),
    call(`/dags/${encodeURIComponent(dagId)}/history?offset=0&limit=100`),
  ]);
  document.getElementById("title").textContent = `Checkpoints of ${s.job_id}`;
  document.getElementById("status").replaceChildren(badge(s.status));
  document.getElementById("status-reason").textContent = s.status_reason || "";
  const latest = s.latest_completed;
  document.getElementById("latest").replaceChildren(latest && latest.checkpoint_id != null
    ? el("div", {}, `${latest.type} ${latest.checkpoint_id} at ${time(latest.completion_time)}`)
    : el("div", { class: "muted" }, latest && latest.error ? latest.error : "none yet"));
  const restore = s.last_restore;
  const pending = s.pending_restore;
  document.getElementById("last-restore").replaceChildren(
    restore ? el("div", {}, `checkpoint ${restore.checkpoint_id} restored from `,
      el("span", { class: "mono" }, restore.restored_from_url), ` at ${time(restore.end_time)}`)
      : el("div", { class: "muted" }, "never restored"),
    pending ? el("div", {}, "pending restore from ", el("span", { class: "mono" }, pending.location_url || pending.error)) : "");

  document.querySelector("#history tbody").replaceChildren(...page.rows.map((r) => el("tr", { "data-id": r.checkpoint_id },
    el("td", {}, r.checkpoint_id), el("td", {}, r.type),
    el("td", { title: r.message || "" }, badge(r.status), r.reason ? ` ${r.reason}` : ""),
    el("td", {}, time(r.trigger_time)), el("td", {}, time(r.end_time)), el("td", { class: "num" }, duration(r.duration_seconds)),
    el("td", { class: "num" }, r.records_in), malformedCell(r), el("td", { class: "num" }, r.state_rows),
    el("td", { class: "num" }, bytes(r.state_size)), el("td", { class: "num" }, bytes(r.bytes_written)),
    el("td", { class: "num" }, r.files), el("td", { class: "mono" }, restoredFrom(r)))));
  const last = Math.min(page.total, offset + page.rows.length);
  document.getElementById("page-info").textContent = page.total ? `${offset + 1}–${last} of ${page.total}` : "no checkpoints yet";
  document.getElementById("newer").disabled = offset === 0;
  document.getElementById("older").disabled = last >= page.total;

  chart(document.getElementById("chart-duration"), chartPage.rows, (r) => r.duration_seconds, duration);
  chart(document.getElementById("chart-size"), chartPage.rows.filter((r) => r.status === "COMPLETED"), (r) => r.state_size, bytes);

  document.querySelector("#savepoints tbody").replaceChildren(...s.savepoints.map((sp) => el("tr", {},
    el("td", {}, sp.checkpoint_id), el("td", {}, time(sp.time)), el("td", { class: "mono" }, sp.path))));
}

async function savepoint(stop) {
  const dir = document.getElementById("savepoint-dir").value.trim();
  try {
    const run = await call(`/dags/${encodeURIComponent(dagId)}/savepoint`, {
      method: "POST", body: JSON.stringify({ savepoint_dir: dir || null, stop }),
    });
    say(`Savepoint run ${run.dag_run_id} triggered${stop ? " (the job stops after it)" : ""}; it appears here when it completes.`);
  } catch (e) { say(String(e.message), "error"); }
}

async function restore(form) {
  const data = new FormData(form);
  const body = {
    checkpoint: String(data.get("checkpoint")).trim(),
    allow_non_restored_state: data.has("allow_non_restored_state"),
    dry_run: data.has("dry_run"),
    trigger_pipeline: data.has("trigger_pipeline"),
  };
  try {
    const s = await call(`/dags/${encodeURIComponent(dagId)}/restore`, { method: "POST", body: JSON.stringify(body) });
    const what = `${s.type} ${s.checkpoint_id} at ${s.snapshot}`;
    say(s.dry_run ? `Dry run: ${s.job_id} can be restored from ${what}; nothing written.`
      : `Restore of ${s.job_id} from ${what} requested${s.dag_run_id ? `; run ${s.dag_run_id} takes it` : ""}.`);
  } catch (e) { say(String(e.message), "error"); }
}

async function refresh() {
  try {
    if (dagId) await showJob(); else await showJobs();
  } catch (e) { say(String(e.message), "error"); }
}

function wire() {
  document.getElementById("tz").textContent = `times in ${TZ}`;
  if (dagId) {
    document.getElementById("take-savepoint").addEventListener("click", () => savepoint(false));
    document.getElementById("stop-savepoint").addEventListener("click", () => savepoint(true));
    const dialog = document.getElementById("restore-dialog");
    document.getElementById("open-restore").addEventListener("click", () => dialog.showModal());
    document.getElementById("restore-cancel").addEventListener("click", () => dialog.close());
    document.getElementById("restore-form").addEventListener("submit", (e) => { restore(e.target); });
    document.getElementById("newer").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); refresh(); });
    document.getElementById("older").addEventListener("click", () => { offset += PAGE; refresh(); });
  }
  refresh();
  setInterval(refresh, 5000);
}

wire();
