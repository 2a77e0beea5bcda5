// The account's models: fine-tuned ones with adapter downloads and merged weights (start a merge,
// follow it, download the export's files), then the catalog's bases.
import { ApiError, all, download, get, post } from "../api.js";
import { button, h, replace, table, when } from "../dom.js";
import { adapterButtons } from "./job.js";

const merged = (model) => `gridline/adapters/${encodeURIComponent(model)}/merged`;

async function mergeOf(model) {
  try {
    return await get(merged(model));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return null; // never merged
    throw e;
  }
}

function mergeCell(model, merge) {
  const start = () => post(merged(model)); // the view's next refresh shows the merge's status
  if (!merge || merge.status === "expired") {
    return h("span", {}, merge ? "Export expired. " : "Not merged. ", button("Merge into base", start, `merge/${model}`));
  }
  if (merge.status === "failed") {
    return h("span", {}, `Failed: ${merge.error?.code ?? ""} `, button("Merge again", start, `merge/${model}`));
  }
  if (merge.status !== "succeeded") return h("span", {}, `Merge ${merge.status}…`);
  // A plain list, not <details>: a refresh would close a disclosure the person opened.
  return h("div", {}, `Merged: ${merge.files.length} files, until ${when(merge.expires_at)}`,
    h("ul", { class: "merged" }, merge.files.map((f) => h("li", {}, button(`Download ${f.path}`,
      () => download(`${merged(model)}/files/${f.path.split("/").map(encodeURIComponent).join("/")}`, f.path.split("/").at(-1)),
      `${model}/merged/${f.path}`)))));
}

export function modelsView(root, { live }) {
  const tuned = h("div", {}, h("p", { class: "empty" }, "Loading models…")), bases = h("div");
  root.append(h("h1", {}, "Models"), h("h2", {}, "Fine-tuned"), tuned, h("h2", {}, "Base models"), bases);
  live(async (current) => {
    const models = await all("models");
    const mine = models.filter((m) => m.id.startsWith("ft:"));
    const merges = await Promise.all(mine.map((m) => mergeOf(m.id)));
    if (!current()) return false;
    replace(tuned, table("Your fine-tuned models", ["Model", "Base", "Job", "Created", "Servable", "Adapter", "Merged weights"],
      mine.map((m, i) => [h("code", {}, m.id), m.gridline?.base ?? "—",
        m.gridline?.job ? h("a", { href: `#/jobs/${m.gridline.job}` }, m.gridline.job) : "—", when(m.created),
        m.gridline?.servable ? "yes" : `no${m.gridline?.reason ? ` (${m.gridline.reason})` : ""}`,
        adapterButtons(m.id), mergeCell(m.id, merges[i])]),
      "No fine-tuned models yet: a job that succeeds registers one."));
    replace(bases, table("Bases you can fine-tune", ["Model", "Hugging Face repo", "Licence", "Servable"],
      models.filter((m) => !m.id.startsWith("ft:")).map((m) => [h("code", {}, m.id), m.gridline?.hf_repo ?? "—",
        m.gridline?.licence ?? "—", m.gridline?.servable ? "yes" : "no"]), "No base models."));
  });
}
