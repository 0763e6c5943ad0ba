// Checkpoint detail: everything one checkpoint recorded, per step and per sink.
import { airflowLink, badge, bytes, count, dagApi, duration, el, fields, num, table, time } from "./common.js";
import { backToHistory, discardedBadge, restoredFrom, runPath } from "./history.js";

// Each try links to its task instance in Airflow (its logs), as Airflow's own try selector does.
function attempts(step, runId) {
  if (!step.attempts.length) return "-";
  const tryLink = (n) => (runId
    ? airflowLink(`${runPath(runId)}/tasks/${encodeURIComponent(step.step)}?try_number=${n}`, `#${n}`) : `#${n}`);
  return el("ul", { class: "attempts" }, step.attempts.map((a) => el("li", {},
    tryLink(a.try_number), " ", a.state ? badge(a.state) : el("span", { class: "muted" }, "unknown"),
    ` ${duration(a.duration)}`, a.try_number === step.accepted_attempt ? el("span", { class: "muted" }, " · acked") : "")));
}

// A step's state: rows, bytes and where it lives (files, or inline in _metadata when small: then always whole).
function state(s) {
  if (s.state_rows == null && s.state_bytes == null) return "-"; // a stateless step
  const inline = s.inline === true;
  const how = [s.incremental == null ? null : inline ? "whole (inline state is written whole)" : s.incremental ? "incremental" : "full",
    s.merged_on_driver == null ? null : `merged by ${s.merged_on_driver ? "the driver" : "Spark"}`].filter(Boolean);
  const where = inline ? "inline in _metadata" : `${count(s.state_files)} files`;
  return el("div", {}, el("div", { class: "nowrap" }, `${count(s.state_rows)} rows · ${bytes(s.state_bytes)} · ${where}`),
    how.length ? el("div", { class: "muted" }, how.join(", ")) : "");
}

// "3 (events 2, orders 1)", as the CLI shows it; "-" when unknown.
export function malformed(r) {
  if (r.malformed_records == null) return "-";
  const per = Object.entries(r.source_malformed || {}).filter(([, n]) => n).sort().map(([uid, n]) => `${uid} ${n}`);
  return per.length ? `${r.malformed_records} (${per.join(", ")})` : String(r.malformed_records);
}

// figures joined, or "-" when none is known (an aborted checkpoint records few)
function known(...parts) {
  return parts.every(([v]) => v == null) ? "-" : parts.map(([v, f]) => f(v)).join(" ");
}

// A multi-input step's inputs: records read from each (they align by the barrier cut), and a wait where one was recorded.
function inputs(step) {
  const read = Object.entries(step.input_records || {});
  const waits = step.alignment_seconds || {};
  return read.length ? el("ul", { class: "attempts" }, read.map(([uid, n]) =>
    el("li", { class: "nowrap" }, `${uid}: ${count(n)}`, uid in waits ? ` · waited ${duration(waits[uid])}` : ""))) : "-";
}

function stepRow(s, aligned, runId) {
  return el("tr", { "data-step": s.step },
    el("td", { class: "mono nowrap" }, s.step), el("td", {}, attempts(s, runId)), num(duration(s.seconds)),
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
  const back = el("a", { href: backToHistory(), class: "back" }, "‹ History");
  const discarded = r.status === "COMPLETED" && !d.metadata_path; // its _metadata is gone: retention deleted it
  const letters = d.sinks.filter((k) => k.kind === "dead_letters" && k.rows != null);
  const deadLetters = letters.length ? letters.reduce((n, k) => n + k.rows, 0) : null;
  view.replaceChildren(
    el("div", { class: "detail-head" }, back,
      el("h2", { id: "detail-title" }, `Checkpoint ${r.checkpoint_id}`), badge(r.status), discarded ? discardedBadge() : "",
      el("span", { class: "muted" }, r.type)),
    discarded
      ? el("div", { class: "alert warn", id: "discarded-note" }, "Deleted by retention (only the newest completed "
        + "checkpoints are kept): its files are gone, so it cannot be restored. "
        + (r.type === "savepoint" ? "Its savepoint copy is kept: restore from that (Overview, Savepoints)." : ""))
      : "",
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
      ["Malformed records", malformed(r)],
      ["Dead letters", deadLetters == null ? "-" : `${count(deadLetters)} rows`],
      ["State", known([r.state_rows, (v) => `${count(v)} rows,`], [r.state_size, bytes])],
      ["Files written", r.files == null ? "-" : `${count(r.files)} (state and sinks)`],
      ["Written", r.bytes_written == null ? "-" : `${bytes(r.bytes_written)} (sinks ${bytes(r.sink_bytes)})`],
      ["Metadata", d.metadata_path ? el("span", { class: "mono", id: "metadata-path" }, d.metadata_path) : "-"],
      ["Committed by", committedBy(d)],
      ["Restored from", r.restored ? el("span", { class: "mono" }, restoredFrom(r)) : undefined],
    ])),
    el("h3", {}, "Steps"),
    table(["Step", "Attempts", { label: "Spark job", num: true }, "Records", "State", ...(aligned ? ["Inputs (records)"] : [])],
      d.steps.map((s) => stepRow(s, aligned, r.run_id)), { id: "steps" }),
    el("h3", {}, "Sinks"),
    d.sinks.length
      ? table(["Sink", "Kind", "Target", { label: "Rows", num: true }, { label: "Files", num: true }, { label: "Bytes", num: true },
        ...(delta ? [{ label: "Delta version", num: true }] : []), "Committed at"], d.sinks.map((k) => sinkRow(k, delta)), { id: "sinks" })
      : el("p", { class: "muted", id: "sinks" }, "Nothing committed by this checkpoint."),
  );
}
