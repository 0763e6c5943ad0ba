// In progress: the running checkpoint, acked steps out of planned (n/N), time since its trigger, the lease
// holder and each step's ack (received or pending) with its task's state and try; polled every few seconds.
import { airflowLink, badge, dagApi, dagId, duration, el, fields, table, time } from "./common.js";

export const POLL_MS = 3000;

function ackRow(s, runPath) {
  const tryText = s.try_number == null ? "-" : `#${s.try_number}`;
  return el("tr", { "data-step": s.step },
    el("td", { class: "mono" }, s.step),
    el("td", {}, s.acked ? el("span", { class: "badge success" }, "received") : el("span", { class: "badge queued" }, "pending")),
    el("td", { class: "time" }, time(s.ack_time)),
    el("td", {}, s.state ? badge(s.state) : "-"),
    el("td", {}, s.try_number == null ? tryText
      : airflowLink(`${runPath}/tasks/${encodeURIComponent(s.step)}?try_number=${s.try_number}`, tryText)));
}

export async function showProgress(view) {
  const p = await dagApi("/in-progress");
  if (!p) {
    view.replaceChildren(el("p", { class: "muted", id: "no-progress" }, "No checkpoint in progress: the next run of the DAG takes the next one."));
    return;
  }
  const runPath = `/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(p.run_id)}`;
  const acked = p.steps.filter((s) => s.acked).length;
  view.replaceChildren(
    el("div", { class: "card", id: "progress" }, fields([
      ["Checkpoint", `#${p.checkpoint_id} (${p.type})`],
      ["DAG run", airflowLink(runPath, p.run_id)],
      ["Acked", el("span", { id: "acked" }, `${acked}/${p.steps.length} steps`)],
      ["Triggered at", time(p.trigger_time)],
      ["Elapsed", p.trigger_time == null ? "-" : duration(Math.max(0, Date.now() / 1000 - p.trigger_time))],
      ["Lease holder", p.lease_holder ?? "-"],
      ["Lease expires", time(p.lease_expires)],
    ])),
    el("h3", {}, "Acks"),
    table(["Step", "Ack", "Received at", "Task", "Try"], p.steps.map((s) => ackRow(s, runPath)), { id: "acks" }),
  );
}
