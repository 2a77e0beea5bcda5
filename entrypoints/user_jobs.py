"""`openft jobs ...` (entrypoints/user_cli.py registers it), and what every user command shares: the
SDK client from flags or `OPENAI_*`, output (human or `--json`), and one way to print API errors.

`--follow` polls the job and its newest metrics event once a second and redraws one live line
(status, step, loss, tokens/s, ETA from the job's `estimated_finish`) until the job ends; the exit
status is 1 unless it succeeded."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ENDED = ("succeeded", "failed", "cancelled")
FOLLOW_POLL_S = 1.0


def api_client(args: argparse.Namespace, **options):
    """The SDK reads OPENAI_BASE_URL and OPENAI_API_KEY itself where a flag is not given; without a
    base URL it would send the key to api.openai.com, so none at all is an error here."""
    import openai

    if not (args.base_url or os.environ.get("OPENAI_BASE_URL")):
        raise SystemExit("openft: no API base URL: set OPENAI_BASE_URL or pass --base-url (e.g. http://127.0.0.1:8000/v1)")
    return openai.OpenAI(base_url=args.base_url, api_key=args.api_key, **options)


def emit(args: argparse.Namespace, obj, human) -> int:
    if args.json:
        print(obj.model_dump_json(indent=2) if hasattr(obj, "model_dump_json") else json.dumps(obj, indent=2))
    else:
        print(human(obj))
    return 0


def describe_api_error(exc) -> str:
    """`status code (param, line): message`, from the API's error envelope (openai-python keeps its
    `error` object as `body`); the messages name lines and fields, never rows."""
    body = exc.body if isinstance(exc.body, dict) else {}
    where = ", ".join(f"{k} {body[k]}" for k in ("param", "line") if body.get(k) is not None)
    code = body.get("code") or getattr(exc, "code", None) or "error"
    return f"{exc.status_code} {code}" + (f" ({where})" if where else "") + f": {body.get('message') or exc.message}"


def run_user_command(func, args: argparse.Namespace) -> int:
    import httpx
    import openai

    from entrypoints._download import DigestMismatch

    try:
        return func(args)
    except openai.APIStatusError as exc:
        print(f"openft: {describe_api_error(exc)}", file=sys.stderr)
    except openai.APIConnectionError as exc:
        print(f"openft: cannot reach the API: {exc.message} (base URL from --base-url or OPENAI_BASE_URL)",
              file=sys.stderr)  # fmt: skip
    except httpx.HTTPError as exc:  # a download's connection (the SDK's calls raise APIConnectionError)
        print(f"openft: download failed: {type(exc).__name__}: {exc}; run it again to resume", file=sys.stderr)
    except (openai.OpenAIError, DigestMismatch, OSError) as exc:  # no API key; a checksum; a local file
        print(f"openft: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nopenft: interrupted", file=sys.stderr)
        return 130
    return 1


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_line(job, metrics: dict | None, now: float, message: str | None = None) -> str:
    """The live line: status, then the newest metrics report's step, loss and tokens/s (before the
    first one, the newest event's message: the stage the job is in), and the ETA."""
    parts = [job.status]
    reason = ((job.model_extra or {}).get("gridline") or {}).get("reason")
    if reason and job.status in ("queued", "validating_files"):
        parts.append(f"waiting: {reason}")
    if metrics:
        parts.append(f"step {metrics['step']}/{metrics.get('total_steps', '?')}")
        if metrics.get("train_loss") is not None:
            parts.append(f"loss {metrics['train_loss']:.4f}")
        if metrics.get("tokens_per_second") is not None:
            parts.append(f"{metrics['tokens_per_second']:.0f} tok/s")
    elif message and job.status not in ENDED:
        parts.append(message)
    if job.status == "running" and job.estimated_finish:
        parts.append(f"ETA {_duration(job.estimated_finish - now)}")
    return "  ".join(parts)


def newest_events(client, job_id: str) -> tuple[dict | None, str | None]:
    """(the newest step report, the newest message) among the job's latest events (newest first)."""
    metrics = message = None
    for event in client.fine_tuning.jobs.list_events(job_id, limit=20).data:
        if metrics is None and event.type == "metrics" and event.data and "step" in event.data:
            metrics = event.data
        if message is None and event.type == "message":
            message = event.message
    return metrics, message


def describe_job(job) -> str:
    line = f"{job.id}  {job.status}  {job.model}"
    if job.user_provided_suffix:
        line += f"  suffix {job.user_provided_suffix}"
    lines = [line]
    if job.trained_tokens is not None:
        lines.append(f"  trained tokens {job.trained_tokens}")
    adapter = ((job.model_extra or {}).get("gridline") or {}).get("fine_tuned_adapter") or {}
    if job.fine_tuned_model:
        lines.append(f"  model {job.fine_tuned_model}")
    elif adapter.get("servable") is False:
        # Registered, downloadable, but no model to run: the name would read as one that answers.
        lines.append(f"  not servable: {adapter.get('reason') or 'no reason recorded'}")
        lines.append(f"  adapter {adapter['model']} (download only: openft models download {adapter['model']})")
    if job.error and job.error.code:
        lines.append(f"  error {job.error.code}" + (f" ({job.error.param})" if job.error.param else "") +
                     f": {job.error.message}")  # fmt: skip
    return "\n".join(lines)


