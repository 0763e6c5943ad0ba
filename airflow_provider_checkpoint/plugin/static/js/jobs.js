// Every checkpointed job the user may read (the Checkpoints entry of Airflow's navigation).
import { badge, call, el, table, time } from "./common.js";

export async function showJobs(into) {
  const jobs = await call("/jobs");
  if (!jobs.length) {
    into.append(el("div", { class: "empty", id: "no-jobs" }, el("h2", {}, "No checkpointed job yet"),
      el("p", {}, "A pipeline DAG appears here after its first run: trigger one in Airflow to start its job.")));
    return;
  }
  into.append(table(["Job", "DAG", "Status", "Latest completed", "Completed at", "Storage"], jobs.map((j) => {
    const latest = j.latest_completed || {};
    const row = el("tr", { class: "link" },
      el("td", {}, j.job_id), el("td", {}, el("a", { href: `?dag_id=${encodeURIComponent(j.dag_id)}` }, j.dag_id)),
      el("td", {}, badge(j.status)), el("td", {}, latest.checkpoint_id), el("td", { class: "time" }, time(latest.completion_time)),
      el("td", { class: "mono" }, j.storage));
    row.addEventListener("click", () => { location.search = `?dag_id=${encodeURIComponent(j.dag_id)}`; });
    return row;
  }), { id: "jobs" }));
}
