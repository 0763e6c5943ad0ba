// The job's actions: take a savepoint (optionally stopping the job), restore (a dialog). Values are sent
// exactly as typed: the server refuses surrounding spaces rather than guessing.
import { dagApi, dagId, el, say, time } from "./common.js";

let status; // the job as the last render read it: the restore dialog offers its retained snapshots

export function setStatus(s) { status = s; }

async function savepoint(stop) {
  const dir = document.getElementById("savepoint-dir").value;
  try {
    const run = await dagApi("/savepoint", { method: "POST", body: JSON.stringify({ savepoint_dir: dir || null, stop }) });
    say(`Savepoint run ${run.dag_run_id} triggered${stop ? " (the job stops after it)" : ""}; it appears here when it completes.`);
  } catch (e) {
    say(e.message, "error");
  }
}

// The choices: latest, every retained checkpoint, every savepoint, or a path typed in.
function fillChoices() {
  const retained = status?.retained || [];
  const options = retained.length ? [el("option", { value: "latest" }, `latest (checkpoint ${retained[0]})`)] : [];
  for (const id of retained) options.push(el("option", { value: String(id) }, `checkpoint ${id}`));
  for (const sp of status?.savepoints || []) {
    options.push(el("option", { value: sp.path }, `savepoint of checkpoint ${sp.checkpoint_id} (${time(sp.time)}) · ${sp.path}`));
  }
  options.push(el("option", { value: "" }, "another checkpoint or savepoint path…"));
  document.getElementById("restore-choice").replaceChildren(...options);
  showPath();
}

function showPath() {
  const other = document.getElementById("restore-choice").value === "";
  document.getElementById("restore-path-field").hidden = !other;
  document.getElementById("restore-path").required = other;
}

function resetConfirm() {
  document.getElementById("restore-confirm").hidden = true;
  document.getElementById("restore-ok").textContent = "Restore";
}

async function restore(form, event) {
  const data = new FormData(form);
  const trigger = data.has("trigger_pipeline") && !data.has("dry_run");
  const confirm = document.getElementById("restore-confirm");
  if (trigger && confirm.hidden) { // a run starts at once: said first, confirmed by a second press
    event.preventDefault();
    confirm.textContent = `After the restore request a run of ${dagId} starts at once: it restores the job and `
      + "its sinks to the chosen snapshot and processes everything after it again. Press \"Restore and trigger\" to go on.";
    confirm.hidden = false;
    document.getElementById("restore-ok").textContent = "Restore and trigger";
    return;
  }
  const body = {
    checkpoint: String(data.get("choice") || data.get("path")),
    allow_non_restored_state: data.has("allow_non_restored_state"),
    dry_run: data.has("dry_run"),
    trigger_pipeline: trigger,
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

// The dialog's backdrop dims the iframe; Airflow's page around it is dimmed by a shadow around the iframe.
function dimAirflow(on) {
  let doc = null;
  try { doc = window.parent !== window ? window.parent.document : null; } catch (e) { /* another origin */ }
  if (!doc || !window.frameElement) return;
  doc.getElementById("checkpoints-veil")?.remove();
  if (!on) return;
  const r = window.frameElement.getBoundingClientRect();
  const veil = doc.createElement("div");
  veil.id = "checkpoints-veil";
  veil.style.cssText = `position:fixed;left:${r.left}px;top:${r.top}px;width:${r.width}px;height:${r.height}px;`
    + "box-shadow:0 0 0 100vmax rgb(0 0 0 / .5);pointer-events:none;z-index:2147483647";
  doc.body.append(veil);
}

export function wireActions() {
  document.getElementById("take-savepoint").addEventListener("click", () => savepoint(false));
  document.getElementById("stop-savepoint").addEventListener("click", () => savepoint(true));
  const dialog = document.getElementById("restore-dialog");
  const form = document.getElementById("restore-form");
  document.getElementById("open-restore").addEventListener("click", () => {
    form.reset();
    fillChoices();
    resetConfirm();
    dialog.showModal();
    dimAirflow(true);
  });
  dialog.addEventListener("close", () => dimAirflow(false));
  document.getElementById("restore-cancel").addEventListener("click", () => dialog.close());
  document.getElementById("restore-choice").addEventListener("change", showPath);
  for (const name of ["trigger_pipeline", "dry_run"]) form.elements[name].addEventListener("change", resetConfirm);
  form.addEventListener("submit", (e) => restore(form, e));
  document.getElementById("message-close").addEventListener("click", () => { document.getElementById("message").hidden = true; });
}

export function enableActions(enabled, reason = "") {
  for (const control of document.querySelectorAll("#actions button, #actions input")) {
    control.disabled = !enabled;
    control.title = enabled ? "" : reason;
  }
  const note = document.getElementById("actions-note");
  note.textContent = reason;
  note.hidden = enabled || !reason;
}
