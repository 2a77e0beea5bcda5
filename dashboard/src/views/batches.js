// The account's batches: status, request counts, quote and charge.
import { all } from "../api.js";
import { h, replace, num, statusBadge, table, usd, when } from "../dom.js";

export function batchesView(root, { live }) {
  const body = h("div", {}, h("p", { class: "empty" }, "Loading batches…"));
  root.append(h("h1", {}, "Batches"), body);
  live(async (current) => {
    const batches = await all("batches", 200);
    if (!current()) return false;
    replace(body, table("Your batches, newest first",
      ["Batch", "Status", "Models", "Requests (done/failed/total)", "Created", "Output file", "Max charge", "Charge"],
      batches.map((b) => [h("code", {}, b.id), statusBadge(b.status), (b.gridline?.models ?? []).join(", "),
        b.request_counts ? `${num(b.request_counts.completed)}/${num(b.request_counts.failed)}/${num(b.request_counts.total)}` : "—",
        when(b.created_at), b.output_file_id ? h("code", {}, b.output_file_id) : "—",
        usd(b.gridline?.quote?.max_charge_usd), b.gridline?.charge ? usd(b.gridline.charge.usd) : "—"]),
      "No batches yet. Create one with client.batches.create(...)."));
  });
}
