// The account's evals (#/evals) and one eval (#/evals/<id>): its criteria, its runs with their
// result counts, each linking to the run's page, and a pick of two runs to compare.
import { all, get } from "../api.js";
import { button, facts, h, replace, section, statusBadge, table, when } from "../dom.js";
import { listView } from "./list.js";

/** A run's result counts as the eval pages show them. */
export const counts = (c) => `${c.passed} passed, ${c.failed} failed, ${c.errored} errored of ${c.total}`;

/** What a criterion checks, in a line: its grader's own terms (the full definition is the API's). */
export function rule(c) {
  switch (c.type) {
    case "string_check": return `${c.input} ${c.operation} ${c.reference}`;
    case "text_similarity": return `${c.evaluation_metric} of ${c.input} and ${c.reference} ≥ ${c.pass_threshold}`;
    case "score_model": return `${c.model} scores in [${(c.range ?? [0, 1]).join(", ")}], pass ≥ ${c.pass_threshold ?? "—"}`;
    case "label_model": return `${c.model} labels, passing: ${(c.passing_labels ?? []).join(", ")}`;
    case "multi": return c.calculate_output;
    case "python": return `python grade(sample, item), pass ≥ ${c.pass_threshold ?? "—"}`;
    default: return c.type;
  }
}

export function evalsView(root, { live }) {
  listView(root, live, {
    title: "Evals", path: "evals?order=desc", max: 200, caption: "Your evals, newest first",
    head: ["Eval", "Name", "Criteria", "Created"],
    row: (e) => [h("a", { href: `#/evals/${e.id}` }, e.id), e.name || "—", String(e.testing_criteria.length), when(e.created_at)],
    empty: "No evals yet. Create one with client.evals.create(...).",
  });
}

const runLabel = (r) => `${r.name || r.id} · ${r.status} · ${when(r.created_at)}`;

/** Two selects and a button; their options follow the runs without losing what the person picked. */
function comparePicker(evalId) {
  const before = h("select", { id: "compare-before" }), after = h("select", { id: "compare-after" });
  const open = button("Compare the two runs", () => {
    if (before.value === after.value) throw new Error("pick two different runs.");
    location.hash = `#/evals/${evalId}/compare/${before.value}/${after.value}`;
  }, "compare");
  const node = h("div", { class: "pick" }, h("label", { for: "compare-before" }, "Before"), before,
    h("label", { for: "compare-after" }, "After"), after, open);
  let shownIds = "";
  return {
    node,
    update(runs) { // newest first: the newest is "after", the one before it "before"
      const ids = runs.map((r) => `${r.id}:${r.status}`).join(",");
      if (ids === shownIds) return;
      shownIds = ids;
      for (const [select, fallback] of [[before, runs[1]], [after, runs[0]]]) {
        const kept = runs.some((r) => r.id === select.value) ? select.value : fallback?.id;
        select.replaceChildren(...runs.map((r) => h("option", { value: r.id }, runLabel(r))));
        if (kept) select.value = kept;
      }
    },
  };
}

export function evalView(root, { live, params: [evalId] }) {
  const head = h("div"), summary = h("div"), criteria = h("div"), runs = h("div");
  const picker = comparePicker(evalId);
  const pickArea = h("div", {}, h("p", { class: "empty" }, "Loading runs…"));
  root.append(h("p", {}, h("a", { href: "#/evals" }, "← All evals")), head, section("Summary", "h-summary", summary),
    section("Criteria", "h-criteria", criteria), section("Runs", "h-runs", runs),
    section("Compare two runs", "h-compare", pickArea));
  live(async (current) => {
    const [ev, list] = await Promise.all([get(`evals/${evalId}`), all(`evals/${evalId}/runs?order=desc`, 200)]);
    if (!current()) return false;
    replace(head, h("h1", {}, `Eval ${ev.name || ev.id}`));
    replace(summary, facts({ id: ev.id, name: ev.name, created: when(ev.created_at), metadata: Object.keys(ev.metadata ?? {}).length ? ev.metadata : null,
      item_schema: ev.data_source_config?.schema?.properties?.item }, "eval facts"));
    replace(criteria, table("What each item is graded by", ["Criterion", "Type", "Rule"],
      ev.testing_criteria.map((c) => [c.name, c.type, h("code", {}, rule(c))]), "No criteria."));
    replace(runs, table("The eval's runs, newest first", ["Run", "Name", "Status", "Model", "Results", "Created"],
      list.map((r) => [h("a", { href: `#/evals/${evalId}/runs/${r.id}` }, r.id), r.name || "—", statusBadge(r.status),
        r.model || `— (${r.data_source?.type ?? "jsonl"}: samples given)`, counts(r.result_counts), when(r.created_at)]),
      "No runs yet. Start one with client.evals.runs.create(...)."));
    if (list.length < 2) {
      replace(pickArea, h("p", { class: "empty" }, "Two runs are needed to compare."));
    } else {
      picker.update(list);
      if (pickArea.firstChild !== picker.node) pickArea.replaceChildren(picker.node);
    }
  });
}
