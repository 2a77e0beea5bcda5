// The job's curves: train loss at each metrics event's step and the eval loss before training (step
// 0) and after it (the last step) from the job's `gridline.result`; for reinforcement jobs also the
// reward: the mean train reward at each step, and the validation reward before training, on each
// checkpoint (its `metrics.valid_mean_reward`) and after training. Chart.js, registered piece by
// piece so that the bundle carries only the line chart. A table beside each chart holds the same
// numbers for screen readers and for copying.
import { Chart, Legend, LinearScale, LineController, LineElement, PointElement, Tooltip } from "chart.js";
import { h } from "./dom.js";

Chart.register(LineController, LineElement, PointElement, LinearScale, Legend, Tooltip);
Chart.defaults.color = "#3a434c"; // axis and legend text at 9:1 on white (the default grey is 5.7:1)

/** {step, value} per step of a metrics field (oldest first); a resumed run repeats steps, the later report wins. */
export function trainPoints(eventsOldestFirst, field = "train_loss") {
  const byStep = new Map();
  for (const e of eventsOldestFirst) {
    const d = e.type === "metrics" ? e.data : null;
    if (d && typeof d.step === "number" && typeof d[field] === "number") byStep.set(d.step, d[field]);
  }
  return [...byStep].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x, y }));
}

/** The eval figure before (step 0) and after training (the last step); `name` is loss or reward. */
export function evalPoints(result, name = "loss", checkpoints = []) {
  if (!result && !checkpoints.length) return [];
  const byStep = new Map();
  if (typeof result?.[`eval_${name}_before`] === "number") byStep.set(0, result[`eval_${name}_before`]);
  for (const c of checkpoints) {
    const v = c.metrics?.[`valid_mean_${name}`];
    if (typeof v === "number") byStep.set(c.step_number, v);
  }
  if (typeof result?.[`eval_${name}`] === "number") byStep.set(result.steps ?? 0, result[`eval_${name}`]);
  return [...byStep].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({ x, y }));
}

function stepChart(name, caption) {
  const canvas = h("canvas", { id: `${name}-chart`, role: "img", "aria-label": `${cap(name)} by step: no points yet` });
  const tbody = h("tbody");
  const root = h("figure", { class: "chart" },
    h("div", { class: "chart-box" }, canvas),
    h("figcaption", {}, caption),
    h("details", {}, h("summary", {}, `${cap(name)} values as a table`),
      h("table", { id: `${name}-table` }, h("thead", {}, h("tr", {},
        h("th", { scope: "col" }, "Series"), h("th", { scope: "col" }, "Step"), h("th", { scope: "col" }, cap(name)))), tbody)));
  const chart = new Chart(canvas, {
    type: "line",
    data: { datasets: [
      { label: `train ${name}`, data: [], borderColor: "#1f5fbf", backgroundColor: "#1f5fbf", pointRadius: 2 },
      { label: `eval ${name}`, data: [], borderColor: "#b3401a", backgroundColor: "#b3401a", pointRadius: 5,
        pointStyle: "rectRot", showLine: false },
    ] },
    options: {
      animation: false,
      maintainAspectRatio: false,
      parsing: false,
      scales: { x: { type: "linear", title: { display: true, text: "step" } },
        y: { type: "linear", title: { display: true, text: name } } },
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
      ? `${cap(name)} by step: ${train.length} train points, last train ${name} ${last.y.toFixed(4)} at step ${last.x}`
      : `${cap(name)} by step: no points yet`);
    tbody.replaceChildren(...[["train", train], ["eval", evals]].flatMap(([series, points]) =>
      points.map((p) => h("tr", { "data-series": series }, h("td", {}, series), h("td", {}, p.x), h("td", {}, p.y.toFixed(4))))));
  }
  return { root, update };
}

function cap(word) {
  return word[0].toUpperCase() + word.slice(1);
}

export function lossChart() {
  return stepChart("loss", "Train loss at each reported step; eval loss before and after training.");
}

export function rewardChart() {
  return stepChart("reward", "Mean train reward at each step; validation reward before training, on each checkpoint and after training.");
}
