"""The user CLI's parsing and formatting (entrypoints/user_cli.py, user_jobs.py), the Range parsing
of the download routes (serve_app/downloads.py), and issue 16's data-dir rule for the operator
commands, run as processes. The CLI against a running service, in a real terminal: tests/e2e/test_cli.py."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from entrypoints import user_cli, user_jobs
from entrypoints._progress import LiveLine
from openft.errors import RangeNotSatisfiable
from serve_app.downloads import ByteRange
from storage.api_keys import lookup
from storage.db import Database

OPENFT = [sys.executable, "-m", "entrypoints.cli"]


def _parse(*argv: str):
    """Parse as `openft` does: the user commands are added to its subcommands by the same call."""
    parser = argparse.ArgumentParser(prog="openft")
    user_cli.add_user_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def test_jobs_create_flags_become_the_apis_parameters():
    args = _parse("jobs", "create", "--model", "qwen2.5-0.5b-instruct", "--training-file", "file-a",
                  "--suffix", "s1", "--method", "qlora", "--hyperparameters", "n_epochs=1", "batch_size=auto",
                  "learning_rate_multiplier=0.5", "--follow", "--json", "--base-url", "http://h/v1")  # fmt: skip
    assert args.follow and args.json and args.base_url == "http://h/v1"
    assert user_jobs.create_params(args) == {
        "model": "qwen2.5-0.5b-instruct", "training_file": "file-a", "suffix": "s1", "method": "qlora",
        "hyperparameters": {"n_epochs": 1, "batch_size": "auto", "learning_rate_multiplier": 0.5},
    }
    obj = _parse("jobs", "create", "--model", "m", "--training-file", "f", "--method",
                 '{"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}')
    assert user_jobs.create_params(obj)["method"] == {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}
    with pytest.raises(SystemExit, match="key=value"):
        user_jobs.parse_pairs(["n_epochs"], "--hyperparameters")


def test_every_user_command_parses():
    for argv in (["files", "upload", "x.jsonl"], ["files", "list"], ["jobs", "list"], ["jobs", "show", "j", "--follow"],
                 ["jobs", "events", "j"], ["jobs", "cancel", "j"], ["jobs", "pause", "j"], ["jobs", "resume", "j"],
                 ["models", "list"], ["models", "download", "ft:m", "--dir", "d"], ["merges", "create", "ft:m"],
                 ["merges", "status", "ft:m"], ["merges", "download", "ft:m"], ["batches", "create", "--input-file", "f"],
                 ["batches", "list"], ["batches", "show", "b"], ["batches", "cancel", "b"]):  # fmt: skip
        assert callable(_parse(*argv).func), argv
    assert _parse("files", "upload", "x.jsonl").purpose == "fine-tune"


def _job(**fields):
    base = dict(id="ftjob-1", status="running", model="m", user_provided_suffix=None, trained_tokens=None,
                fine_tuned_model=None, error=None, estimated_finish=None, model_extra={"gridline": {}})  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def test_the_live_line_shows_step_loss_speed_and_eta():
    metrics = {"step": 10, "total_steps": 25, "train_loss": 1.23456, "tokens_per_second": 812.4}
    line = user_jobs.progress_line(_job(estimated_finish=1_000 + 75), metrics, now=1_000)
    assert line == "running  step 10/25  loss 1.2346  812 tok/s  ETA 1:15"
    waiting = _job(status="queued", model_extra={"gridline": {"reason": "account_capacity"}})
    assert user_jobs.progress_line(waiting, None, now=0) == "queued  waiting: account_capacity"
    assert user_jobs._duration(3725) == "1:02:05"


def test_the_live_line_redraws_in_place_only_on_change():
    out = io.StringIO()
    live = LiveLine(out)
    for text in ("queued", "queued", "running  step 1/2", "x" * 500):
        live.update(text)
    live.close()
    assert live.updates == 3
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\x1b[K\n")
    assert "x" * 500 not in out.getvalue()  # cut to the terminal's width, never wrapped


def test_a_finished_job_names_its_model_and_tokens_and_a_failed_one_its_code():
    done = _job(status="succeeded", trained_tokens=1234, fine_tuned_model="ft:m:org:abc")
    assert user_jobs.describe_job(done).splitlines()[1:] == ["  trained tokens 1234", "  model ft:m:org:abc"]
    failed = _job(status="failed", error=SimpleNamespace(code="training_failed", param=None, message="Retry."))
    assert user_jobs.describe_job(failed).splitlines()[-1] == "  error training_failed: Retry."


def test_api_errors_print_status_code_param_and_line():
    exc = SimpleNamespace(status_code=400, code="invalid_messages", message="m",
                          body={"code": "invalid_messages", "param": "file", "line": 3, "message": "line 3: bad"})
    assert user_jobs.describe_api_error(exc) == "400 invalid_messages (param file, line 3): line 3: bad"


@pytest.mark.parametrize("header, size, span", [
    ("bytes=10-", 100, (10, 100)), ("bytes=0-9", 100, (0, 10)), ("bytes=90-500", 100, (90, 100)),
    ("bytes=-30", 100, (70, 100)), ("bytes=-300", 100, (0, 100)),
])  # fmt: skip
def test_a_single_byte_range_resolves_to_its_span(header, size, span):
    assert ByteRange.parse(header).span(size) == span


@pytest.mark.parametrize("header", [None, "", "bytes=0-1,5-6", "items=0-1", "bytes=9-3", "bytes=-", "bytes=a-"])
def test_ranges_this_server_does_not_serve_are_ignored(header):
    assert ByteRange.parse(header) is None


def test_a_range_past_the_end_is_416_with_the_size():
    with pytest.raises(RangeNotSatisfiable) as info:
        ByteRange.parse("bytes=100-").span(100)
    assert (info.value.status, info.value.code, info.value.param) == (416, "range_not_satisfiable", "range")
    assert info.value.headers == {"content-range": "bytes */100"}


def _create(cwd: Path, *extra: str, env_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENFT_", "RAY_"))}
    if env_dir is not None:
        env["OPENFT_DATA_DIR"] = str(env_dir)
    return subprocess.run([*OPENFT, "accounts", "create", f"a{len(extra)}{env_dir is not None}", *extra], cwd=cwd,
                          env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip


def _key_works_in(data_dir: Path, key: str) -> bool:
    db = Database(f"sqlite:///{data_dir / 'openft.db'}")
    try:
        with db.session() as session:
            return lookup(session, key) is not None
    finally:
        db.dispose()


def test_operator_commands_name_the_data_dir_they_use(tmp_path: Path):
    """--data-dir, else OPENFT_DATA_DIR, else ./.openft: each named on stderr, the key still the
    last stdout line, and the account in that dir's database and no other."""
    flag, env_dir = tmp_path / "flag", tmp_path / "env"
    cases = [((), None, tmp_path / ".openft", "default"), (("--data-dir", str(flag)), env_dir, flag, "--data-dir"),
             ((), env_dir, env_dir, "OPENFT_DATA_DIR")]  # fmt: skip
    keys = {}
    for extra, env, used, source in cases:
        done = _create(tmp_path, *extra, env_dir=env)
        assert f"openft: data dir {used} (from {source})" in done.stderr.splitlines()
        keys[used] = done.stdout.strip().splitlines()[-1]
        assert keys[used].startswith("sk-openft-")
    for used, key in keys.items():
        assert [d for d in keys if _key_works_in(d, key)] == [used]


