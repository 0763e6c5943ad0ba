// Configuration: how the pipeline checkpoints (schedule, timeout, pause, retention, storage, chaining).
import { bytes, count, dagApi, duration, el, fields } from "./common.js";

const list = (names) => (names.length ? el("span", { class: "mono" }, names.join(", ")) : "-");
const yesNo = (v) => (v == null ? "-" : v ? "yes" : "no");

export async function showConfiguration(view) {
  const c = await dagApi("/configuration");
  view.replaceChildren(el("div", { class: "card", id: "configuration" }, fields([
    ["Schedule", c.schedule == null || c.schedule === "None" ? "none (triggered only)" : c.schedule],
    ["Checkpoint timeout", duration(c.checkpoint_timeout_seconds)],
    ["Min pause between checkpoints", duration(c.min_pause_seconds)],
    ["Tolerable failed checkpoints", count(c.tolerable_failed_checkpoints)],
    ["Retained checkpoints", count(c.retained_checkpoints)],
    ["Storage", el("span", { class: "mono" }, c.storage)],
    ["Checkpoint storage", c.checkpoint_storage ?? "-"],
    ["Inline state threshold", bytes(c.inline_state_threshold)],
    ["Incremental state", yesNo(c.incremental_state)],
    ["Chained steps", yesNo(c.chain)],
    ["Sources", list(c.sources)],
    ["Steps", list(c.steps)],
    ["Sinks", list(c.sinks)],
  ])));
}
