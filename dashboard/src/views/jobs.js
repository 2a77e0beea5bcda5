// The account's fine-tuning jobs: status, quote, charge, and each open job's latest event, live.
import { all, get } from "../api.js";
import { h, replace, num, statusBadge, table, usd, when } from "../dom.js";

const OPEN = new Set(["validating_files", "queued", "running", "paused"]);

export function jobsView(root, { live }) {
  const body = h("div", {}, h("p", { class: "empty" }, "Loading jobs…"));
  root.append(h("h1", {}, "Fine-tuning jobs"), body);
  live(async (current) => {
    const jobs = await all("fine_tuning/jobs", 200);
    // The latest event of open jobs only: an ended job's story is on its own page.
    const latest = await Promise.all(jobs.map((j) => (OPEN.has(j.status)
      ? get(`fine_tuning/jobs/${j.id}/events?limit=1`).then((p) => p.data[0]?.message ?? "") : j.error?.message ?? "")));
    if (!current()) return false;
    replace(body, table("Your jobs, newest first", ["Job", "Status", "Model", "Created", "Quote (max)", "Charge", "Latest"],
      jobs.map((j, i) => [
        h("a", { href: `#/jobs/${j.id}` }, j.id),
        statusBadge(j.status),
        j.fine_tuned_model ?? j.model,
        when(j.created_at),
        quoteCell(j.gridline.quote),
        j.gridline.charge ? `${usd(j.gridline.charge.usd)} (${j.gridline.charge.basis})` : "—",
        latest[i] || j.gridline.reason || "",
      ]), "No jobs yet. Create one with the SDK: client.fine_tuning.jobs.create(...)"));
  });
}

export function quoteCell(quote) {
  if (!quote || !quote.per_token) return "—";
  return `${usd(quote.per_token.max_charge_usd)} · ≤${num(quote.training_tokens_upper_bound)} tokens`;
}
