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
