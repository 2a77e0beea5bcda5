// The playground: talk with one of the account's models, or two side by side (an ft: model and its
// base), the answers streaming in as the API generates them (POST /v1/chat/completions, stream: true,
// the same route the SDK calls). Each model keeps its own side of the conversation.
import { all, streamChat } from "../api.js";
import { h } from "../dom.js";

const NONE = "";

function select(id, label, options, withNone) {
  const el = h("select", { id, name: id },
    withNone ? h("option", { value: NONE }, "(none)") : null,
    options.map((m) => h("option", { value: m }, m)));
  return [h("label", { for: id }, label), el];
}

/** One model's column: its name, the conversation, and what its last answer said about itself. */
function panel(model) {
  const turns = h("ol", { class: "turns", "aria-live": "polite", "aria-label": `Conversation with ${model}` });
  const status = h("p", { class: "answer-status" });
  const node = h("section", { class: "panel", "data-model": model, "aria-label": model }, h("h2", {}, model), turns, status);
  return { model, node, turns, status, history: [] };
}

async function answer(p, message, settings) {
  p.history.push({ role: "user", content: message });
  p.turns.append(h("li", { class: "turn user" }, h("span", { class: "who" }, "You"), h("p", {}, message)));
  const text = h("p", { class: "text" });
  p.turns.append(h("li", { class: "turn assistant" }, h("span", { class: "who" }, p.model), text));
  p.status.textContent = "Answering…";
  const messages = settings.system ? [{ role: "system", content: settings.system }, ...p.history] : p.history;
  try {
    const done = await streamChat({ model: p.model, messages, max_tokens: settings.maxTokens, temperature: settings.temperature },
      (piece) => text.append(piece));
    p.history.push({ role: "assistant", content: text.textContent });
    p.status.textContent = `Done: ${done.finish_reason === "length" ? "cut at max tokens" : "finished"}, `
      + `${done.usage.completion_tokens} tokens answered to ${done.usage.prompt_tokens} in the prompt.`;
  } catch (e) {
    p.history.pop(); // the turn did not happen: it is not sent again with the next message
    p.status.textContent = "";
    text.replaceChildren(h("span", { class: "error", role: "alert" }, `Refused: ${e.message}`));
  }
}

export function playgroundView(root, { live }) {
  const form = h("form", { class: "playground" }, h("p", { class: "empty" }, "Loading models…"));
  const panels = h("div", { class: "panels" });
  root.append(h("h1", {}, "Playground"), form, panels);
  live(async (current) => {
    const models = (await all("models")).filter((m) => m.gridline?.servable !== false).map((m) => m.id);
    if (!current()) return false;
    const mine = models.filter((m) => m.startsWith("ft:"));
    const ordered = [...mine, ...models.filter((m) => !m.startsWith("ft:"))];
    const [modelLabel, model] = select("model", "Model", ordered, false);
    const [otherLabel, other] = select("compare", "Side by side with", ordered, true);
    const system = h("input", { id: "system", type: "text", placeholder: "optional" });
    const maxTokens = h("input", { id: "max-tokens", type: "number", min: 1, value: 64 });
    const temperature = h("input", { id: "temperature", type: "number", min: 0, max: 2, step: 0.1, value: 0 });
    const message = h("textarea", { id: "message", rows: 3, required: true });
    const send = h("button", { type: "submit" }, "Send");
    const reset = h("button", { type: "button" }, "New conversation");
    form.replaceChildren(
      h("div", { class: "pick" }, modelLabel, model, otherLabel, other),
      h("div", { class: "pick" }, h("label", { for: "system" }, "System message"), system,
        h("label", { for: "max-tokens" }, "Max tokens"), maxTokens, h("label", { for: "temperature" }, "Temperature"), temperature),
      h("label", { for: "message" }, "Message"), message, h("div", { class: "actions" }, send, reset));
    let open = [];
    const chosen = () => [model.value, other.value].filter((m, i, all) => m !== NONE && all.indexOf(m) === i);
    const start = () => {
      open = chosen().map(panel);
      panels.replaceChildren(...open.map((p) => p.node));
    };
    for (const el of [model, other, system]) el.addEventListener("change", start);
    reset.addEventListener("click", start);
    message.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = message.value.trim();
      if (!text) return;
      if (!open.length) start();
      send.disabled = true;
      message.value = "";
      const settings = { system: system.value.trim(), maxTokens: Number(maxTokens.value) || undefined,
        temperature: Number(temperature.value) };
      await Promise.all(open.map((p) => answer(p, text, settings)));
      send.disabled = false;
      message.focus();
    });
    if (!ordered.length) form.replaceChildren(h("p", { class: "empty" }, "No model can answer prompts here."));
    else start();
    return false; // loaded once; the conversation is the page's own from here
  });
}
