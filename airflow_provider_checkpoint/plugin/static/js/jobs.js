// Every checkpointed job the user may read (the Checkpoints entry of Airflow's navigation). A job opens its
// Checkpoints tab in Airflow (the address bar follows), its DAG Airflow's DAG page.
import { airflowLink, badge, call, el, table, time } from "./common.js";

export async function showJobs(into) {
  const jobs = await call("/jobs");
  if (!jobs.length) {
    into.append(el("div", { class: "empty", id: "no-jobs" }, el("h2", {}, "No checkpointed job yet"),
      el("p", {}, "A pipeline DAG appears here after its first run: trigger one in Airflow to start its job.")));
    return;
  }
  into.append(table(["Job", "DAG", "Status", "Latest completed", "Completed at", "Storage"], jobs.map((j) => {
    const latest = j.latest_completed || {};
    const dag = `/dags/${encodeURIComponent(j.dag_id)}`;
    const job = airflowLink(`${dag}/plugin/checkpoints-dag`, j.job_id);
    const dagLink = airflowLink(dag, j.dag_id);
    for (const link of [job, dagLink]) link.addEventListener("click", (e) => e.stopPropagation());
    const row = el("tr", { class: "link" },
      el("td", {}, job), el("td", {}, dagLink),
      el("td", {}, badge(j.status)), el("td", {}, latest.checkpoint_id), el("td", { class: "time" }, time(latest.completion_time)),
      el("td", { class: "mono" }, j.storage));
    row.addEventListener("click", () => job.click());
    return row;
  }), { id: "jobs" }));
}
