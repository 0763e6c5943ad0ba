// The job's actions: take a savepoint (optionally stopping the job), restore (a dialog).
import { dagApi, say } from "./common.js";

async function savepoint(stop) {
  const dir = document.getElementById("savepoint-dir").value.trim();
  try {
    const run = await dagApi("/savepoint", { method: "POST", body: JSON.stringify({ savepoint_dir: dir || null, stop }) });
    say(`Savepoint run ${run.dag_run_id} triggered${stop ? " (the job stops after it)" : ""}; it appears here when it completes.`);
  } catch (e) {
    say(e.message, "error");
  }
}

async function restore(form) {
  const data = new FormData(form);
  const body = {
    checkpoint: String(data.get("checkpoint")).trim(),
    allow_non_restored_state: data.has("allow_non_restored_state"),
    dry_run: data.has("dry_run"),
    trigger_pipeline: data.has("trigger_pipeline"),
  };
  try {
    const s = await dagApi("/restore", { method: "POST", body: JSON.stringify(body) });
    const what = `${s.type} ${s.checkpoint_id} at ${s.snapshot}`;
    say(s.dry_run ? `Dry run: ${s.job_id} can be restored from ${what}; nothing written.`
      : `Restore of ${s.job_id} from ${what} requested${s.dag_run_id ? `; run ${s.dag_run_id} takes it` : ""}.`);
  } catch (e) {
    say(e.message, "error");
  }
}

export function wireActions() {
  document.getElementById("take-savepoint").addEventListener("click", () => savepoint(false));
  document.getElementById("stop-savepoint").addEventListener("click", () => savepoint(true));
  const dialog = document.getElementById("restore-dialog");
  document.getElementById("open-restore").addEventListener("click", () => dialog.showModal());
  document.getElementById("restore-cancel").addEventListener("click", () => dialog.close());
  document.getElementById("restore-form").addEventListener("submit", (e) => restore(e.target));
}

export function enableActions(enabled) {
  for (const control of document.querySelectorAll("#actions button, #actions input")) control.disabled = !enabled;
}
