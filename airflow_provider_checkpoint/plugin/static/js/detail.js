// Checkpoint detail: everything one checkpoint recorded, per step and per sink.
import { airflowLink, badge, bytes, count, dagApi, duration, el, fields, num, table, time } from "./common.js";
import { restoredFrom } from "./history.js";

function attempts(step) {
  if (!step.attempts.length) return "-";
  return el("ul", { class: "attempts" }, step.attempts.map((a) => el("li", {},
    `#${a.try_number} `, a.state ? badge(a.state) : el("span", { class: "muted" }, "unknown"),
    ` ${duration(a.duration)}`, a.try_number === step.accepted_attempt ? el("span", { class: "muted" }, " · acked") : "")));
}

function state(s) {
  if (s.state_rows == null && s.state_bytes == null) return "-"; // a stateless step
  const how = [s.incremental == null ? null : s.incremental ? "incremental" : "full",
    s.merged_on_driver == null ? null : `merged by ${s.merged_on_driver ? "the driver" : "Spark"}`].filter(Boolean);
  return el("div", {}, el("div", { class: "nowrap" }, `${count(s.state_rows)} rows · ${bytes(s.state_bytes)} · ${count(s.state_files)} files`),
    how.length ? el("div", { class: "muted" }, how.join(", ")) : "");
}

// A multi-input step's inputs: records read from each (they align by the barrier cut), and a wait where one was recorded.
function inputs(step) {
  const read = Object.entries(step.input_records || {});
  const waits = step.alignment_seconds || {};
  return read.length ? el("ul", { class: "attempts" }, read.map(([uid, n]) =>
    el("li", { class: "nowrap" }, `${uid}: ${count(n)}`, uid in waits ? ` · waited ${duration(waits[uid])}` : ""))) : "-";
}

function stepRow(s, aligned) {
  return el("tr", { "data-step": s.step },
    el("td", { class: "mono nowrap" }, s.step), el("td", {}, attempts(s)), num(duration(s.seconds)),
    el("td", { class: "nowrap" }, `${count(s.records_in)} in · ${count(s.records_out)} out`), el("td", {}, state(s)),
    aligned ? el("td", {}, inputs(s)) : "");
}

function sinkRow(k, delta) {
  return el("tr", { "data-sink": k.uid },
    el("td", {}, el("div", { class: "mono nowrap" }, k.uid), el("div", { class: "muted nowrap" }, `in ${k.step}`)),
    el("td", {}, k.kind), el("td", { class: "mono" }, k.dead_letters_path || k.target),
    num(count(k.rows)), num(count(k.files)), num(bytes(k.bytes)), delta ? num(count(k.delta_version)) : "",
    el("td", { class: "time" }, time(k.commit_time)));
}

function committedBy(d) {
  if (d.committed_by === "trigger") {
    return el("span", {}, "the next run's trigger", d.committed_by_run_id ? ` (run ${d.committed_by_run_id})` : "",
      el("span", { class: "muted" }, ": finalize of its own run ended before the commit"));
  }
  return d.committed_by ? el("span", {}, d.committed_by, d.committed_by_run_id ? ` (run ${d.committed_by_run_id})` : "") : undefined;
}

export async function showDetail(view, id) {
  const d = await dagApi(`/checkpoints/${encodeURIComponent(id)}`);
  const r = d.row;
  const aligned = d.steps.some((s) => Object.keys(s.input_records || {}).length > 1); // multi-input steps
  const delta = d.sinks.some((k) => k.delta_version != null);
  const back = el("a", { href: "#history", class: "back" }, "‹ History");
  view.replaceChildren(
    el("div", { class: "detail-head" }, back,
      el("h2", { id: "detail-title" }, `Checkpoint ${r.checkpoint_id}`), badge(r.status), el("span", { class: "muted" }, r.type)),
    r.status !== "COMPLETED" && (d.abort_message || r.reason)
      ? el("div", { class: "alert error", id: "abort-reason" }, el("strong", {}, r.reason || r.status), " ", d.abort_message || r.message)
      : "",
    d.abort_detail
      ? el("details", { class: "card", id: "abort-detail" }, el("summary", {}, "Full error"), el("pre", { class: "mono" }, d.abort_detail))
      : "",
    el("div", { class: "card" }, fields([
      ["DAG run", d.dag_run_url ? airflowLink(d.dag_run_url, r.run_id) : r.run_id || "-"],
      ["Trigger time", time(r.trigger_time)],
      ["End time", time(r.end_time)],
      ["Duration", duration(r.duration_seconds)],
      ["Records in", count(r.records_in)],
      ["State", `${count(r.state_rows)} rows, ${bytes(r.state_size)}`],
      ["Files written", `${count(r.files)} (state and sinks)`],
      ["Written", `${bytes(r.bytes_written)} (sinks ${bytes(r.sink_bytes)})`],
      ["Metadata", d.metadata_path ? el("span", { class: "mono", id: "metadata-path" }, d.metadata_path) : "-"],
      ["Committed by", committedBy(d)],
      ["Restored from", r.restored ? el("span", { class: "mono" }, restoredFrom(r)) : undefined],
    ])),
    el("h3", {}, "Steps"),
    table(["Step", "Attempts", { label: "Seconds", num: true }, "Records", "State", ...(aligned ? ["Inputs (records)"] : [])],
      d.steps.map((s) => stepRow(s, aligned)), { id: "steps" }),
    el("h3", {}, "Sinks"),
    d.sinks.length
      ? table(["Sink", "Kind", "Target", { label: "Rows", num: true }, { label: "Files", num: true }, { label: "Bytes", num: true },
        ...(delta ? [{ label: "Delta version", num: true }] : []), "Committed at"], d.sinks.map((k) => sinkRow(k, delta)), { id: "sinks" })
      : el("p", { class: "muted", id: "sinks" }, "Nothing committed by this checkpoint."),
  );
}
