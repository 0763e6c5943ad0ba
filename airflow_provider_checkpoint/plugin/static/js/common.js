// Shared helpers of the Checkpoints page: Airflow's theme and timezone, formatting, DOM, the JSON API.
//
// The page is shown in an iframe of Airflow's UI (same origin). Airflow 3's UI is Chakra UI with
// next-themes: the color mode is the class "light" or "dark" of its <html> (stored in localStorage
// "theme"), its colors are CSS custom properties "--chakra-colors-*". The page mirrors the ones its
// stylesheet uses from the parent document and follows every change; opened on its own it falls
// back to localStorage "theme" and the system preference, with Chakra's default colors.

export const dagId = new URLSearchParams(location.search).get("dag_id");

// -- theme ----------------------------------------------------------------------------
function parentRoot() {
  try {
    return window.parent !== window ? window.parent.document.documentElement : null;
  } catch (e) {
    return null; // another origin: no access
  }
}

let mirrored; // the --chakra-* properties the stylesheet uses
function mirroredNames() {
  mirrored ??= [...new Set(
    [...document.styleSheets].flatMap((sheet) => [...sheet.cssRules].map((r) => r.cssText))
      .join(" ").match(/--chakra-[a-z0-9-]+/g) || [],
  )];
  return mirrored;
}

function applyTheme() {
  const root = document.documentElement;
  const airflow = parentRoot();
  let dark;
  if (airflow && /\b(light|dark)\b/.test(airflow.className)) {
    dark = airflow.classList.contains("dark");
    const computed = getComputedStyle(airflow);
    for (const name of mirroredNames()) {
      const value = computed.getPropertyValue(name);
      if (value) root.style.setProperty(name, value); else root.style.removeProperty(name);
    }
  } else {
    const chosen = localStorage.getItem("theme");
    dark = chosen === "dark" || (chosen !== "light" && matchMedia("(prefers-color-scheme: dark)").matches);
  }
  root.classList.toggle("dark", dark);
  root.classList.toggle("light", !dark);
}

export function followTheme() {
  applyTheme();
  const airflow = parentRoot();
  if (airflow) new MutationObserver(applyTheme).observe(airflow, { attributes: true, attributeFilter: ["class", "style"] });
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  addEventListener("storage", (e) => { if (e.key === "theme") applyTheme(); });
}

// -- times: Airflow's format "2026-11-25 18:14:40" in the timezone chosen in its UI -------
let zone;
let timeFormat;

function chosenZone() {
  const fallback = Intl.DateTimeFormat().resolvedOptions().timeZone; // Airflow's default too
  const stored = localStorage.getItem("timezone"); // JSON, as Airflow's useLocalStorage writes it
  let wanted = stored;
  try { wanted = JSON.parse(stored); } catch (e) { /* stored unquoted */ }
  try {
    new Intl.DateTimeFormat("en", { timeZone: wanted || fallback });
    return wanted || fallback;
  } catch (e) {
    return fallback;
  }
}

