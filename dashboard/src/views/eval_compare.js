// Two runs of one eval side by side (#/evals/<id>/compare/<run_id>/<other_run_id>, from
// GET /v1/gridline/evals/<id>/compare): each criterion's pass rate and mean score in each run, their
// token usage, and the items whose grade changed, before → after.
import { get } from "../api.js";
import { h, pct, replace, score, section, statusBadge, table } from "../dom.js";
import { counts } from "./evals.js";
import { ENDED, usageTable } from "./eval_run.js";

const SIDES = ["before", "after"];

/** The change in pass rate in percentage points, signed ("+66.7 pts"). */
export function change(a, b) {
  if (a == null || b == null) return "—";
  const d = (b - a) * 100;
  return `${d >= 0 ? "+" : "−"}${Math.abs(d).toFixed(1)} pts`;
}

const grade = (g) => `${score(g.score)} ${g.passed ? "pass" : "fail"}`;

export function compareView(root, { live, params: [evalId, runId, otherId] }) {
  const runs = h("div"), criteria = h("div"), usage = h("div"), changed = h("div");
  const run = (id) => h("a", { href: `#/evals/${evalId}/runs/${id}` }, id);
  root.append(h("p", {}, h("a", { href: `#/evals/${evalId}` }, "← The eval and its runs"), " · ",
    h("a", { href: `#/evals/${evalId}/compare/${otherId}/${runId}` }, "Swap before and after")),
    h("h1", {}, "Two runs compared"),
    section("Runs", "h-runs", runs), section("Per criterion", "h-criteria", criteria),
    section("Usage", "h-usage", usage), section("Items whose grade changed", "h-changed", changed));
  let passesAfterEnd = 0;
  live(async (current) => {
    const cmp = await get(`gridline/evals/${evalId}/compare?run_id=${encodeURIComponent(runId)}`
      + `&other_run_id=${encodeURIComponent(otherId)}`);
    if (!current()) return false;
    const [a, b] = cmp.runs;
    replace(runs, table("Before, then after", ["Side", "Run", "Model", "Status", "Results"],
      cmp.runs.map((r, i) => [SIDES[i], run(r.id), r.model || "— (samples given)", statusBadge(r.status), counts(r.result_counts)]), ""));
    replace(criteria, table("Pass rate and mean score over the items each run graded",
      ["Criterion", "Pass rate before", "Pass rate after", "Change", "Mean score before", "Mean score after", "Graded before / after"],
      a.criteria.map((ca, i) => {
        const cb = b.criteria[i];
        return [ca.name, pct(ca.pass_rate), pct(cb.pass_rate), change(ca.pass_rate, cb.pass_rate), score(ca.mean_score),
          score(cb.mean_score), `${ca.graded} / ${cb.graded}`];
      }), "The eval has no criteria."));
    replace(usage, h("div", {}, cmp.runs.map((r, i) => usageTable(`Tokens per model, ${SIDES[i]} (${r.id})`, r.per_model_usage,
      `No model calls ${SIDES[i]}: its samples were given and no criterion asks a model.`))));
    replace(changed, h("div", {}, h("p", {}, `${cmp.changed.length} of the items both runs graded changed.`),
      table("Items whose status or a criterion's pass changed, in source order", ["#", "Before", "After", "Criteria", "Item"],
        cmp.changed.map((c) => [String(c.datasource_item_id), statusBadge(c.before), statusBadge(c.after),
          h("ul", { class: "grades" }, Object.entries(c.criteria).map(([name, g]) =>
            h("li", {}, `${name}: ${grade(g.before)} → ${grade(g.after)}`))),
          h("code", {}, JSON.stringify(c.datasource_item))]), "No item's grade changed.")));
    const ended = cmp.runs.every((r) => ENDED.has(r.status));
    return !ended || passesAfterEnd++ < 1;
  });
}
