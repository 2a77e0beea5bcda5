// What the list views share: a heading, a table of the account's objects refreshed while on screen.
import { all } from "../api.js";
import { h, replace, table } from "../dom.js";

/** `load` (default: every page of `path`) gives the objects; `row` turns one into cells. */
export function listView(root, live, { title, path, max = 500, load = () => all(path, max), caption, head, row, empty }) {
  const body = h("div", {}, h("p", { class: "empty" }, `Loading ${title.toLowerCase()}…`));
  root.append(h("h1", {}, title), body);
  live(async (current) => {
    const items = await load();
    if (!current()) return false;
    replace(body, table(caption, head, items.map(row), empty));
  });
}
