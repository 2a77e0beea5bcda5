"""The user CLI (`openft files|jobs|models ...`) in a real terminal (a pty of 120 x 30, through
pexpect), configured as a user configures the SDK (OPENAI_BASE_URL, OPENAI_API_KEY), against the
suite's `openft serve`: an upload's progress bar and validation result, a refused upload's line and
code, one tiny stand-in job followed live to its `ft:` name, its adapter downloaded, resumed from a
truncated .part and verified, a corrupt .part refused, another account that sees none of it, and
the model's merged weights made and downloaded.
Each command's transcript is kept in build/e2e/cli-*.txt."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import httpx
import pexpect
import pytest

from tests.e2e.conftest import ON_TICKET_MODELS
from tests.factories import chat_row, jsonl

pytestmark = pytest.mark.e2e

# batch_size 1: a metrics report every 10 steps (train/progress.py MetricsClock); a stand-in base
# trained some 90 steps a second on the 2-core dev machine, so that 380 steps (20 rows are held out)
# last long enough for the once-a-second poll to see several reports; a much faster machine could
# need more rows
ROWS = 400
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Terminal:
    def __init__(self, people_service, key: str, artifacts: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENFT_", "RAY_"))}
        self.env.update(OPENAI_BASE_URL=people_service.base_url, OPENAI_API_KEY=key, TERM="xterm")
        self.artifacts = artifacts

    def run(self, name: str, *argv: str, timeout: float = 120, cwd: Path | None = None) -> tuple[int, str]:
        """(exit status, everything the terminal showed) of `openft argv...`."""
        child = pexpect.spawn(sys.executable, ["-m", "entrypoints.cli", *argv], env=self.env, cwd=cwd,
                              dimensions=(30, 120), encoding="utf-8", timeout=timeout)  # fmt: skip
        child.expect(pexpect.EOF)
        child.close()
        (self.artifacts / f"cli-{name}.txt").write_text(child.before)
        return child.exitstatus, child.before


@pytest.fixture(scope="module")
def terminals(people_service, artifacts):
    return Terminal(people_service, people_service.new_key(), artifacts), Terminal(people_service, people_service.new_key(), artifacts)


def test_upload_follow_download_resume_in_a_terminal(terminals, tmp_path, people_service):
    me, other = terminals
    rows = [chat_row(f"Ticket {i}: where is parcel {i}?", f"It is in depot {i % 3}.") for i in range(ROWS)]
    good = tmp_path / "train.jsonl"
    good.write_bytes(jsonl(rows))
    status, out = me.run("upload", "files", "upload", str(good))
    assert status == 0, out
    assert re.search(r"upload train\.jsonl: 100%\|█+\| ([\d.]+k)/\1 ", out), out
    assert "sent; the server is validating it" in out
    file_id = re.search(r"^(file-[0-9a-f]+)  train\.jsonl  fine-tune  processed", out, re.M).group(1)
    assert f"{ROWS} rows (chat), {ROWS * 3} messages" in out

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([*rows[:2], {"messages": [{"role": "user", "content": "SECRET-ROW"}]}, *rows[3:]]))
    status, out = me.run("upload-refused", "files", "upload", str(bad))
    assert status == 1 and "openft: 400 invalid_messages (param file): line 3: " in out, out
    assert "SECRET-ROW" not in out

    status, out = me.run("follow", "jobs", "create", "--model", "qwen2.5-0.5b-instruct", "--training-file", file_id,
                         "--hyperparameters", "n_epochs=1", "batch_size=1", "--follow", timeout=600)  # fmt: skip
    assert status == 0, out
    screens = [ANSI.sub("", s).strip() for s in out.split("\r")]
    steps = list(dict.fromkeys(s for s in screens if re.match(r"running  step \d+/\d+  loss \d+\.\d{4}  \d+ tok/s", s)))
    assert len(steps) >= 2, screens  # distinct live updates, each redrawn over the last
    assert len({s.split("  ")[1] for s in steps}) >= 2, steps  # the step itself moved
    job_id, result = re.search(r"^(ftjob-[0-9a-f]+)  succeeded  qwen2\.5-0\.5b-instruct\s*$(.*)", out, re.M | re.S).groups()
    tokens = int(re.search(r"trained tokens (\d+)", result).group(1))
    model = re.search(r"model (ft:qwen2\.5-0\.5b-instruct:\S+)", result).group(1)
    assert tokens > 0 and model.endswith(":" + job_id.removeprefix("ftjob-")[:12])
    client = people_service.client(me.env["OPENAI_API_KEY"])
    reported = {e.data["step"]: e.data for e in client.fine_tuning.jobs.list_events(job_id, limit=100)
                if e.type == "metrics" and e.data and "step" in e.data}  # fmt: skip
    for shown in steps:  # each live line is one of the job's metrics events, as the API lists it
        step, loss = re.match(r"running  step (\d+)/\d+  loss (\S+)", shown).groups()
        assert f"{reported[int(step)]['train_loss']:.4f}" == loss
    assert client.fine_tuning.jobs.retrieve(job_id).trained_tokens == tokens

    target = tmp_path / "adapter"
    status, out = me.run("download", "models", "download", model, "--dir", str(target))
    assert status == 0, out
    published = {}
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        with httpx.Client() as http:  # what the API publishes, read here without the CLI
            r = http.get(f"{people_service.base_url}/gridline/adapters/{model}/files/{name}",
                         headers={"Authorization": f"Bearer {me.env['OPENAI_API_KEY']}"}, timeout=60)  # fmt: skip
        published[name] = r.headers["x-gridline-sha256"]
        assert hashlib.sha256((target / name).read_bytes()).hexdigest() == published[name] == hashlib.sha256(r.content).hexdigest()
        assert f"{target / name}  sha256 {published[name]}  verified" in out

    weights = target / "adapter_model.safetensors"
    whole = weights.read_bytes()
    weights.unlink()
    part = target / "adapter_model.safetensors.part"
    part.write_bytes(whole[: len(whole) // 2])  # an interrupted download
    status, out = me.run("resume", "models", "download", model, "--dir", str(target))
    assert status == 0 and f"resuming adapter_model.safetensors at byte {len(whole) // 2}" in out, out
    assert weights.read_bytes() == whole and not part.exists()

    weights.unlink()
    part.write_bytes(b"\0" * (len(whole) // 3))  # not a prefix of the file: the digest fails
    status, out = me.run("corrupt", "models", "download", model, "--dir", str(target))
    assert status == 1 and "does not match the published" in ANSI.sub("", out).replace("\r\n", " "), out
    assert not part.exists() and not weights.exists()

    status, out = me.run("list", "jobs", "list")
    assert status == 0 and f"{job_id}  succeeded" in out
    status, out = other.run("list-other", "jobs", "list")
    assert status == 0 and job_id not in out and "no jobs" in out
    status, out = other.run("show-other", "jobs", "show", job_id)
    assert status == 1 and "openft: 404 not_found" in out
    status, out = me.run("cancel-ended", "jobs", "cancel", job_id)
    assert status == 1 and "openft: 409 invalid_state" in out, out

    # Merged weights: the merge runs on the service's controller; each file comes through its
    # redirect and is checked against the digest the merge's status lists.
    status, out = me.run("merge-create", "merges", "create", model)
    assert status == 0 and re.search(rf"^{re.escape(model)}  merge (queued|running|succeeded)", out, re.M), out
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status, out = me.run("merge-status", "merges", "status", model, "--json")
        merge = json.loads(out[out.index("{"):])
        if merge["status"] not in ("queued", "running"):
            break
        time.sleep(2)
    assert merge["status"] == "succeeded", merge
    merged = tmp_path / "merged"
    status, out = me.run("merge-download", "merges", "download", model, "--dir", str(merged))
    assert status == 0, out
    for f in merge["files"]:
        assert hashlib.sha256((merged / f["path"]).read_bytes()).hexdigest() == f["sha256"]
        assert f"{merged / f['path']}  sha256 {f['sha256']}  verified" in out


@ON_TICKET_MODELS
def test_openft_chat_streams_a_conversation_in_a_terminal(people_service, ticket_models, artifacts):
    """`openft chat MODEL` in a real terminal: each answer is the SDK's to the same conversation, a
    refused turn is said and dropped while the chat goes on, and an unknown model ends it with status 1."""
    from openft.demo_data import SYSTEM, ticket_splits

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OPENFT_", "RAY_"))}
    env.update(OPENAI_BASE_URL=people_service.base_url, OPENAI_API_KEY=ticket_models.key, TERM="xterm")
    tuned = ticket_models.names[0]
    child = pexpect.spawn(sys.executable, ["-m", "entrypoints.cli", "chat", tuned, "--system", SYSTEM, "--max-tokens", "5",
                                           "--temperature", "0"], env=env, dimensions=(30, 120), encoding="utf-8", timeout=120)  # fmt: skip
    transcript = []
    child.logfile_read = _Collect(transcript)
    child.expect_exact("you> ")
    client = people_service.client(ticket_models.key)
    history = [{"role": "system", "content": SYSTEM}]
    for ticket, _ in ticket_splits()[1][:2]:
        child.sendline(ticket)
        child.expect_exact("you> ")
        shown = ANSI.sub("", child.before).replace("\r", "")
        history.append({"role": "user", "content": ticket})
        answer = client.chat.completions.create(model=tuned, messages=history, temperature=0, max_tokens=5)
        text = answer.choices[0].message.content
        history.append({"role": "assistant", "content": text})
        assert f"{tuned}> {text}" in shown, shown
    child.sendline("/reset")
    child.expect_exact("(conversation reset)")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    (artifacts / "cli-chat.txt").write_text("".join(transcript))

    # max_tokens past what the context leaves: each turn is refused and said, and the chat goes on.
    child = pexpect.spawn(sys.executable, ["-m", "entrypoints.cli", "chat", tuned, "--max-tokens", "4000"], env=env,
                          dimensions=(30, 120), encoding="utf-8", timeout=120)  # fmt: skip
    for _ in range(2):
        child.expect_exact("you> ")
        child.sendline(ticket_splits()[1][0][0])
        child.expect_exact("openft: 400 context_length_exceeded (param messages): ")
    child.expect_exact("you> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    child = pexpect.spawn(sys.executable, ["-m", "entrypoints.cli", "chat", "ft:nobody:x:y"], env=env, dimensions=(30, 120),
                          encoding="utf-8", timeout=120)  # fmt: skip
    child.expect_exact("you> ")
    child.sendline("hello")
    child.expect(pexpect.EOF)
    child.close()
    shown = ANSI.sub("", child.before).replace("\r\n", " ")
    assert child.exitstatus == 1 and "openft: 404 model_not_found (param model): " in shown, shown


class _Collect:
    def __init__(self, into: list):
        self.into = into

    def write(self, data: str) -> None:
        self.into.append(data)

    def flush(self) -> None:
        pass
