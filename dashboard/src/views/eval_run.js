// One eval run (#/evals/<id>/runs/<run_id>, the run's report_url): its status, result counts, each
// criterion's passes and failures, token usage, and its output items a page at a time (the item,
// the sample's text, and each grade with its score and reason).
import { get } from "../api.js";
import { button, facts, h, num, pct, replace, score, section, statusBadge, table, when } from "../dom.js";
import { counts } from "./evals.js";

export const ENDED = new Set(["completed", "failed", "canceled"]); // a run's statuses that stay
export const PAGE = 20;

/** What the sampled model answered (its output messages' text), or why there is no sample. */
export function sampleText(sample) {
  if (sample?.error) return `Error: ${sample.error.code ?? ""}: ${sample.error.message ?? ""}`;
  return (sample?.output ?? []).map((m) => m.content).join("\n");
}

export const gradeText = (r) => `${r.name}: ${score(r.score)} ${r.passed ? "pass" : "fail"}${r.reason ? ` (${r.reason})` : ""}`;

export function usageTable(caption, rows, empty) {
  return table(caption, ["Model", "Calls", "Prompt tokens", "Completion tokens", "Total tokens"],
    rows.map((u) => [u.model_name, num(u.invocation_count), num(u.prompt_tokens), num(u.completion_tokens), num(u.total_tokens)]),
    empty);
}

/** The output items a page at a time: `after` cursors of the pages seen, the last one on screen. */
function itemPages(path, body) {
  const cursors = [null];
  let latest = 0; // a refresh that started before a click on the pager must not put the old page back
  const show = async () => {
    const mine = ++latest;
    const after = cursors[cursors.length - 1];
    const page = await get(`${path}?limit=${PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    if (mine !== latest) return;
    const first = (cursors.length - 1) * PAGE + 1;
    const pager = h("div", { class: "actions pager" },
      button("Previous items", () => { cursors.pop(); return show(); }, "previous", { disabled: cursors.length === 1 }),
      button("Next items", () => { cursors.push(page.data.at(-1).id); return show(); }, "next", { disabled: !page.has_more }),
      page.data.length ? h("span", { class: "range" }, `Items ${first}–${first + page.data.length - 1}`) : null);
    replace(body, h("div", {}, table("Output items, in source order", ["#", "Status", "Item", "Sample", "Grades"],
      page.data.map((o) => [String(o.datasource_item_id), statusBadge(o.status), h("code", {}, JSON.stringify(o.datasource_item)),
        h("span", { class: "sample" }, sampleText(o.sample)), h("ul", { class: "grades" }, o.results.map((r) => h("li", {}, gradeText(r))))]),
      "No output items yet."), pager));
  };
  return show;
}

export function runView(root, { live, params: [evalId, runId] }) {
  const path = `evals/${evalId}/runs/${runId}`;
  const head = h("div"), summary = h("div"), results = h("div"), criteria = h("div"), usage = h("div"), items = h("div");
  const showItems = itemPages(`${path}/output_items`, items);
  root.append(h("p", {}, h("a", { href: `#/evals/${evalId}` }, "← The eval and its runs")), head,
    section("Summary", "h-summary", summary), section("Results", "h-results", results),
    section("Per criterion", "h-criteria", criteria), section("Usage", "h-usage", usage),
    section("Output items", "h-items", items));
  let passesAfterEnd = 0;
  live(async (current) => {
    const run = await get(path);
    if (!current()) return false;
    replace(head, h("h1", {}, `Run ${run.name || run.id} `, statusBadge(run.status)));
    replace(summary, facts({ id: run.id, eval: run.eval_id, model: run.model || `none (${run.data_source?.type}: samples given)`,
      created: when(run.created_at), error: run.error && `${run.error.code}: ${run.error.message}` }, "run facts"));
    replace(results, h("div", {}, facts(run.result_counts, "result counts"), h("p", {}, counts(run.result_counts))));
    replace(criteria, table("Items each criterion passed and failed", ["Criterion", "Passed", "Failed", "Pass rate"],
      run.per_testing_criteria_results.map((c) => [c.testing_criteria, num(c.passed), num(c.failed),
        pct(c.passed + c.failed ? c.passed / (c.passed + c.failed) : null)]), "No criterion has graded an item yet."));
    replace(usage, usageTable("Tokens per model", run.per_model_usage,
      "No model calls: the samples were given (a jsonl run) and no criterion asks a model."));
    // While the run goes the page on screen refreshes with it; after, the pager alone moves it.
    if (!ENDED.has(run.status) || passesAfterEnd === 0) await showItems();
    return !ENDED.has(run.status) || passesAfterEnd++ < 1;
  });
}
