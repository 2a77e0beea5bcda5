// The account's batches: status, request counts, quote and charge.
import { h, num, statusBadge, usd, when } from "../dom.js";
import { listView } from "./list.js";

const counts = (c) => (c ? `${num(c.completed)}/${num(c.failed)}/${num(c.total)}` : "—");

export function batchesView(root, { live }) {
  listView(root, live, {
    title: "Batches", path: "batches", max: 200, caption: "Your batches, newest first",
    head: ["Batch", "Status", "Models", "Requests (done/failed/total)", "Created", "Output file", "Max charge", "Charge"],
    row: (b) => [h("code", {}, b.id), statusBadge(b.status), (b.gridline?.models ?? []).join(", "), counts(b.request_counts),
      when(b.created_at), b.output_file_id ? h("code", {}, b.output_file_id) : "—",
      usd(b.gridline?.quote?.max_charge_usd), b.gridline?.charge ? usd(b.gridline.charge.usd) : "—"],
    empty: "No batches yet. Create one with client.batches.create(...).",
  });
}
