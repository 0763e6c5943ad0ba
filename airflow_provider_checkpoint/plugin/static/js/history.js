// History: one row per checkpoint, paged, filtered by status and kind, sorted by id, trigger time or
// duration; a click opens the checkpoint's detail (#checkpoint=<id>). The view's state is its address,
// #history?status=ABORTED&kind=restore&sort=duration&order=asc&page=2 (size=N: rows per page), so a
// reload or a shared link opens the same page.
import { airflowLink, badge, bytes, count, dagApi, dagId, duration, el, num, table, time } from "./common.js";

const PAGE = 20;
const STATUSES = ["COMPLETED", "ABORTED", "UNKNOWN"];
const KINDS = ["checkpoint", "savepoint", "restore"];
const SORTS = { ID: "id", "Trigger time": "time", Duration: "duration" };

// The History view's state from the address (what is malformed falls back to the default).
export function historyState(hash = location.hash) {
  const q = new URLSearchParams(hash.split("?")[1] || "");
  const int = (name, fallback, max) => (/^\d+$/.test(q.get(name) || "") ? Math.min(max, Math.max(1, Number(q.get(name)))) : fallback);
  return {
    status: STATUSES.includes(q.get("status")) ? q.get("status") : "",
    kind: KINDS.includes(q.get("kind")) ? q.get("kind") : "",
    sort: Object.values(SORTS).includes(q.get("sort")) ? q.get("sort") : "id",
    order: q.get("order") === "asc" ? "asc" : "desc",
    page: int("page", 1, 1e9),
    size: int("size", PAGE, 500),
  };
}

// The address of a History state: only what differs from the defaults.
export function historyHash(state) {
  const q = new URLSearchParams();
  if (state.status) q.set("status", state.status);
  if (state.kind) q.set("kind", state.kind);
  if (state.sort !== "id") q.set("sort", state.sort);
  if (state.order !== "desc") q.set("order", state.order);
  if (state.page > 1) q.set("page", String(state.page));
  if (state.size !== PAGE) q.set("size", String(state.size));
  return q.size ? `history?${q}` : "history";
}

let lastHistory = "history"; // the detail's "‹ History" goes back to the page it was opened from
export function backToHistory() { return `#${lastHistory}`; }

export function restoredFrom(r) {
  if (!r.restored) return "-";
  return r.restored_from_url || (r.restored_from == null ? "-" : `checkpoint ${r.restored_from}`);
}

export function runPath(runId) {
  return `/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(runId)}`;
}

// Completed, then deleted by retention (Flink's "discarded"): shown, but not restorable any more.
export function discardedBadge() {
  return el("span", { class: "badge discarded", title: "Deleted by retention: it cannot be restored any more" }, "discarded");
}

function runCell(runId) {
  if (!runId) return el("td", {}, "-");
  const link = airflowLink(runPath(runId), runId);
  link.addEventListener("click", (e) => e.stopPropagation()); // the run, not the row's detail
  return el("td", { class: "mono clip", title: runId }, link);
}

// An aborted checkpoint's whole reason, as its detail shows it: the reason and its message.
function reason(r) {
  if (!r.reason && !r.message) return "";
  return el("div", { class: "muted reason" }, r.reason ? el("strong", {}, r.reason) : "", r.reason && r.message ? " " : "",
    r.message || "");
}

function row(r) {
  const restored = restoredFrom(r);
  const tr = el("tr", { class: `link${r.discarded ? " discarded" : ""}`, "data-id": r.checkpoint_id, tabindex: 0 },
    el("td", {}, el("a", { href: `#checkpoint=${r.checkpoint_id}` }, r.checkpoint_id)),
    el("td", {}, r.restored ? "restore" : r.type),
    el("td", { class: "status" }, badge(r.status), r.discarded ? [" ", discardedBadge()] : "",
      r.status === "COMPLETED" ? "" : reason(r)),
    runCell(r.run_id),
    el("td", { class: "time" }, time(r.trigger_time)), num(duration(r.duration_seconds)),
    num(count(r.records_in)), num(bytes(r.state_size)), num(bytes(r.bytes_written)),
    el("td", { class: "mono clip", title: restored }, restored));
  const open = () => { location.hash = `checkpoint=${r.checkpoint_id}`; };
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  return tr;
}

const HEADERS = [
  "ID", "Kind", "Status", "DAG run", "Trigger time", { label: "Duration", num: true }, { label: "Records in", num: true },
  { label: "State size", num: true }, { label: "Written", num: true }, "Restored from",
];

const go = (state) => { location.hash = historyHash(state); };

function choice(id, label, value, options, onChange) {
  const select = el("select", { id, class: "input", "aria-label": label },
    el("option", { value: "" }, `${label}: all`), options.map((o) => el("option", { value: o, selected: o === value }, o)));
  select.addEventListener("change", () => onChange(select.value));
  return select;
}

// A click on a sortable head sorts by it (newest / longest first), a second click reverses.
function sortable(tableNode, state) {
  for (const th of tableNode.querySelectorAll("thead th")) {
    const key = SORTS[th.textContent];
    if (!key) continue;
    th.classList.add("sortable");
    th.tabIndex = 0;
    th.title = `Sort by ${th.textContent.toLowerCase()}`;
    if (key === state.sort) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
    const sort = () => go({ ...state, sort: key, order: key === state.sort && state.order === "desc" ? "asc" : "desc", page: 1 });
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter") sort(); });
  }
}

function pageInfo(state, page, pages, filtered) {
  if (!page.total) return filtered ? "no checkpoint matches the filters" : "no checkpoints yet";
  if (!page.rows.length) return `Page ${state.page} is past the last (${pages})`;
  const first = (state.page - 1) * state.size + 1;
  return `Page ${state.page} of ${pages} · ${first}–${first + page.rows.length - 1} of ${page.total}`;
}

export async function showHistory(view) {
  const state = historyState();
  lastHistory = historyHash(state);
  const offset = (state.page - 1) * state.size;
  const q = new URLSearchParams({ offset: String(offset), limit: String(state.size), sort: state.sort, order: state.order });
  if (state.status) q.set("status", state.status);
  if (state.kind) q.set("kind", state.kind);
  const page = await dagApi(`/history?${q}`);
  const last = offset + page.rows.length;
  const pages = Math.max(1, Math.ceil(page.total / state.size));
  const newer = el("button", { type: "button", class: "button outline", id: "newer", disabled: state.page <= 1 }, "‹ Previous");
  const older = el("button", { type: "button", class: "button outline", id: "older", disabled: last >= page.total }, "Next ›");
  newer.addEventListener("click", () => go({ ...state, page: Math.min(pages, state.page - 1) }));
  older.addEventListener("click", () => go({ ...state, page: state.page + 1 }));
  const filtered = state.status || state.kind;
  const history = table(HEADERS, page.rows.map(row), { id: "history", "data-state": lastHistory }); // tests wait for it
  sortable(history, state);
  view.replaceChildren(
    el("div", { class: "filters" },
      choice("filter-status", "Status", state.status, STATUSES, (v) => go({ ...state, status: v, page: 1 })),
      choice("filter-kind", "Kind", state.kind, KINDS, (v) => go({ ...state, kind: v, page: 1 })),
      filtered ? el("a", { href: "#history", id: "clear-filters" }, "Clear filters") : ""),
    history,
    el("div", { class: "pager" }, newer,
      el("span", { class: "muted", id: "page-info" }, pageInfo(state, page, pages, filtered)),
      older),
  );
}
