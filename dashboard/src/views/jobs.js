// The account's fine-tuning jobs: status, quote, charge, and each open job's latest event, live.
import { all, get } from "../api.js";
import { h, num, statusBadge, usd, when } from "../dom.js";
import { listView } from "./list.js";

const OPEN = new Set(["validating_files", "queued", "running", "paused"]);

async function jobsWithLatest() {
  const jobs = await all("fine_tuning/jobs", 200);
  // The latest event of open jobs only: an ended job's story is on its own page.
  return Promise.all(jobs.map(async (job) => ({ job, latest: OPEN.has(job.status)
    ? (await get(`fine_tuning/jobs/${job.id}/events?limit=1`)).data[0]?.message ?? "" : job.error?.message ?? "" })));
}

/** A succeeded job whose model was registered not servable: what the list says instead of a model. */
export function notServable(job) {
  const adapter = job.gridline.fine_tuned_adapter;
  return adapter && adapter.servable === false ? `Not servable: ${adapter.reason ?? "no reason recorded"}` : "";
}

export function quoteCell(quote) {
  if (!quote || !quote.per_token) return "—";
  return `${usd(quote.per_token.max_charge_usd)} · ≤${num(quote.training_tokens_upper_bound)} tokens`;
}

export function jobsView(root, { live }) {
  listView(root, live, {
    title: "Fine-tuning jobs", load: jobsWithLatest, caption: "Your jobs, newest first",
    head: ["Job", "Status", "Model", "Created", "Quote (max)", "Charge", "Latest"],
    row: ({ job: j, latest }) => [h("a", { href: `#/jobs/${j.id}` }, j.id), statusBadge(j.status), j.fine_tuned_model ?? j.model,
      when(j.created_at), quoteCell(j.gridline.quote),
      j.gridline.charge ? `${usd(j.gridline.charge.usd)} (${j.gridline.charge.basis})` : "—",
      latest || notServable(j) || j.gridline.reason || ""],
    empty: "No jobs yet. Create one with the SDK: client.fine_tuning.jobs.create(...)",
  });
}
