// One job: its facts, quote and charge, the loss chart (and a reinforcement job's reward chart), the event log (new events fetched as they
// arrive, newest first), its checkpoints with adapter downloads, and its result.
import { all, download, get } from "../api.js";
import { button, facts, h, num, replace, section, statusBadge, table, usd, when } from "../dom.js";
import { evalPoints, lossChart, rewardChart, trainPoints } from "../loss_chart.js";
import { notServable } from "./jobs.js";

const ENDED = new Set(["succeeded", "failed", "cancelled"]);

export function adapterButtons(model) {
  const path = (name) => `gridline/adapters/${encodeURIComponent(model)}/files/${name}`;
  return h("span", { class: "actions" }, ["adapter_model.safetensors", "adapter_config.json"].map((name) =>
    button(`Download ${name}`, () => download(path(name), name), `${model}/${name}`)));
}

/** New events (newest first) since the newest one in `known`: pages until a known id. */
async function newEvents(jobId, known) {
  const seen = new Set(known.map((e) => e.id));
  const fresh = [];
  let after = null;
  for (;;) {
    const page = await get(`fine_tuning/jobs/${jobId}/events?limit=100${after ? `&after=${after}` : ""}`);
    const unseen = page.data.filter((e) => !seen.has(e.id));
    fresh.push(...unseen);
    if (!page.has_more || unseen.length < page.data.length || !page.data.length) return [...fresh, ...known];
    after = page.data[page.data.length - 1].id;
  }
}

export function jobView(root, { live, params: [jobId] }) {
  const head = h("div"), summary = h("div"), quote = h("div"), result = h("div"), checkpoints = h("div");
  const log = h("ol", { class: "events", id: "events", "aria-live": "polite" });
  const chart = lossChart(), rewards = rewardChart();
  const rewardSection = section("Reward", "h-reward", rewards.root);
  rewardSection.hidden = true; // shown once the job is known to be a reinforcement job
  root.append(h("p", {}, h("a", { href: "#/jobs" }, "← All jobs")), head,
    section("Summary", "h-summary", summary), rewardSection, section("Loss", "h-loss", chart.root),
    section("Quote and charge", "h-quote", quote), section("Result", "h-result", result),
    section("Checkpoints", "h-checkpoints", checkpoints), section("Events", "h-events", log));
  let events = [], passesAfterEnd = 0;
  live(async (current) => {
    const [job, fresh, ckpts] = await Promise.all([get(`fine_tuning/jobs/${jobId}`), newEvents(jobId, events),
      all(`fine_tuning/jobs/${jobId}/checkpoints`)]);
    if (!current()) return false;
    const gl = job.gridline;
    replace(head, h("h1", {}, `Job ${job.id} `, statusBadge(job.status)));
    replace(summary, facts({ model: job.model, fine_tuned_model: job.fine_tuned_model, training_file: job.training_file,
      validation_file: job.validation_file, created: when(job.created_at), finished: job.finished_at && when(job.finished_at),
      estimated_finish: job.estimated_finish && !ENDED.has(job.status) ? when(job.estimated_finish) : null,
      trained_tokens: job.trained_tokens, waiting_because: gl.reason, method: job.method?.type, suffix: job.user_provided_suffix,
      error: job.error && `${job.error.code}: ${job.error.message}` }, "job facts"));
    replace(quote, h("div", {}, facts(gl.quote, "quote"),
      gl.charge ? h("p", { class: "charge" }, `Charged ${usd(gl.charge.usd)} (${gl.charge.basis}).`) : h("p", { class: "empty" }, "No charge yet.")));
    replace(result, gl.result
      ? h("div", {}, facts(gl.result, "result"), job.result_files.map((id) =>
          button(`Download results file ${id}`, () => download(`files/${id}/content`, `${id}.csv`), id)),
        job.fine_tuned_model ? h("p", {}, "Model ", h("code", {}, job.fine_tuned_model), " · ", h("a", { href: "#/models" }, "Models"))
          : notServable(job) ? h("p", { class: "not-servable", role: "status" }, notServable(job)) : null)
      : h("p", { class: "empty" }, ENDED.has(job.status) ? "No result: the job did not finish training." : "No result yet."));
    const rl = job.method?.type === "reinforcement";
    replace(checkpoints, table("Checkpoints, newest first",
      ["Step", "Checkpoint model", "Train loss", ...(rl ? ["Validation reward"] : []), "Created", "Adapter"],
      ckpts.map((c) => [String(c.step_number), h("code", {}, c.fine_tuned_model_checkpoint), num(c.metrics.train_loss),
        ...(rl ? [num(c.metrics.valid_mean_reward)] : []), when(c.created_at), adapterButtons(c.fine_tuned_model_checkpoint)]),
      "No checkpoints yet."));
    if (fresh.length !== events.length) {
      log.prepend(...fresh.slice(0, fresh.length - events.length).map((e) => h("li", { class: `ev-${e.level}`, "data-type": e.type },
        h("time", {}, when(e.created_at)), " ", e.message)));
      events = fresh;
    }
    if (!events.length) replace(log, h("li", { class: "empty" }, "No events yet."));
    else log.querySelector("li.empty")?.remove();
    chart.update(trainPoints([...events].reverse()), evalPoints(gl.result));
    rewardSection.hidden = !rl;
    if (rl) rewards.update(trainPoints([...events].reverse(), "reward_mean"), evalPoints(gl.result, "reward", ckpts));
    // One more pass after the end catches events written with the last status change.
    return !ENDED.has(job.status) || passesAfterEnd++ < 1;
  });
}
