"""Promptfoo (the npm package OpenAI points its Evals users to; tests/e2e/promptfoo/package.json pins
it, `make test-e2e` installs it with `npm ci`) runs an evaluation written as for OpenAI, its OpenAI
provider's base URL set to the suite's `openft serve`: equality assertions over the held-out tickets,
against a fine-tune of the ticket task and against its base. The fine-tune passes them, the base
does not. Promptfoo's own results file is read back, and its answers are the SDK's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from openft.demo_data import SYSTEM, ticket_splits
from tests.e2e.conftest import ON_TICKET_MODELS, TICKET_BASE

pytestmark = [pytest.mark.e2e, ON_TICKET_MODELS]

PROMPTFOO = Path(__file__).resolve().parent / "promptfoo" / "node_modules" / ".bin" / "promptfoo"
# The prompt as chat messages; `dump` writes the ticket as a JSON string.
PROMPT = json.dumps([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "TICKET"}]).replace(
    '"TICKET"', "{{ ticket | dump }}")


def config(base_url: str, key: str, tuned: str) -> dict:
    def provider(model: str, label: str) -> dict:
        return {"id": f"openai:chat:{model}", "label": label,
                "config": {"apiBaseUrl": base_url, "apiKey": key, "temperature": 0, "max_tokens": 5}}

    _, held_out = ticket_splits()
    return {
        "description": "held-out support tickets, one label word each",
        "prompts": [PROMPT],
        "providers": [provider(tuned, "fine-tune"), provider(TICKET_BASE, "base")],
        "tests": [{"vars": {"ticket": ticket}, "assert": [{"type": "equals", "value": label}]} for ticket, label in held_out],
    }


def test_promptfoo_equality_assertions_pass_on_the_fine_tune_and_fail_on_its_base(people_service, ticket_models, tmp_path, artifacts):
    assert PROMPTFOO.exists(), "run `npm ci` in tests/e2e/promptfoo (make test-e2e does)"
    tuned = ticket_models.names[0]
    (tmp_path / "promptfooconfig.json").write_text(json.dumps(config(people_service.base_url, ticket_models.key, tuned)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PROMPTFOO_"))}
    env.update(PROMPTFOO_CONFIG_DIR=str(tmp_path / "home"), PROMPTFOO_DISABLE_TELEMETRY="1",
               PROMPTFOO_DISABLE_UPDATE="1", PROMPTFOO_DISABLE_SHARING="1", NO_COLOR="1")  # fmt: skip
    run = subprocess.run([str(PROMPTFOO), "eval", "-c", "promptfooconfig.json", "-o", "results.json", "--no-cache",
                          "--no-progress-bar", "--max-concurrency", "4"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    (artifacts / "promptfoo.txt").write_text(run.stdout + run.stderr)
    # Promptfoo exits 100 when an assertion failed (the base's, by design), 0 when none did.
    assert run.returncode in (0, 100), run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["results"]["results"]
    _, held_out = ticket_splits()
    by = {label: [r for r in rows if r["provider"]["label"] == label] for label in ("fine-tune", "base")}
    assert [len(by[label]) for label in by] == [len(held_out)] * 2
    passed = {label: sum(r["success"] for r in rows_) for label, rows_ in by.items()}
    assert passed["fine-tune"] >= 0.9 * len(held_out), passed
    assert passed["base"] <= 0.1 * len(held_out), passed
    # Every row was answered by the service (no provider error), and as the SDK answers it.
    assert not [r for rows_ in by.values() for r in rows_ if (r.get("response") or {}).get("error")]
    client = people_service.client(ticket_models.key)
    for r in by["fine-tune"][:5]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["vars"]["ticket"]}]
        sdk = client.chat.completions.create(model=tuned, messages=messages, temperature=0, max_tokens=5)
        assert r["response"]["output"] == sdk.choices[0].message.content
