// The public JSON API, called with the signed-in key as `Authorization: Bearer` (the same routes the
// OpenAI SDK calls). The key lives in sessionStorage only: gone when the tab closes, never in a URL.

const KEY = "openft.api_key";
// The page is served at <root>/dashboard/, the API at <root>/v1 (root: a Serve route prefix, if any).
export const API_BASE = new URL("../v1/", document.baseURI);

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status; // 0: the API could not be reached
    this.code = code;
  }
}

export const session = {
  key: () => sessionStorage.getItem(KEY),
  signIn: (key) => sessionStorage.setItem(KEY, key),
  signOut: () => sessionStorage.removeItem(KEY),
};

async function call(path, { method = "GET", key = session.key() } = {}) {
  let response;
  try {
    response = await fetch(new URL(path, API_BASE), {
      method,
      headers: { Authorization: `Bearer ${key}` },
      cache: "no-store",
    });
  } catch {
    throw new ApiError(0, "unreachable", `The API at ${API_BASE} did not answer. Is openft serve running?`);
  }
  if (response.ok) return response;
  let error = {};
  try {
    error = (await response.json()).error ?? {};
  } catch {
    // A proxy's HTML error page: the status says enough.
  }
  throw new ApiError(response.status, error.code ?? null, error.message ?? `The API answered ${response.status}.`);
}

export async function get(path, options) {
  return (await call(path, options)).json();
}

export async function post(path) {
  return (await call(path, { method: "POST" })).json();
}

/** Every page of a cursor list (`{data, has_more}`, `after` = the last id), up to `max` objects. */
export async function all(path, max = 1000) {
  const out = [];
  let after = null;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await get(`${path}${sep}limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    out.push(...page.data);
    if (!page.has_more || !page.data.length || out.length >= max) return out;
    after = page.data[page.data.length - 1].id;
  }
}

/** Downloads need the bearer key, which a plain link cannot send: fetch, then save the bytes. */
export async function download(path, filename) {
  const blob = await (await call(path)).blob();
  const url = URL.createObjectURL(blob);
  const a = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** A streamed chat completion: `onText(piece)` for each piece of the answer as it arrives; resolves
 * to {finish_reason, usage} once the stream ends (`stream_options.include_usage`). A refusal before
 * the stream starts, or an error event in it, rejects with an ApiError. */
export async function streamChat(body, onText) {
  let response;
  try {
    response = await fetch(new URL("chat/completions", API_BASE), {
      method: "POST",
      headers: { Authorization: `Bearer ${session.key()}`, "Content-Type": "application/json" },
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      cache: "no-store",
    });
  } catch {
    throw new ApiError(0, "unreachable", `The API at ${API_BASE} did not answer. Is openft serve running?`);
  }
  if (!response.ok) {
    const error = (await response.json().catch(() => ({}))).error ?? {};
    throw new ApiError(response.status, error.code ?? null, error.message ?? `The API answered ${response.status}.`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const done = { finish_reason: null, usage: null };
  let buffer = "";
  for (;;) {
    const { value, done: ended } = await reader.read();
    if (ended) return done;
    buffer += value;
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const event of events) {
      const data = event.replace(/^data: /, "");
      if (data === "[DONE]") return done;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error.code ?? null, chunk.error.message);
      for (const choice of chunk.choices) {
        if (choice.delta?.content) onText(choice.delta.content);
        if (choice.finish_reason) done.finish_reason = choice.finish_reason;
      }
      if (chunk.usage) done.usage = chunk.usage;
    }
  }
}
