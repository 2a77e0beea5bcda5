"""The web dashboard (GET /dashboard/) in Debian's headless Chromium, driven by Playwright, against
the suite's `openft serve` (its xdist worker's): a wrong key is refused on the page, the right one signs in, a small
stand-in job is followed to `succeeded` with its loss chart holding one point per reported step,
the sections are reached by keyboard, an unreachable API is said, and another account's objects
never appear; an eval's pages (the list, the eval with its runs, each run's page with its output
items a page at a time, two runs compared) show what the API answers; a reinforcement job (a `multi`
grader's) is followed to `succeeded`, its reward chart and table holding its steps' rewards and its
validation rewards. Every section of every page
is read as a person reads it (its visible text) against the API's values, so a page that renders
nonsense ("[object HTMLElement]") fails; a screenshot of each page goes to build/e2e/."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import httpx

import pytest

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from tests.e2e.conftest import ON_TICKET_MODELS
from tests.utils.polling import until

pytestmark = pytest.mark.e2e

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
METHOD = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
    "n_epochs": 1, "batch_size": 1, "learning_rate": 1e-3}}}


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def upload(client, rows):
    return client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")


def _js(value):
    """A JSON value as JavaScript holds it: 1.0 is the number 1."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _js(v) for k, v in value.items()}
    return [_js(v) for v in value] if isinstance(value, list) else value


def shown(value) -> str:
    """How the dashboard's `facts` shows a value: scalars as String() writes them, objects as JSON.stringify."""
    value = _js(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value).lower() if isinstance(value, bool) else str(value)


def listed(obj: dict) -> dict:
    """The entries `facts` lists: all but null, false and the empty string (0 is listed)."""
    return {k: v for k, v in obj.items() if v is not None and v is not False and v != ""}


def read_facts(page, section: str) -> dict[str, str]:
    """A section's definition lists as {term: visible text}."""
    return page.evaluate("""s => Object.fromEntries([...document.querySelectorAll(`section[aria-labelledby=${s}] dl dt`)]
        .map(dt => [dt.textContent, dt.nextElementSibling.innerText]))""", section)


def section_text(page, section: str) -> str:
    return page.locator(f"section[aria-labelledby={section}]").inner_text()


def assert_sane(page) -> None:
    text = page.locator("body").inner_text()
    assert "[object" not in text and "undefined" not in text and "NaN" not in text, text[:2000]


def row_cells(page, text: str, table: str | None = None) -> list[str]:
    """The cells of the row whose first cell is `text`, in the table captioned `table` (default: any)."""
    scope = page.locator("table", has=page.locator("caption", has_text=table)) if table else page
    return scope.get_by_role("row").filter(
        has=page.locator("td:first-child", has_text=re.compile(f"^{re.escape(text)}$"))).get_by_role("cell").all_inner_texts()