export function useChosenZone() {
  zone = chosenZone();
  timeFormat = new Intl.DateTimeFormat("en-US", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
  return zone;
}
useChosenZone();

export function time(seconds) {
  if (seconds == null) return "-";
  const p = Object.fromEntries(timeFormat.formatToParts(new Date(seconds * 1000)).map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
}

// Airflow's duration format (its renderDuration): "00:00:49.282" under a minute, "00:04:05" under a day,
// "3d04:00:00" beyond; "-" when unknown.
export function duration(s) {
  if (s == null) return "-";
  const ms = Math.max(0, Math.round(Number(s.toFixed(3)) * 1000));
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  const total = Math.floor(ms / 1000);
  const clock = `${pad(Math.floor(total / 3600) % 24)}:${pad(Math.floor(total / 60) % 60)}:${pad(total % 60)}`;
  if (total < 60 && ms % 1000) return `${clock}.${pad(ms % 1000, 3)}`;
  return total < 86400 ? clock : `${Math.floor(total / 86400)}d${clock}`;
}

export function bytes(n) {
  if (n == null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  return u === 0 ? `${Math.round(n)} B` : `${v.toFixed(1)} ${units[u]}`;
}

export function count(n) { return n == null ? "-" : String(Math.round(n)); }

// -- DOM ------------------------------------------------------------------------------
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null && v !== false) node.setAttribute(k, v === true ? "" : v);
  for (const c of children.flat()) {
    if (c === "") continue;
    node.append(c instanceof Node ? c : document.createTextNode(c == null ? "-" : String(c)));
  }
  return node;
}

// a checkpoint's or job's status as Airflow's state badge: its state colors and icons; task states as they are
const BADGE = { COMPLETED: "success", RUNNING: "running", ABORTED: "failed", FAILED: "failed", UNREADABLE: "failed", STOPPED: "queued" };
const ICON = { // the shapes of Airflow's StateIcon (check, cross, activity, queue, redo; else a dashed circle)
  success: "M20 6 9 17l-5-5", failed: "M18 6 6 18M6 6l12 12", running: "M22 12h-4l-3 9L9 3l-3 9H2",
  queued: "M4 6h16M4 12h16M4 18h10", up_for_retry: "M15 14l5-5-5-5M20 9H9.5A5.5 5.5 0 0 0 4 14.5 5.5 5.5 0 0 0 9.5 20H13",
};
const SVG_NS = "http://www.w3.org/2000/svg";
function stateIcon(kind) {
  const svg = document.createElementNS(SVG_NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: "0 0 24 24", class: "state-icon", "aria-hidden": "true" })) svg.setAttribute(k, v);
  const shape = document.createElementNS(SVG_NS, ICON[kind] ? "path" : "circle");
  const attrs = ICON[kind] ? { d: ICON[kind] } : { cx: 12, cy: 12, r: 9, "stroke-dasharray": "3 3" };
  for (const [k, v] of Object.entries(attrs)) shape.setAttribute(k, v);
  svg.append(shape);
  return svg;
}
export function badge(state) {
  const kind = BADGE[state] || state.toLowerCase();
  return el("span", { class: `badge ${kind}` }, stateIcon(kind), state);
}

// numeric cells are right-aligned and never wrap
export function num(value) { return el("td", { class: "num" }, value); }

export function table(headers, rows, attrs = {}) {
  return el("div", { class: "table-wrap" }, el("table", attrs,
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label ?? h)))),
    el("tbody", {}, rows)));
}

export function fields(pairs) {
  return el("dl", { class: "fields" }, pairs.filter(([, v]) => v !== undefined).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// -- links into Airflow's UI (the page lives under <airflow>/checkpoints/ui/) ------------
// Airflow sandboxes the iframe without allow-top-navigation: a link cannot navigate the top
// window. Same origin, the page asks Airflow's router instead (push the path, signal popstate).
const AIRFLOW_ROOT = location.pathname.replace(/\/checkpoints\/ui\/.*$/, "");
export function airflowLink(path, text) {
  const link = el("a", { href: `${AIRFLOW_ROOT}${path}`, target: "_top" }, text);
  link.addEventListener("click", (e) => {
    if (!parentRoot() || e.ctrlKey || e.metaKey || e.shiftKey) return; // on its own, or a new tab: the link as is
    e.preventDefault();
    window.parent.history.pushState(null, "", link.href);
    window.parent.dispatchEvent(new PopStateEvent("popstate", { state: null }));
  });
  return link;
}

// -- the JSON API -----------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, detail) {
    const why = { 401: "not logged in", 403: "not allowed" }[status] || `HTTP ${status}`;
    super(`${why}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }

  get noJobYet() { return this.status === 404 && /has no checkpointed job yet/.test(this.detail); }
}

export async function call(path, options = {}) {
  const r = await fetch(`../api${path}`, {
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    ...options,
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body));
  return body;
}

export const dagApi = (path, options) => call(`/dags/${encodeURIComponent(dagId)}${path}`, options);

// An action's answer (a savepoint triggered, a restore refused) stays until dismissed or replaced; an error
// loading the view ("load") goes away once the view loads again.
export function say(text, kind = "ok", source = "action") {
  const box = document.getElementById("message");
  document.getElementById("message-text").textContent = text;
  box.className = `alert ${kind}`;
  box.dataset.source = source;
  box.hidden = false;
}

export function clearLoadError() {
  const box = document.getElementById("message");
  if (box.dataset.source === "load") box.hidden = true;
}
