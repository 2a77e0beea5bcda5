// The job's loss chart: train loss at each metrics event's step, and the eval loss before training
// (step 0) and after it (the last step) from the job's `gridline.result`. Chart.js, registered
// piece by piece so that the bundle carries only the line chart. A table beside it holds the same
// numbers for screen readers and for copying.
import { Chart, Legend, LinearScale, LineController, LineElement, PointElement, Tooltip } from "chart.js";
import { h } from "./dom.js";

Chart.register(LineController, LineElement, PointElement, LinearScale, Legend, Tooltip);
Chart.defaults.color = "#3a434c"; // axis and legend text at 9:1 on white (the default grey is 5.7:1)

/** {step, loss} per step from metrics events (oldest first); a resumed run repeats steps, the later report wins. */
export function trainPoints(eventsOldestFirst) {
  const byStep = new Map();
  for (const e of eventsOldestFirst) {
    const d = e.type === "metrics" ? e.data : null;
    if (d && typeof d.step === "number" && typeof d.train_loss === "number") byStep.set(d.step, d.train_loss);
  }
  return [...byStep].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x, y }));
}

export function evalPoints(result) {
  if (!result) return [];
  const points = [];
  if (typeof result.eval_loss_before === "number") points.push({ x: 0, y: result.eval_loss_before });
  if (typeof result.eval_loss === "number") points.push({ x: result.steps ?? 0, y: result.eval_loss });
  return points;
}

export function lossChart() {
  const canvas = h("canvas", { id: "loss-chart", role: "img", "aria-label": "Loss by step: no points yet" });
  const tbody = h("tbody");
  const root = h("figure", { class: "chart" },
    h("div", { class: "chart-box" }, canvas),
    h("figcaption", {}, "Train loss at each reported step; eval loss before and after training."),
    h("details", {}, h("summary", {}, "Loss values as a table"),
      h("table", { id: "loss-table" }, h("thead", {}, h("tr", {},
        h("th", { scope: "col" }, "Series"), h("th", { scope: "col" }, "Step"), h("th", { scope: "col" }, "Loss"))), tbody)));
  const chart = new Chart(canvas, {
    type: "line",
    data: { datasets: [
      { label: "train loss", data: [], borderColor: "#1f5fbf", backgroundColor: "#1f5fbf", pointRadius: 2 },
      { label: "eval loss", data: [], borderColor: "#b3401a", backgroundColor: "#b3401a", pointRadius: 5,
        pointStyle: "rectRot", showLine: false },
    ] },
    options: {
      animation: false,
      maintainAspectRatio: false,
      parsing: false,
      scales: { x: { type: "linear", title: { display: true, text: "step" } },
        y: { type: "linear", title: { display: true, text: "loss" } } },
    },
  });
  let shown = "";
  function update(train, evals) {
    const sig = JSON.stringify([train, evals]);
    if (sig === shown) return;
    shown = sig;
    chart.data.datasets[0].data = train;
    chart.data.datasets[1].data = evals;
    chart.update("none");
    // The counts let a test (or a curious person) check the chart against the API without pixels.
    canvas.dataset.trainPoints = String(train.length);
    canvas.dataset.evalPoints = String(evals.length);
    const last = train.at(-1);
    canvas.setAttribute("aria-label", last
      ? `Loss by step: ${train.length} train points, last train loss ${last.y.toFixed(4)} at step ${last.x}`
      : "Loss by step: no points yet");
    tbody.replaceChildren(...[["train", train], ["eval", evals]].flatMap(([name, points]) =>
      points.map((p) => h("tr", { "data-series": name }, h("td", {}, name), h("td", {}, p.x), h("td", {}, p.y.toFixed(4))))));
  }
  return { root, update };
}