def sign_in(page, url: str, key: str) -> None:
    page.goto(url)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def test_dashboard_follows_a_job_by_keyboard_and_shows_one_account_only(people_service, browser, artifacts):
    rows, _ = ticket_splits()
    mine, other = people_service.client(key := people_service.new_key()), people_service.client(people_service.new_key())
    file = upload(mine, rows[:24])
    job = mine.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=file.id, method=METHOD, seed=0)
    theirs_file = upload(other, rows[:12])
    theirs = other.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=theirs_file.id, method=METHOD)
    other.fine_tuning.jobs.cancel(theirs.id)  # it exists, in another account; it need not train
    url = people_service.base_url.removesuffix("/v1") + "/dashboard"

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []  # CSP violations and script errors land in the console
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    not_found = []  # the URLs answered 404: the console's own line for each names none
    page.on("response", lambda r: not_found.append(r.url) if r.status == 404 else None)

    # A wrong key: said on the page, nothing kept.
    sign_in(page, url, "sk-wrong")
    page.get_by_text("That key was refused").wait_for()
    page.screenshot(path=str(artifacts / "dashboard-sign-in.png"), full_page=True)
    assert page.evaluate("sessionStorage.length") == 0
    problems.clear()  # the browser logs the 401 itself
    page.get_by_label("API key").fill(key)
    page.get_by_label("API key").press("Enter")
    page.get_by_role("link", name=job.id).wait_for()
    assert "sk-" not in page.url and page.evaluate("Object.values(sessionStorage)") == [key]
    assert page.get_by_text(theirs.id).count() == 0

    # By keyboard, from a fresh load: skip link first, then the sections in order; Enter follows the focused link.
    page.reload()
    page.get_by_role("link", name=job.id).wait_for()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    names = []
    for _ in range(7):
        page.keyboard.press("Tab")
        names.append(page.evaluate("document.activeElement.textContent"))
    assert names == ["Jobs", "Files", "Models", "Batches", "Evals", "Playground", "Sign out"]
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # focus is visible
    for _ in range(5):
        page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")  # Files
    row = page.get_by_role("row").filter(has=page.get_by_text(file.id))
    row.wait_for()
    assert row.get_by_role("cell").nth(5).text_content() == "24"  # rows, as validation counted them
    assert page.get_by_text(theirs_file.id).count() == 0
    api_file = mine.files.retrieve(file.id)
    cells = row.get_by_role("cell").all_inner_texts()
    assert cells[:5] == [api_file.id, api_file.filename, "fine-tune", "processed", f"{api_file.bytes:,}"]
    assert cells[6:9] == [f"{api_file.model_extra['gridline']['messages']:,}", "chat",
                          f"{api_file.model_extra['gridline']['token_upper_bound']:,}"]
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-files.png"), full_page=True)

    page.goto(f"{url}/#/jobs")
    link = page.get_by_role("link", name=job.id)
    link.focus()
    page.keyboard.press("Enter")
    page.locator('h1 [data-status="succeeded"]').wait_for(timeout=170_000)
    chart = page.locator("#loss-chart")
    api_events = list(mine.fine_tuning.jobs.list_events(job.id, limit=100))
    steps = {e.data["step"] for e in api_events if e.type == "metrics" and e.data and "step" in e.data}
    assert len(steps) >= 2  # batch 1 over 24 rows: steps 10, 20 and 24
    page.wait_for_function("n => document.querySelector('#loss-chart').dataset.trainPoints === String(n)", arg=len(steps))
    assert chart.get_attribute("data-eval-points") == "2"  # before and after training, from gridline.result
    assert page.locator('#loss-table tr[data-series="train"]').count() == len(steps)
    assert page.locator("#events li").count() == len(api_events)
    assert page.get_by_text("Download adapter_model.safetensors").count() >= 1  # the checkpoints' adapters
    page.locator("section[aria-labelledby=h-loss]").screenshot(path=str(artifacts / "dashboard-loss-chart.png"))

    # Every section of the job page, as read, against the API's job.
    done = mine.fine_tuning.jobs.retrieve(job.id)
    gl = done.model_extra["gridline"]
    summary = read_facts(page, "h-summary")
    assert summary["model"] == done.model and summary["training_file"] == done.training_file
    assert summary["trained_tokens"] == str(done.trained_tokens) and summary["method"] == done.method.type
    assert summary.get("fine_tuned_model") == done.fine_tuned_model  # absent when the model is not servable
    quote = listed(gl["quote"])
    page.wait_for_function("() => document.querySelector('section[aria-labelledby=h-quote] dl') !== null")
    assert read_facts(page, "h-quote") == {k: shown(v) for k, v in quote.items()}
    result = listed(gl["result"])
    assert read_facts(page, "h-result") == {k: shown(v) for k, v in result.items()}
    result_text = section_text(page, "h-result")
    adapter = gl["fine_tuned_adapter"]
    if done.fine_tuned_model:
        assert f"Model {done.fine_tuned_model}" in result_text
    else:  # registered not servable: the reason, where the model would be
        assert adapter["servable"] is False and f"Not servable: {adapter['reason']}" in result_text
    api_ckpts = list(mine.fine_tuning.jobs.checkpoints.list(job.id))
    ckpt_rows = page.locator("section[aria-labelledby=h-checkpoints] tbody tr")
    assert ckpt_rows.count() == len(api_ckpts)
    assert [ckpt_rows.nth(i).get_by_role("cell").nth(1).inner_text() for i in range(len(api_ckpts))] == \
        [c.fine_tuned_model_checkpoint for c in api_ckpts]
    assert page.locator("#events li").first.inner_text().endswith(api_events[0].message)
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-job.png"), full_page=True)

    # The jobs list: the job's row as the API has it, the not-servable reason in place of a model.
    page.goto(f"{url}/#/jobs")
    page.get_by_role("link", name=job.id).wait_for()
    cells = row_cells(page, job.id)
    assert cells[:3] == [job.id, "succeeded", done.fine_tuned_model or done.model]
    assert cells[4].startswith(f"${gl['quote']['per_token']['max_charge_usd']:.2f}")
    if not done.fine_tuned_model:
        assert cells[6] == f"Not servable: {adapter['reason']}"
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-jobs-list.png"), full_page=True)
    page.goto(f"{url}/#/jobs/{job.id}")
    page.locator('h1 [data-status="succeeded"]').wait_for()

    # Models: every row as the API lists it; the adapter downloads the same bytes as the API, and a
    # merge is started and followed.
    page.get_by_role("navigation").get_by_role("link", name="Models").click()
    api_models = list(mine.models.list())
    tuned = next(m for m in api_models if m.id == adapter["model"])
    page.get_by_text(tuned.id, exact=True).wait_for()
    cells = row_cells(page, tuned.id, "Your fine-tuned models")
    gm = tuned.model_extra["gridline"]
    assert cells[:5] == [tuned.id, gm["base"], done.id, cells[3], "yes" if gm["servable"] else f"no ({gm['reason']})"]
    for base in (m for m in api_models if not m.id.startswith("ft:")):
        gb = base.model_extra["gridline"]
        assert row_cells(page, base.id, "Bases you can fine-tune") == [base.id, gb.get("hf_repo") or "—", gb.get("licence") or "—",
                                            "yes" if gb["servable"] else "no"]
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-models.png"), full_page=True)
    with page.expect_download() as got:
        page.get_by_role("button", name="Download adapter_config.json").first.click()
    api_bytes = httpx.get(f"{people_service.base_url}/gridline/adapters/{adapter['model']}/files/adapter_config.json",
                          headers={"Authorization": f"Bearer {key}"}).content
    assert Path(got.value.path()).read_bytes() == api_bytes and got.value.suggested_filename == "adapter_config.json"
    page.get_by_role("button", name="Merge into base").click()
    page.get_by_text("Merged:").wait_for(timeout=120_000)
    page.get_by_role("navigation").get_by_role("link", name="Batches").click()
    page.get_by_text("No batches yet").wait_for()
    assert list(mine.batches.list()) == []
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-batches.png"), full_page=True)

    # Another account's job by its URL: not found, as the API answers that key.
    not_found.clear()
    page.goto(f"{url}/#/jobs/{theirs.id}")
    page.get_by_role("alert").filter(has_text="No such fine-tuning job").wait_for()

    # An unreachable API is said, and the page recovers when it answers again.
    page.goto(f"{url}/#/jobs")
    page.get_by_role("link", name=job.id).wait_for()
    page.route("**/v1/**", lambda route: route.abort())
    page.get_by_text("did not answer").wait_for()
    page.unroute("**/v1/**")
    page.locator("#banner").wait_for(state="hidden")
    problems = [p for p in problems if "ERR_FAILED" not in p]
    page.screenshot(path=str(artifacts / "dashboard-jobs.png"), full_page=True)
    # The browser logs each refused request itself, and the job page's requests for another account's
    # job may end after its alert shows (it asks for the job and its parts at once): every 404 since that
    # visit is one of them, whenever its line came.
    assert not_found and all(theirs.id in u for u in not_found), not_found
    problems = [p for p in problems if "404" not in p]
    assert page.get_by_text(theirs.id).count() == 0 and problems == []
    page.close()


