// Overview: the job's status, counts of checkpoints, the latest completed, failed, savepoint and
// restore (each linked to its detail), the retained savepoints.
import { badge, count, dagApi, el, fields, table, time } from "./common.js";

function checkpointLink(id) {
  return el("a", { href: `#checkpoint=${id}`, class: "mono" }, `#${id}`);
}

function statusCard(s) {
  const restore = s.last_restore;
  const pending = s.pending_restore;
  return el("div", { class: "card" }, el("h3", {}, "Job"), fields([
    ["Status", el("span", {}, badge(s.status), s.status_reason ? el("span", { class: "muted" }, ` ${s.status_reason}`) : "")],
    ["Storage", el("span", { class: "mono" }, s.storage)],
    ["Last restore", restore ? el("span", {}, checkpointLink(restore.checkpoint_id), ` at ${time(restore.trigger_time)} from `,
      el("span", { class: "mono" }, restore.restored_from_url || "-")) : el("span", { class: "muted" }, "never restored")],
    ...(pending ? [["Pending restore", el("span", { class: "mono" }, pending.location_url || pending.error)]] : []),
  ]));
}

function counter(label, n, kind) {
  return el("div", { class: `card stat ${kind}` }, el("div", { class: "stat-label" }, label), el("div", { class: "stat-value" }, count(n)));
}

function latestRow(label, ref) {
  if (!ref) return el("tr", {}, el("th", { scope: "row" }, label), el("td", { colspan: 4, class: "muted" }, "none yet"));
  return el("tr", { "data-kind": label },
    el("th", { scope: "row" }, label), el("td", {}, checkpointLink(ref.checkpoint_id)),
    el("td", { class: "time" }, time(ref.time)), el("td", { class: "mono" }, ref.path || "-"),
    el("td", {}, ref.reason || ""));
}

export async function showOverview(view, status) {
  const o = await dagApi("/overview");
  const c = o.counts;
  view.replaceChildren(
    el("div", { class: "stats" },
      counter("Completed", c.completed, "success"), counter("Failed", c.failed, c.failed ? "failed" : ""),
      counter("In progress", c.in_progress, "running"), counter("Restored", c.restored, "info")),
    statusCard(status),
    el("h3", {}, "Latest"),
    table(["", "Checkpoint", "Time", "Location", "Reason"], [
      latestRow("Completed", o.latest.completed), latestRow("Failed", o.latest.failed),
      latestRow("Savepoint", o.latest.savepoint), latestRow("Restore", o.latest.restore),
    ], { id: "latest" }),
    el("h3", {}, "Savepoints"),
    status.savepoints.length
      ? table(["Checkpoint", "Taken at", "Path"], status.savepoints.map((sp) => el("tr", {},
        el("td", {}, checkpointLink(sp.checkpoint_id)), el("td", { class: "time" }, time(sp.time)),
        el("td", { class: "mono" }, sp.path))), { id: "savepoints" })
      : el("p", { class: "muted", id: "savepoints" }, "No savepoint yet: Take savepoint writes one."),
  );
}
