// Building DOM from API data with text nodes only (never innerHTML): file names, messages and
// metadata are the account's own data and must never be read as markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value == null) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  // Deeply: a helper may hand back nested lists of nodes (facts' [dt, dd] pairs); one level left
  // arrays that String() turned into "[object HTMLElement],...".
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export const when = (unix) => (unix ? new Date(unix * 1000).toLocaleString() : "—");
export const num = (n) => (n == null ? "—" : Number(n).toLocaleString());
export const usd = (n) => (n == null ? "—" : `$${Number(n).toFixed(2)}`);
/** A fraction (an eval's pass rate) as a percentage with one decimal. */
export const pct = (x) => (x == null ? "—" : `${(x * 100).toFixed(1)}%`);
/** A grader's score (0 to 1 for most, a model grader's range for others) to three decimals. */
export const score = (x) => (x == null ? "—" : Number(x).toFixed(3));

/** A page's section, named by its heading (the browser tests read sections by that id). */
export function section(title, id, ...children) {
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), ...children);
}

export function statusBadge(status) {
  return h("span", { class: `badge s-${status}`, "data-status": status }, status.replace("_", " "));
}

/** A table with a caption; `rows` are arrays of cells (strings or nodes). Empty: the `empty` line. */
export function table(caption, head, rows, empty) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

/** Scalars of an object as a definition list; nested values as compact JSON. */
export function facts(obj, label) {
  const entries = Object.entries(obj ?? {}).filter(([, v]) => v != null && v !== false && v !== "");
  if (!entries.length) return h("p", { class: "empty" }, `No ${label}.`);
  return h("dl", { class: "facts", "aria-label": label },
    entries.map(([k, v]) => [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
}

/** A refused action (a download, a merge), said outside the views, which refresh every few seconds. */
export function say(message) {
  const notice = document.getElementById("notice");
  notice.textContent = message ?? "";
  notice.hidden = !message;
}

/** `key` names the button across refreshes (see `replace`); a failed `onclick` is said. */
export function button(label, onclick, key, attrs = {}) {
  const run = async (event) => {
    say(null);
    try {
      await onclick(event);
    } catch (e) {
      say(`${label}: ${e.message}`);
    }
  };
  return h("button", { type: "button", onclick: run, "data-key": key ?? label, ...attrs }, label);
}

const keyOf = (el) => el?.dataset?.key ?? el?.getAttribute?.("href") ?? null;

/** Puts `node` in `container` unless it would render the same; keeps keyboard focus on the link or
 * button with the same key, so that a refresh every few seconds does not throw a keyboard user out. */
export function replace(container, node) {
  if (container.firstChild?.isEqualNode?.(node) && container.childNodes.length === 1) return;
  const key = container.contains(document.activeElement) ? keyOf(document.activeElement) : null;
  container.replaceChildren(node);
  if (key) [...container.querySelectorAll("a, button")].find((el) => keyOf(el) === key)?.focus();
}