def rft_prompts(pairs) -> io.BytesIO:
    """Reinforcement rows: the prompt's messages, and the label the grader reads as {{item.label}}."""
    return io.BytesIO(b"".join(json.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                           "label": label}).encode() + b"\n" for t, label in pairs))


# Two graders in one (issue 26: a `multi` job completes): the exact label, and how close the answer is to it.
MULTI = {"type": "multi", "name": "label", "calculate_output": "0.5 * exact + 0.5 * close", "graders": {
    "exact": {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.label}}",
              "operation": "eq"},
    "close": {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}", "reference": "{{item.label}}",
              "evaluation_metric": "fuzzy_match", "pass_threshold": 0.5}}}


def test_dashboard_draws_a_reinforcement_jobs_reward_curves(people_service, browser, artifacts):
    rows, held = ticket_splits()
    client = people_service.client(key := people_service.new_key())
    train = client.files.create(file=("prompts.jsonl", rft_prompts(rows[:12])), purpose="fine-tune")
    valid = client.files.create(file=("held.jsonl", rft_prompts(held[:4])), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train.id, validation_file=valid.id,
                                         seed=0, method={"type": "reinforcement", "reinforcement": {
        "grader": MULTI,
        "hyperparameters": {"batch_size": 4, "n_epochs": 1, "compute_multiplier": 0.25, "eval_interval": 1,
                            "eval_samples": 1, "max_completion_tokens": 4}}})  # fmt: skip
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    not_found = []
    page.on("response", lambda r: not_found.append(r.url) if r.status == 404 else None)
    sign_in(page, people_service.base_url.removesuffix("/v1") + "/dashboard", key)
    page.get_by_role("link", name=job.id).click()
    page.locator('h1 [data-status="succeeded"]').wait_for(timeout=300_000)
    # Chromium's own /favicon.ico request (not the page's: no response event) answers 404 and logs it.
    problems = [p for p in problems if not (p.endswith("404 (Not Found)") and not not_found)]

    # The chart against the API: a train point per step's mean reward; the validation reward before
    # training, on each checkpoint that has one, and after (the last step's, once).
    done = client.fine_tuning.jobs.retrieve(job.id)
    result = done.model_extra["gridline"]["result"]
    steps = [e.data for e in client.fine_tuning.jobs.list_events(job.id, limit=100)
             if e.type == "metrics" and "reward_mean" in (e.data or {})]
    rewards = {m["step"]: m["reward_mean"] for m in steps}
    # The multi grader's job: each step's reward per grader, and the combined one by its formula; none failed.
    assert all(set(m["grader_rewards"]) == {"exact", "close"} and m["grader_failures"] == 0 for m in steps)
    assert all(m["reward_mean"] == pytest.approx(0.5 * m["grader_rewards"]["exact"] + 0.5 * m["grader_rewards"]["close"])
               for m in steps)
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))  # newest first
    evals = {0: result["eval_reward_before"]}
    evals.update({c.step_number: c.metrics.model_extra["valid_mean_reward"] for c in reversed(checkpoints)
                  if c.metrics.model_extra.get("valid_mean_reward") is not None})
    evals[result["steps"]] = result["eval_reward"]
    assert len(rewards) == result["steps"] == 3 and sorted(evals) == [0, 1, 2, 3]  # 12 prompts, 4 a step, each step evaluated
    chart = page.locator("#reward-chart")
    page.wait_for_function("n => document.querySelector('#reward-chart').dataset.trainPoints === String(n)", arg=len(rewards))
    assert chart.get_attribute("data-eval-points") == str(len(evals))
    table = []  # (series, step, value) as the table beside the chart writes them (4 decimals; folded in a <details>)
    for row in page.locator("#reward-table tbody tr").all():
        series, step, value = row.locator("td").all_text_contents()
        assert series == row.get_attribute("data-series")
        table.append((series, int(step), pytest.approx(float(value), abs=1e-4)))
    assert table == [("train", step, v) for step, v in sorted(rewards.items())] + \
        [("eval", step, v) for step, v in sorted(evals.items())]
    # The checkpoints' validation reward column (written with toLocaleString: at most 3 decimals).
    cell = page.locator("section[aria-labelledby=h-checkpoints] tbody tr").first.get_by_role("cell").nth(3).inner_text()
    assert float(cell) == pytest.approx(checkpoints[0].metrics.model_extra["valid_mean_reward"], abs=1e-3)
    assert_sane(page)
    page.locator("section[aria-labelledby=h-reward]").screenshot(path=str(artifacts / "dashboard-reward-chart.png"))
    assert problems == [] and not_found == []
    page.close()


