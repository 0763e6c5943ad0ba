// History: one row per checkpoint, newest first, paged; a click opens the checkpoint's detail
// (#checkpoint=<id>, a URL a person can share).
import { airflowLink, badge, bytes, count, dagApi, dagId, duration, el, num, table, time } from "./common.js";

const PAGE = 20;
let offset = 0;

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

function row(r) {
  const restored = restoredFrom(r);
  const tr = el("tr", { class: `link${r.discarded ? " discarded" : ""}`, "data-id": r.checkpoint_id, tabindex: 0 },
    el("td", {}, el("a", { href: `#checkpoint=${r.checkpoint_id}` }, r.checkpoint_id)), el("td", {}, r.type),
    el("td", { class: "status" }, badge(r.status), r.discarded ? [" ", discardedBadge()] : "",
      r.reason ? el("div", { class: "muted reason" }, r.reason) : ""),
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
  "ID", "Type", "Status", "DAG run", "Trigger time", { label: "Duration", num: true }, { label: "Records in", num: true },
  { label: "State size", num: true }, { label: "Written", num: true }, "Restored from",
];

export async function showHistory(view, status, rerender) {
  const page = await dagApi(`/history?offset=${offset}&limit=${PAGE}`);
  const last = Math.min(page.total, offset + page.rows.length);
  const newer = el("button", { type: "button", class: "button outline", id: "newer", disabled: offset === 0 }, "‹ Newer");
  const older = el("button", { type: "button", class: "button outline", id: "older", disabled: last >= page.total }, "Older ›");
  newer.addEventListener("click", () => { offset = Math.max(0, offset - PAGE); rerender(); });
  older.addEventListener("click", () => { offset += PAGE; rerender(); });
  view.replaceChildren(
    table(HEADERS, page.rows.map(row), { id: "history" }),
    el("div", { class: "pager" }, newer,
      el("span", { class: "muted", id: "page-info" }, page.total ? `${offset + 1}–${last} of ${page.total}` : "no checkpoints yet"),
      older),
  );
}
