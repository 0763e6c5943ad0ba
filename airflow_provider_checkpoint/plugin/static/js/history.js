// History: one row per checkpoint, newest first, paged; a click opens the checkpoint's detail
// (#checkpoint=<id>, a URL a person can share).
import { badge, bytes, count, dagApi, duration, el, num, table, time } from "./common.js";

const PAGE = 20;
let offset = 0;

export function restoredFrom(r) {
  if (!r.restored) return "-";
  return r.restored_from_url || (r.restored_from == null ? "-" : `checkpoint ${r.restored_from}`);
}

function row(r) {
  const tr = el("tr", { class: "link", "data-id": r.checkpoint_id, tabindex: 0 },
    el("td", {}, el("a", { href: `#checkpoint=${r.checkpoint_id}` }, r.checkpoint_id)), el("td", {}, r.type),
    el("td", { class: "status" }, badge(r.status), r.reason ? el("div", { class: "muted reason" }, r.reason) : ""),
    el("td", { class: "time" }, time(r.trigger_time)), num(duration(r.duration_seconds)),
    num(count(r.records_in)), num(count(r.state_rows)), num(bytes(r.state_size)), num(bytes(r.bytes_written)),
    num(count(r.files)), el("td", { class: "mono" }, restoredFrom(r)));
  const open = () => { location.hash = `checkpoint=${r.checkpoint_id}`; };
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  return tr;
}

const HEADERS = [
  "ID", "Type", "Status", "Trigger time", { label: "Duration", num: true }, { label: "Records in", num: true },
  { label: "State rows", num: true }, { label: "State size", num: true }, { label: "Written", num: true },
  { label: "Files", num: true }, "Restored from",
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