@ON_TICKET_MODELS
def test_the_playground_streams_a_fine_tune_beside_its_base(people_service, ticket_models, browser, artifacts):
    """Pick an ft: model and its base side by side, type a ticket, and read both answers as they
    come in; they are the SDK's answers to the same conversation, and a second turn carries the first."""
    from openft.demo_data import SYSTEM

    tuned, (ticket, _), (second, _) = ticket_models.names[0], *ticket_splits()[1][:2]
    url = people_service.base_url.removesuffix("/v1") + "/dashboard"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    sign_in(page, url, ticket_models.key)
    page.get_by_role("link", name="Playground").click()
    page.get_by_label("Model", exact=True).select_option(tuned)
    page.get_by_label("Side by side with").select_option("qwen2.5-0.5b-instruct")
    page.get_by_label("System message").fill(SYSTEM)
    page.get_by_label("Max tokens").fill("5")
    # Each piece of an answer is appended to its answer as it arrives: count them as the page adds them.
    page.evaluate("""() => { window.pieces = {}; new MutationObserver(ms => ms.forEach(m => {
        if (!m.target.classList?.contains('text')) return;
        const model = m.target.closest('.panel').dataset.model;
        const texts = [...m.addedNodes].filter(n => n.nodeType === Node.TEXT_NODE).length;
        window.pieces[model] = (window.pieces[model] ?? 0) + texts;
    })).observe(document.querySelector('.panels'), {childList: true, subtree: true}); }""")
    client = people_service.client(ticket_models.key)
    models = (tuned, "qwen2.5-0.5b-instruct")
    histories = {m: [{"role": "system", "content": SYSTEM}] for m in models}
    for turn, text in enumerate((ticket, second), start=1):
        page.get_by_label("Message", exact=True).fill(text)
        page.get_by_role("button", name="Send").click()
        for model in models:
            panel = page.locator(f'section.panel[data-model="{model}"]')
            panel.locator(".answer-status", has_text="Done:").wait_for(timeout=60_000)
            histories[model].append({"role": "user", "content": text})
            sdk = client.chat.completions.create(model=model, messages=histories[model], temperature=0, max_tokens=5)
            answer = sdk.choices[0].message.content
            histories[model].append({"role": "assistant", "content": answer})
            assert panel.locator(".turn.assistant").count() == turn
            shown_text = panel.locator(".turn.assistant .text").nth(turn - 1).inner_text()
            assert shown_text.strip() == answer.strip(), (model, turn)
            status = panel.locator(".answer-status").inner_text()
            assert f"{sdk.usage.completion_tokens} tokens answered to {sdk.usage.prompt_tokens} in the prompt" in status
    assert all(page.evaluate("window.pieces").get(m, 0) >= 2 for m in models)  # appended as they came, each turn
    assert problems == [] and "Refused" not in page.locator(".panels").inner_text()
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-playground.png"), full_page=True)


