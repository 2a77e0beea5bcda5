// The account's files with the stats validation recorded (gridline: rows, messages, token bound).
import { all } from "../api.js";
import { h, replace, num, table, when } from "../dom.js";

export function filesView(root, { live }) {
  const body = h("div", {}, h("p", { class: "empty" }, "Loading files…"));
  root.append(h("h1", {}, "Files"), body);
  live(async (current) => {
    const files = await all("files", 500);
    if (!current()) return false;
    replace(body, table("Your files, newest first",
      ["File", "Name", "Purpose", "Status", "Bytes", "Rows", "Messages", "Row kind", "Token bound", "Uploaded", "Expires"],
      files.map((f) => [h("code", {}, f.id), f.filename, f.purpose, f.status_details ? `${f.status}: ${f.status_details}` : f.status,
        num(f.bytes), num(f.gridline.rows), num(f.gridline.messages), f.gridline.row_kind ?? "—",
        num(f.gridline.token_upper_bound), when(f.created_at), when(f.expires_at)]),
      "No files yet. Upload a JSONL file with client.files.create(file=..., purpose=\"fine-tune\")."));
  });
}
