// The Checkpoints page: without ?dag_id every job; with it one job in tabs (#overview, #history,
// #summary, #configuration, #in-progress) and a checkpoint's detail (#checkpoint=<id>).
// The open view is refreshed every few seconds; a detail, which does not change, is not.
import { enableActions, setStatus, wireActions } from "./actions.js";
import { showConfiguration } from "./configuration.js";
import { airflowLink, badge, clearLoadError, dagApi, dagId, el, followTheme, say, useChosenZone } from "./common.js";
import { showDetail } from "./detail.js";
import { showHistory } from "./history.js";
import { showJobs } from "./jobs.js";
import { showOverview } from "./overview.js";
import { POLL_MS, showProgress } from "./progress.js";
import { showSummary } from "./summary.js";

const REFRESH_MS = 5000;
const TABS = {
  overview: showOverview, history: showHistory, summary: showSummary,
  configuration: showConfiguration, "in-progress": showProgress,
};

function route() {
  const hash = location.hash.slice(1).split("?")[0]; // a view's own state follows "?" (History's filters, page)
  const detail = /^checkpoint=(\d+)$/.exec(hash);
  if (detail) return { tab: "history", checkpoint: detail[1] };
  return { tab: TABS[hash] ? hash : "overview" };
}

function showEmpty(error) {
  const paused = /Its DAG is paused/.test(error.detail);
  document.getElementById("status").replaceChildren();
  document.getElementById("tabs").hidden = true;
  clearLoadError();
  enableActions(false);
  return [el("div", { class: "empty", id: "empty" },
    el("h2", {}, "No checkpoint yet"),
    el("p", {}, `${dagId} has not run yet, so there is nothing to show. Trigger the DAG to start its job: `
      + "its first run takes checkpoint 1, which appears here."),
    paused ? el("p", { id: "paused" }, `${dagId} is paused: unpause it in Airflow (the switch beside its name), or its `
      + "schedule never runs it.") : "",
    el("p", {}, airflowLink(`/dags/${encodeURIComponent(dagId)}`, `Open ${dagId} in Airflow`), " and press Trigger."))];
}

const READ_ONLY = "Read-only: your role may view this DAG but not create its runs, so it cannot take a savepoint "
  + "or restore the job here. An admin or a user with the right to trigger the DAG can.";

function unknownCheckpoint(id) {
  return el("div", { class: "empty", id: "unknown-checkpoint" },
    el("h2", {}, `No checkpoint ${id}`),
    el("p", {}, `${dagId} has no checkpoint ${id} in its history (it never took it, or its record is gone).`),
    el("p", {}, el("a", { href: "#history" }, "‹ History")));
}

let generation = 0;
let timer;

// Renders the open view into a detached node and shows it unless a newer render started meanwhile.
async function render() {
  const mine = ++generation;
  clearTimeout(timer);
  const view = document.getElementById("view");
  const into = el("div");
  const { tab, checkpoint } = route();
  try {
    if (!dagId) {
      await showJobs(into);
    } else {
      const status = await dagApi("/status");
      if (mine !== generation) return;
      document.getElementById("title").textContent = `Checkpoints of ${status.job_id}`;
      document.getElementById("status").replaceChildren(badge(status.status));
      document.getElementById("tabs").hidden = false;
      setStatus(status);
      enableActions(status.can_act, status.can_act ? "" : READ_ONLY);
      for (const a of document.querySelectorAll("#tabs a")) {
        a.setAttribute("aria-selected", String(!checkpoint && a.hash === `#${tab}`));
      }
      if (checkpoint) await showDetail(into, checkpoint); else await TABS[tab](into, status);
    }
    clearLoadError();
  } catch (e) {
    if (e.noJobYet) into.replaceChildren(...showEmpty(e));
    else if (checkpoint && e.status === 404) into.replaceChildren(unknownCheckpoint(checkpoint));
    else say(e.message, "error", "load");
  }
  if (mine !== generation) return;
  view.replaceChildren(...into.childNodes);
  view.dataset.view = checkpoint ? `checkpoint-${checkpoint}` : dagId ? tab : "jobs";
  view.dataset.renders = String(Number(view.dataset.renders || 0) + 1); // tests wait for refreshes by it
  if (!checkpoint) timer = setTimeout(render, tab === "in-progress" ? POLL_MS : REFRESH_MS);
}

followTheme();
document.getElementById("tz").textContent = `times in ${useChosenZone()}`;
addEventListener("storage", (e) => {
  if (e.key !== "timezone") return;
  document.getElementById("tz").textContent = `times in ${useChosenZone()}`;
  render();
});
// In Airflow's DAG tab the view's address (#history?page=2, #checkpoint=7) is also the Airflow page's hash:
// reloading the tab or sharing its URL opens the same view (the iframe's own address is not in the bar).
function airflowLocation() {
  try {
    return window.parent !== window ? window.parent.location : null;
  } catch (e) {
    return null; // another origin
  }
}

function mirrorHash() {
  const top = airflowLocation();
  if (!top || top.hash === location.hash) return;
  const url = new URL(top.href);
  url.hash = location.hash;
  window.parent.history.replaceState(window.parent.history.state, "", url); // Airflow's router state kept
}

if (dagId) {
  document.getElementById("job-header").hidden = false;
  wireActions();
  const shared = airflowLocation()?.hash || "";
  if (!location.hash && /^#(overview|history|summary|configuration|in-progress|checkpoint=\d+)\b/.test(shared)) {
    history.replaceState(null, "", shared);
  }
  addEventListener("hashchange", () => { mirrorHash(); render(); });
}
render();