# -- evals: the list, an eval with its runs, each run's page, two runs compared (issue 25 item 6) --
EVAL_CONFIG = {"type": "custom", "include_sample_schema": True, "item_schema": {
    "type": "object", "properties": {"question": {"type": "string"}, "answer": {"type": "string"}}}}
CRITERIA = [{"type": "string_check", "name": name, "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
             "operation": op} for name, op in (("exact", "eq"), ("any_case", "ilike"))]
# Markup in an item is the account's data: the pages must show it as text.
QUESTIONS = [f"<img src=x onerror=alert(1)> question {i}" for i in range(25)]


def eval_samples(i: int, after: bool) -> str:
    """Before: right on every fourth item. After: right on all but every fifth, which it shouts
    (fails `exact`, passes `any_case`): items 0 and 20 go pass → fail, most others fail → pass."""
    if not after:
        return f"answer-{i}" if i % 4 == 0 else "no idea"
    return f"ANSWER-{i}" if i % 5 == 0 else f"answer-{i}"


def pct(x) -> str:  # dom.js pct
    return "—" if x is None else f"{x * 100:.1f}%"


def score(x) -> str:  # dom.js score
    return "—" if x is None else f"{x:.3f}"


def run_counts(c) -> str:  # views/evals.js counts
    return f"{c['passed']} passed, {c['failed']} failed, {c['errored']} errored of {c['total']}"