def test_before_the_first_step_the_live_line_shows_the_newest_message():
    line = user_jobs.progress_line(_job(), None, now=0, message="Tokenizing the training file.")
    assert line == "running  Tokenizing the training file."
    assert user_jobs.progress_line(_job(status="succeeded"), None, now=0, message="Job succeeded.") == "succeeded"


def test_the_upload_bar_follows_the_bytes_read_and_closes_once_all_are_sent(tmp_path, capsys):
    from tqdm import tqdm

    from entrypoints._progress import ReadProgress

    path = tmp_path / "f.jsonl"
    path.write_bytes(b"x" * 10_000)
    bar = tqdm(total=10_000, file=io.StringIO())
    with path.open("rb") as fh:
        reader = ReadProgress(fh, bar)
        reader.seek(0)
        assert reader.read(4096) and bar.n == 4096 and not bar.disable
        reader.seek(0)  # sent again from the start: the bar goes back
        assert bar.n == 0
        while reader.read(4096):
            pass
    assert bar.n == 10_000 and bar.disable is True
    assert capsys.readouterr().err == "sent; the server is validating it\n"


def test_without_a_base_url_nothing_is_sent_anywhere(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(SystemExit, match="set OPENAI_BASE_URL or pass --base-url"):
        user_jobs.api_client(_parse("jobs", "list", "--api-key", "sk-x"))
    assert str(user_jobs.api_client(_parse("jobs", "list", "--api-key", "sk-x", "--base-url", "http://h:1/v1")).base_url) == "http://h:1/v1/"


def test_a_job_whose_model_is_not_servable_prints_no_model_name_and_bases_no_none():
    adapter = {"model": "ft:m:org:abc", "servable": False, "reason": "Serving-parity check parity_end_of_turn: ..."}
    done = _job(status="succeeded", trained_tokens=10, model_extra={"gridline": {"fine_tuned_adapter": adapter}})
    lines = user_jobs.describe_job(done).splitlines()
    assert not any(line.startswith("  model") for line in lines)
    assert lines[2] == "  not servable: Serving-parity check parity_end_of_turn: ..."
    assert "download only" in lines[3]
    from entrypoints.user_cli import _model_line

    base = SimpleNamespace(id="gpt-oss-20b", owned_by="openft", model_extra={"gridline": {"servable": False}})
    assert _model_line(base) == "gpt-oss-20b  openft  not servable"
    why = SimpleNamespace(id="b", owned_by="o", model_extra={"gridline": {"servable": False, "reason": "Download it."}})
    assert _model_line(why) == "b  o  not servable (Download it.)"
