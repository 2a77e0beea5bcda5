// The dashboard's shell: sign-in, hash routes (#/jobs, #/jobs/<id>, #/files, #/models, #/batches, #/evals and an
// eval's pages: #/evals/<id>, its runs #/evals/<id>/runs/<run_id>, two compared #/evals/<id>/compare/<a>/<b>, #/playground),
// and the refresh loop each view runs while it is on screen.
import "./style.css";
import { ApiError, get, session } from "./api.js";
import { h, say } from "./dom.js";
import { batchesView } from "./views/batches.js";
import { compareView } from "./views/eval_compare.js";
import { runView } from "./views/eval_run.js";
import { evalView, evalsView } from "./views/evals.js";
import { filesView } from "./views/files.js";
import { jobView } from "./views/job.js";
import { jobsView } from "./views/jobs.js";
import { modelsView } from "./views/models.js";
import { playgroundView } from "./views/playground.js";

const main = document.getElementById("main");
const banner = document.getElementById("banner");
const nav = document.getElementById("nav");
const signOutButton = document.getElementById("sign-out");
const POLL_MS = 2000;
let generation = 0; // bumped on every route change; a view's loop stops when it is stale

const routes = [
  [/^#\/jobs\/(ftjob-[\w-]+)$/, jobView],
  [/^#\/jobs$/, jobsView],
  [/^#\/files$/, filesView],
  [/^#\/models$/, modelsView],
  [/^#\/batches$/, batchesView],
  [/^#\/evals\/(eval_\w+)\/runs\/(evalrun_\w+)$/, runView],
  [/^#\/evals\/(eval_\w+)\/compare\/(evalrun_\w+)\/(evalrun_\w+)$/, compareView],
  [/^#\/evals\/(eval_\w+)$/, evalView],
  [/^#\/evals$/, evalsView],
  [/^#\/playground$/, playgroundView],
];

function showBanner(message) {
  banner.textContent = message ?? "";
  banner.hidden = !message;
}

function signInForm(message) {
  const input = h("input", { id: "key", type: "password", autocomplete: "off", spellcheck: "false", required: true });
  const error = h("p", { id: "sign-in-error", class: "error", role: "alert" }, message ?? "");
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h("form", { class: "sign-in", "aria-describedby": "sign-in-error" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Your API key is kept in this tab's session storage only, and sent to this server's API."),
    h("label", { for: "key" }, "API key"), input, submit, error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    submit.disabled = true;
    error.textContent = "";
    try {
      await get("models", { key }); // any account route: it answers 401 for a wrong key
      session.signIn(key);
      if (!routes.some(([re]) => re.test(location.hash))) location.hash = "#/jobs";
      else route(true);
    } catch (e) {
      error.textContent = e.status === 401 ? `That key was refused: ${e.message}` : e.message;
      submit.disabled = false;
      input.focus();
    }
  });
  return form;
}

export function signOut(message) {
  session.signOut();
  generation += 1;
  nav.hidden = signOutButton.hidden = true;
  showBanner(null);
  main.replaceChildren(signInForm(message));
  document.getElementById("key").focus();
}

/** Runs `draw` now and every POLL_MS while this route is on screen; `draw` returns false to stop.
 * A 404 (an object this key's account does not have) replaces the view and stops. */
function live(root, draw) {
  const mine = generation;
  const tick = async () => {
    if (mine !== generation) return;
    let again = true;
    try {
      again = (await draw(() => mine === generation)) !== false;
      showBanner(null);
    } catch (e) {
      if (mine !== generation) return;
      if (e instanceof ApiError && e.status === 401) return signOut(`Signed out: ${e.message}`);
      if (e instanceof ApiError && e.status === 404) {
        return root.replaceChildren(h("p", { class: "error", role: "alert" }, `Not found: ${e.message} `),
          h("p", {}, h("a", { href: "#/jobs" }, "Back to your jobs")));
      }
      showBanner(e instanceof ApiError && e.status === 0 ? `${e.message} Retrying…` : `Error: ${e.message}`);
    }
    if (again && mine === generation) setTimeout(tick, POLL_MS);
  };
  tick();
}

/** `focus`: move focus to the new view (after a navigation; a fresh load starts at the top). */
function route(focus = false) {
  generation += 1;
  say(null);
  if (!session.key()) return signOut();
  nav.hidden = signOutButton.hidden = false;
  for (const a of nav.querySelectorAll("a")) {
    const current = location.hash.startsWith(a.getAttribute("href"));
    if (current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const match = routes.map(([re, view]) => [location.hash.match(re), view]).find(([m]) => m);
  if (!match) {
    location.replace("#/jobs");
    return;
  }
  const [params, view] = match;
  const root = h("section", { class: "view" });
  main.replaceChildren(root);
  view(root, { live: (draw) => live(root, draw), params: params.slice(1) });
  if (focus) main.focus({ preventScroll: true }); // a screen reader or keyboard user starts at the new view
}

signOutButton.addEventListener("click", () => signOut("Signed out."));
// The skip link focuses the content; following its #main would leave the routes.
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
window.addEventListener("hashchange", () => route(true));
route();
