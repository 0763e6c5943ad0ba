// Summary: min / average / p50 / p90 / p99 / max over the completed checkpoints of the history (computed by
// the server), and two charts (duration and state size per checkpoint, from the newest 100 of the history).
import { bytes, count, dagApi, duration, el, num, table } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";

// The axis top: the next "round" value at or above max, in the figure's own units (seconds: 1-2-5 below a
// minute, then whole minutes and hours; bytes: powers of two), so the ticks read 0, half and top.
const SECONDS = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400];
function roundUp(max, kind) {
  if (kind === "bytes") return 2 ** Math.ceil(Math.log2(Math.max(max, 2)));
  if (max < 1) return 10 ** Math.ceil(Math.log10(max));
  return SECONDS.find((s) => s >= max) ?? Math.ceil(max / 86400) * 86400;
}

// W: the chart's width in pixels, so its 12 px labels render at 12 px (the SVG is drawn 1:1).
function chart(id, rows, value, format, kind, W) {
  const H = 180, L = 92, R = 12, T = 12, B = 28;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("id", id);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text != null) n.textContent = text;
    svg.append(n);
    return n;
  };
  const points = rows.filter((r) => value(r) != null).sort((a, b) => a.checkpoint_id - b.checkpoint_id);
  if (!points.length) {
    add("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet");
    return svg;
  }
  const max = roundUp(Math.max(...points.map(value)) || 1, kind);
  const ids = points.map((r) => r.checkpoint_id);
  const lo = Math.min(...ids), hi = Math.max(...ids);
  const x = (cid) => L + (hi === lo ? (W - L - R) / 2 : ((cid - lo) / (hi - lo)) * (W - L - R));
  const y = (v) => T + (1 - v / max) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    add("line", { class: "grid", x1: L, x2: W - R, y1: y(max * f), y2: y(max * f) });
    add("text", { x: L - 6, y: y(max * f) + 3, "text-anchor": "end" }, format(max * f));
  }
  const line = points.filter((r) => r.status === "COMPLETED"); // an aborted one is a red dot off the line
  add("polyline", { class: "series", points: line.map((r) => `${x(r.checkpoint_id)},${y(value(r))}`).join(" ") });
  for (const r of points) {
    add("circle", { class: `dot ${r.status}`, cx: x(r.checkpoint_id), cy: y(value(r)), r: 3.5 })
      .append(Object.assign(document.createElementNS(SVG, "title"), { textContent: `checkpoint ${r.checkpoint_id}: ${format(value(r))}` }));
  }
  const step = Math.max(1, Math.ceil(points.length / 10));
  points.forEach((r, i) => {
    if (i % step === 0 || i === points.length - 1) add("text", { x: x(r.checkpoint_id), y: H - 10, "text-anchor": "middle" }, r.checkpoint_id);
  });
  return svg;
}

const FIGURES = ["min", "avg", "p50", "p90", "p99", "max"];

function stat(label, m, format) {
  return el("tr", { "data-stat": label }, el("th", { scope: "row" }, label), FIGURES.map((f) => num(format(m[f]))));
}

// The width of one chart: two side by side when each gets 320 px (the .charts grid), less the card's padding.
function chartWidth() {
  const width = document.getElementById("view").clientWidth || 960;
  const columns = width >= 2 * 320 + 12 ? 2 : 1;
  return Math.max(240, Math.floor((width - 12 * (columns - 1)) / columns) - 34);
}

export async function showSummary(view) {
  const [s, recent] = await Promise.all([dagApi("/summary"), dagApi("/history?offset=0&limit=100")]);
  const W = chartWidth();
  view.replaceChildren(
    el("p", { class: "muted", id: "summary-count" }, `Over the ${s.checkpoints} completed checkpoint${s.checkpoints === 1 ? "" : "s"} of the history.`),
    table(["", ...["Min", "Average", "p50", "p90", "p99", "Max"].map((label) => ({ label, num: true }))], [
      stat("End-to-end duration", s.duration_seconds, duration), stat("Checkpointed data size", s.state_size, bytes),
      stat("Processed rows", s.records_in, count), stat("Written (state and sinks)", s.bytes_written, bytes),
    ], { id: "summary" }),
    el("p", { class: "muted", id: "summary-note" }, "Percentiles by nearest rank: p90 is the smallest figure at or above "
      + "90 % of the checkpoints' (as Flink's p50, p90, p99). Aborted checkpoints are left out: their figures are partial."),
    el("div", { class: "charts" },
      el("figure", { class: "card" }, el("figcaption", {}, "Duration per checkpoint"),
        chart("chart-duration", recent.rows, (r) => r.duration_seconds, duration, "seconds", W)),
      el("figure", { class: "card" }, el("figcaption", {}, "State size per completed checkpoint"),
        chart("chart-size", recent.rows.filter((r) => r.status === "COMPLETED"), (r) => r.state_size, bytes, "bytes", W))),
  );
}
