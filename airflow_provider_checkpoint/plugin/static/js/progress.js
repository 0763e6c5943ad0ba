// In progress: the running checkpoint, the lease holder and each step's ack (received or pending);
// polled every few seconds while this view is open.
import { airflowLink, badge, dagApi, dagId, el, fields, table, time } from "./common.js";

export const POLL_MS = 3000;

function ackRow(s) {
  return el("tr", { "data-step": s.step },
    el("td", { class: "mono" }, s.step),
    el("td", {}, s.acked ? el("span", { class: "badge success" }, "received") : el("span", { class: "badge queued" }, "pending")),
    el("td", { class: "time" }, time(s.ack_time)),
    el("td", {}, s.state ? badge(s.state) : "-"));
}

export async function showProgress(view) {
  const p = await dagApi("/in-progress");
  if (!p) {
    view.replaceChildren(el("p", { class: "muted", id: "no-progress" }, "No checkpoint in progress: the next run of the DAG takes the next one."));
    return;
  }
  view.replaceChildren(
    el("div", { class: "card", id: "progress" }, fields([
      ["Checkpoint", `#${p.checkpoint_id} (${p.type})`],
      ["DAG run", airflowLink(`/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(p.run_id)}`, p.run_id)],
      ["Triggered at", time(p.trigger_time)],
      ["Lease holder", p.lease_holder ?? "-"],
      ["Lease expires", time(p.lease_expires)],
    ])),
    el("h3", {}, "Acks"),
    table(["Step", "Ack", "Received at", "Task"], p.steps.map(ackRow), { id: "acks" }),
  );
}