def follow(args: argparse.Namespace, client, job) -> int:
    from entrypoints._progress import LiveLine

    live = LiveLine()
    try:
        while True:
            if not args.json:
                metrics, message = newest_events(client, job.id)
                live.update(progress_line(job, metrics, time.time(), message))
            if job.status in ENDED:
                break
            time.sleep(FOLLOW_POLL_S)
            job = client.fine_tuning.jobs.retrieve(job.id)
    finally:
        live.close()
    emit(args, job, describe_job)
    return 0 if job.status == "succeeded" else 1


def _value(text: str):
    """`n_epochs=1` -> 1, `learning_rate_multiplier=0.5` -> 0.5, `batch_size=auto` -> "auto"."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_pairs(pairs: list[str], flag: str) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"openft: {flag} takes key=value pairs, not {pair!r}")
        out[key] = _value(value)
    return out


def parse_method(text: str | None):
    """A method as the API takes it: a string (`lora`, `qlora`) or a JSON object."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise SystemExit("openft: --method is a name (lora, qlora) or a JSON object") from None


def create_params(args: argparse.Namespace) -> dict:
    params = {"model": args.model, "training_file": args.training_file}
    for key in ("validation_file", "suffix", "seed"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    if args.method is not None:
        params["method"] = parse_method(args.method)
    if args.hyperparameters:
        params["hyperparameters"] = parse_pairs(args.hyperparameters, "--hyperparameters")
    if args.metadata:
        params["metadata"] = {k: str(v) for k, v in parse_pairs(args.metadata, "--metadata").items()}
    return params


def cmd_jobs_create(args: argparse.Namespace) -> int:
    client = api_client(args)
    job = client.fine_tuning.jobs.create(**create_params(args))
    return follow(args, client, job) if args.follow else emit(args, job, describe_job)


def cmd_jobs_show(args: argparse.Namespace) -> int:
    client = api_client(args)
    job = client.fine_tuning.jobs.retrieve(args.job_id)
    return follow(args, client, job) if args.follow else emit(args, job, describe_job)


def cmd_jobs_list(args: argparse.Namespace) -> int:
    page = api_client(args).fine_tuning.jobs.list(limit=args.limit)
    return emit(args, page, lambda p: "\n".join(describe_job(j).splitlines()[0] for j in p.data) or "no jobs")


def cmd_jobs_events(args: argparse.Namespace) -> int:
    page = api_client(args).fine_tuning.jobs.list_events(args.job_id, limit=args.limit)
    stamp = lambda e: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created_at))  # noqa: E731
    return emit(args, page, lambda p: "\n".join(f"{stamp(e)}  {e.level:5}  {e.message}" for e in reversed(p.data)))


def _control(action: str):
    def command(args: argparse.Namespace) -> int:
        client = api_client(args)
        if action == "cancel":
            job = client.fine_tuning.jobs.cancel(args.job_id)
        else:  # pause and resume: gridline routes the SDK has no method for
            from openai.types.fine_tuning import FineTuningJob

            job = client.post(f"/fine_tuning/jobs/{args.job_id}/{action}", cast_to=FineTuningJob)
        return emit(args, job, describe_job)

    return command


def add_job_commands(sub, common: argparse.ArgumentParser, leaf) -> None:
    jobs = sub.add_parser("jobs", help="fine-tuning jobs").add_subparsers(dest="action", required=True)
    create = leaf(jobs, "create", cmd_jobs_create, "create a fine-tuning job", common)
    create.add_argument("--model", required=True)
    create.add_argument("--training-file", required=True)
    create.add_argument("--validation-file", default=None)
    create.add_argument("--suffix", default=None)
    create.add_argument("--seed", type=int, default=None)
    create.add_argument("--method", default=None, help="lora, qlora, or the API's method object as JSON")
    create.add_argument("--hyperparameters", nargs="+", default=[], metavar="KEY=VALUE", help="e.g. n_epochs=1")
    create.add_argument("--metadata", nargs="+", default=[], metavar="KEY=VALUE")
    create.add_argument("--follow", action="store_true", help="show live progress until the job ends")
    show = leaf(jobs, "show", cmd_jobs_show, "a job's status and result", common)
    show.add_argument("job_id")
    show.add_argument("--follow", action="store_true", help="show live progress until the job ends")
    leaf(jobs, "list", cmd_jobs_list, "your jobs, newest first", common).add_argument("--limit", type=int, default=20)
    events = leaf(jobs, "events", cmd_jobs_events, "a job's events, oldest first", common)
    events.add_argument("job_id")
    events.add_argument("--limit", type=int, default=20)
    for action in ("cancel", "pause", "resume"):
        leaf(jobs, action, _control(action), f"{action} a job", common).add_argument("job_id")
