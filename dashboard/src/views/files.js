// The account's files with the stats validation recorded (gridline: rows, messages, token bound).
import { h, num, when } from "../dom.js";
import { listView } from "./list.js";

export function filesView(root, { live }) {
  listView(root, live, {
    title: "Files", path: "files", caption: "Your files, newest first",
    head: ["File", "Name", "Purpose", "Status", "Bytes", "Rows", "Messages", "Row kind", "Token bound", "Uploaded", "Expires"],
    row: (f) => [h("code", {}, f.id), f.filename, f.purpose, f.status_details ? `${f.status}: ${f.status_details}` : f.status,
      num(f.bytes), num(f.gridline.rows), num(f.gridline.messages), f.gridline.row_kind ?? "—",
      num(f.gridline.token_upper_bound), when(f.created_at), when(f.expires_at)],
    empty: "No files yet. Upload a JSONL file with client.files.create(file=..., purpose=\"fine-tune\").",
  });
}