def table_rows(page, section: str) -> list[list[str]]:
    """The visible cells of each body row of the tables in a section."""
    return page.evaluate("""s => [...document.querySelectorAll(`section[aria-labelledby=${s}] tbody tr`)]
        .map(tr => [...tr.cells].map(td => td.innerText.trim()))""", section)


def item_row(o: dict) -> list[str]:
    """An output item's row on the run page, from the API's item."""
    text = "\n".join(m["content"] for m in o["sample"]["output"])
    grades = "\n".join(f"{r['name']}: {score(r['score'])} {'pass' if r['passed'] else 'fail'}"
                       + (f" ({r['reason']})" if r.get("reason") else "") for r in o["results"])
    return [str(o["datasource_item_id"]), o["status"], json.dumps(o["datasource_item"], separators=(",", ":"), ensure_ascii=False), text, grades]


def test_dashboard_shows_evals_their_runs_and_two_runs_compared(people_service, browser, artifacts):
    key = people_service.new_key()
    client = people_service.client(key)
    made = client.evals.create(name="capitals, shouted", data_source_config=EVAL_CONFIG, testing_criteria=CRITERIA)
    runs = []
    for name, after in (("before", False), ("after", True)):
        content = [{"item": {"question": q, "answer": f"answer-{i}"}, "sample": {"output_text": eval_samples(i, after)}}
                   for i, q in enumerate(QUESTIONS)]
        runs.append(client.evals.runs.create(made.id, name=name, data_source={
            "type": "jsonl", "source": {"type": "file_content", "content": content}}).id)

    def finished(run_id):
        run = client.evals.runs.retrieve(run_id, eval_id=made.id)
        return run if run.status in ("completed", "failed", "canceled") else None

    ended = [until(lambda r=r: finished(r), f"run {r}'s end", 120, interval=0.3) for r in runs]
    assert [r.status for r in ended] == ["completed", "completed"], [r.error for r in ended]
    api_runs = [r.model_dump() for r in ended]
    api_items = [[o.model_dump() for o in client.evals.runs.output_items.list(r, eval_id=made.id, limit=100)] for r in runs]
    cmp = client.get(f"/gridline/evals/{made.id}/compare", cast_to=object,
                     options={"params": {"run_id": runs[0], "other_run_id": runs[1]}})
    assert [c["datasource_item_id"] for c in cmp["changed"]][:3] == [0, 1, 2]  # the data changes what it should

    url = people_service.base_url.removesuffix("/v1") + "/dashboard"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []  # script errors, CSP violations, failed requests; an item's markup run as script opens a dialog
    # Chromium asks the server's root for /favicon.ico, which the page never names: its 404 is not the page's.
    page.on("console", lambda m: problems.append(m.text)
            if m.type == "error" and not m.location["url"].endswith("/favicon.ico") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("dialog", lambda d: problems.append(f"a dialog opened: {d.message}"))
    theirs = people_service.client(people_service.new_key()).evals.create(
        name="theirs", data_source_config=EVAL_CONFIG, testing_criteria=CRITERIA[:1])
    sign_in(page, url, key)
    page.get_by_role("navigation").get_by_role("link", name="Evals").click()
    page.get_by_role("link", name=made.id).wait_for()
    when = page.evaluate("t => new Date(t * 1000).toLocaleString()", made.created_at)
    assert row_cells(page, made.id, "Your evals") == [made.id, made.name, "2", when]
    assert page.locator("main tbody tr").count() == 1 and page.get_by_text(theirs.id).count() == 0
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-evals.png"), full_page=True)

    # The eval: its facts, criteria, and runs (newest first) as the API has them.
    page.get_by_role("link", name=made.id).click()
    page.get_by_role("link", name=runs[0]).wait_for()
    assert read_facts(page, "h-summary")["name"] == made.name
    assert table_rows(page, "h-criteria") == [[c["name"], "string_check", f"{{{{sample.output_text}}}} {c['operation']} "
                                               "{{item.answer}}"] for c in CRITERIA]
    runs_shown = table_rows(page, "h-runs")
    assert [r[:5] for r in runs_shown] == [[r["id"], r["name"], "completed", "— (jsonl: samples given)",
                                            run_counts(r["result_counts"])] for r in reversed(api_runs)]
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-eval.png"), full_page=True)

    # Each run's page: every section against the run, every output item against the API's, a page at a time.
    for run, items in zip(api_runs, api_items):
        page.goto(f"{url}/#/evals/{made.id}/runs/{run['id']}")  # the run's report_url
        assert run["report_url"].endswith(f"/dashboard/#/evals/{made.id}/runs/{run['id']}")
        # A hash change keeps the document: wait for this run's heading, not the last page's.
        page.locator("h1", has_text=f"Run {run['name']} ").locator('[data-status="completed"]').wait_for()
        page.locator("section[aria-labelledby=h-items] tbody tr").first.wait_for()
        assert read_facts(page, "h-results") == {k: str(v) for k, v in run["result_counts"].items()}
        assert table_rows(page, "h-criteria") == [[c["testing_criteria"], str(c["passed"]), str(c["failed"]),
                                                   pct(c["passed"] / (c["passed"] + c["failed"]))]
                                                  for c in run["per_testing_criteria_results"]]
        assert run["per_model_usage"] == [] and "No model calls" in section_text(page, "h-usage")
        assert table_rows(page, "h-items") == [item_row(o) for o in items[:20]]
        assert "Items 1–20" in section_text(page, "h-items") and "<img src=x" in section_text(page, "h-items")
        assert page.locator("main img").count() == 0
        assert_sane(page)
        page.screenshot(path=str(artifacts / f"dashboard-eval-run-{run['name']}.png"), full_page=True)
        page.get_by_role("button", name="Next items").click()
        page.get_by_text("Items 21–25").wait_for()
        assert table_rows(page, "h-items") == [item_row(o) for o in items[20:]]
        assert page.get_by_role("button", name="Next items").is_disabled()
        page.get_by_role("button", name="Previous items").click()
        page.get_by_text("Items 1–20").wait_for()

    # Pick the two runs on the eval's page and open the comparison.
    page.goto(f"{url}/#/evals/{made.id}")
    page.get_by_label("Before", exact=True).select_option(runs[0])
    page.get_by_label("After", exact=True).select_option(runs[1])
    page.get_by_role("button", name="Compare the two runs").click()
    page.wait_for_url(f"**/#/evals/{made.id}/compare/{runs[0]}/{runs[1]}")
    page.locator("section[aria-labelledby=h-changed] tbody tr").first.wait_for()
    assert table_rows(page, "h-runs") == [[side, r["id"], "— (samples given)", r["status"], run_counts(r["result_counts"])]
                                         for side, r in zip(("before", "after"), cmp["runs"])]
    a, b = (r["criteria"] for r in cmp["runs"])
    change = lambda x, y: f"{'+' if y >= x else '−'}{abs(y - x) * 100:.1f} pts"  # noqa: E731
    assert table_rows(page, "h-criteria") == [
        [ca["name"], pct(ca["pass_rate"]), pct(cb["pass_rate"]), change(ca["pass_rate"], cb["pass_rate"]),
         score(ca["mean_score"]), score(cb["mean_score"]), f"{ca['graded']} / {cb['graded']}"] for ca, cb in zip(a, b)]
    assert section_text(page, "h-usage").count("No model calls") == 2
    grade = lambda g: f"{score(g['score'])} {'pass' if g['passed'] else 'fail'}"  # noqa: E731
    assert table_rows(page, "h-changed") == [
        [str(c["datasource_item_id"]), c["before"], c["after"],
         "\n".join(f"{n}: {grade(g['before'])} → {grade(g['after'])}" for n, g in c["criteria"].items()),
         json.dumps(c["datasource_item"], separators=(",", ":"), ensure_ascii=False)] for c in cmp["changed"]]
    assert f"{len(cmp['changed'])} of the items both runs graded changed." in section_text(page, "h-changed")
    assert_sane(page)
    page.screenshot(path=str(artifacts / "dashboard-eval-compare.png"), full_page=True)

    # Another account's eval by its URL: not found, as the API answers this key.
    page.goto(f"{url}/#/evals/{theirs.id}")
    page.get_by_role("alert").filter(has_text="Not found").wait_for()
    assert page.get_by_text("theirs").count() == 0
    assert [p for p in problems if "404" not in p] == []  # the browser logs the refused request itself
    page.close()
