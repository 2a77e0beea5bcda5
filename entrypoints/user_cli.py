"""The user's half of the `openft` command: files, jobs, models, merges, batches and chat through the API,
with the official `openai` SDK as client (httpx for the resumable downloads: entrypoints/_download.py).
Configured as the SDK is: `OPENAI_BASE_URL` and `OPENAI_API_KEY`, or `--base-url` and `--api-key`.

Human-readable output by default, `--json` for the API's objects as JSON. Every API refusal prints
its status, code, param and message (never row content: the API's messages carry none) and exits 1.
Registered into entrypoints/cli.py's parser by `add_user_commands`; the operator commands live there."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from entrypoints import user_chat, user_jobs
from entrypoints.user_jobs import api_client, emit, run_user_command
from storage.keys import ADAPTER_FILES



def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def describe_file(f) -> str:
    stats = (f.model_extra or {}).get("gridline") or {}
    lines = [f"{f.id}  {f.filename}  {f.purpose}  {f.status}  {_size(f.bytes)}"]
    if stats.get("rows") is not None:
        lines.append(f"  {stats['rows']} rows ({stats.get('row_kind') or 'batch'}), {stats.get('messages')} messages, "
                     f"{stats.get('content_bytes')} content bytes, at most {stats.get('token_upper_bound')} tokens")  # fmt: skip
    lines.append(f"  sha256 {stats.get('sha256')}")
    return "\n".join(lines)


def cmd_files_upload(args: argparse.Namespace) -> int:
    from entrypoints._progress import ReadProgress, byte_bar

    path = Path(args.path)
    client = api_client(args, max_retries=0)  # a retry would send the whole body again, unseen
    with path.open("rb") as fh, byte_bar(path.stat().st_size, f"upload {path.name}") as bar:
        uploaded = client.files.create(file=(path.name, ReadProgress(fh, bar)), purpose=args.purpose)
    return emit(args, uploaded, describe_file)


def cmd_files_list(args: argparse.Namespace) -> int:
    page = api_client(args).files.list(**({"purpose": args.purpose} if args.purpose else {}))
    return emit(args, page, lambda p: "\n".join(describe_file(f).splitlines()[0] for f in p.data) or "no files")


def _model_line(m) -> str:
    extra = (m.model_extra or {}).get("gridline") or {}
    reason = extra.get("reason")
    servable = "servable" if extra.get("servable") else "not servable" + (f" ({reason})" if reason else "")
    return f"{m.id}  {m.owned_by}  {servable}"


def cmd_models_list(args: argparse.Namespace) -> int:
    return emit(args, api_client(args).models.list(), lambda p: "\n".join(_model_line(m) for m in p.data))


def _http(args: argparse.Namespace):
    """An httpx client for the byte downloads, authenticated as the SDK client is."""
    import httpx

    client = api_client(args)
    return httpx.Client(base_url=str(client.base_url), headers={"Authorization": f"Bearer {client.api_key}"},
                        follow_redirects=True, timeout=httpx.Timeout(60.0, connect=10.0))  # fmt: skip


def _target(args: argparse.Namespace, model: str) -> Path:
    # `ft:` names hold colons, which some filesystems refuse in a directory name.
    return Path(args.dir) if args.dir else Path(model.replace(":", "_"))


def _say(args: argparse.Namespace):
    return (lambda text: print(text, file=sys.stderr)) if args.json else print


def cmd_models_download(args: argparse.Namespace) -> int:
    from entrypoints._download import download_file

    target = _target(args, args.model)
    target.mkdir(parents=True, exist_ok=True)
    done = {}
    with _http(args) as http:
        for name in ADAPTER_FILES:
            url = f"gridline/adapters/{args.model}/files/{name}"
            done[name] = download_file(http, url, target / name, say=_say(args))
    return _downloaded(args, target, done)


def _downloaded(args: argparse.Namespace, target: Path, done: dict[str, str]) -> int:
    if args.json:
        print(json.dumps({"dir": str(target), "files": [{"path": p, "sha256": s} for p, s in done.items()]}, indent=2))
    else:
        for path, sha in done.items():
            print(f"{target / path}  sha256 {sha}  verified")
    return 0


def _merged(args: argparse.Namespace, method: str) -> dict:
    import httpx

    response = getattr(api_client(args), method)(f"/gridline/adapters/{args.model}/merged", cast_to=httpx.Response)
    return response.json()


def describe_merge(m: dict) -> str:
    lines = [f"{m['model']}  merge {m['status']}"]
    if m.get("error"):
        lines.append(f"  error {m['error']['code']}: {m['error']['message']}")
    lines += [f"  {f['path']}  {_size(f['bytes'])}  sha256 {f['sha256']}" for f in m.get("files") or []]
    return "\n".join(lines)


def cmd_merges_create(args: argparse.Namespace) -> int:
    return emit(args, _merged(args, "post"), describe_merge)


def cmd_merges_status(args: argparse.Namespace) -> int:
    return emit(args, _merged(args, "get"), describe_merge)


def cmd_merges_download(args: argparse.Namespace) -> int:
    from entrypoints._download import download_file

    merge = _merged(args, "get")
    if merge["status"] != "succeeded":
        print(f"openft: the merge of {args.model} is {merge['status']}, not succeeded; nothing to download",
              file=sys.stderr)  # fmt: skip
        return 1
    target, done = _target(args, args.model), {}
    with _http(args) as http:
        for f in merge["files"]:
            dest = target / f["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            url = f"gridline/adapters/{args.model}/merged/files/{f['path']}"
            done[f["path"]] = download_file(http, url, dest, sha256=f["sha256"], say=_say(args))
    return _downloaded(args, target, done)


def describe_batch(b) -> str:
    counts = b.request_counts
    done = f"{counts.completed}/{counts.total} done, {counts.failed} failed" if counts else "no counts yet"
    lines = [f"{b.id}  {b.status}  {done}  input {b.input_file_id}"]
    if b.output_file_id or b.error_file_id:
        lines.append(f"  output {b.output_file_id}  errors {b.error_file_id}")
    for e in (b.errors.data or []) if b.errors else []:
        lines.append(f"  error {e.code} line {e.line}: {e.message}")
    return "\n".join(lines)


def cmd_batches_create(args: argparse.Namespace) -> int:
    batch = api_client(args).batches.create(input_file_id=args.input_file, endpoint=args.endpoint,
                                            completion_window=args.completion_window)  # fmt: skip
    return emit(args, batch, describe_batch)


def cmd_batches_list(args: argparse.Namespace) -> int:
    page = api_client(args).batches.list(limit=args.limit)
    return emit(args, page, lambda p: "\n".join(describe_batch(b).splitlines()[0] for b in p.data) or "no batches")


def cmd_batches_show(args: argparse.Namespace) -> int:
    return emit(args, api_client(args).batches.retrieve(args.batch_id), describe_batch)


def cmd_batches_cancel(args: argparse.Namespace) -> int:
    return emit(args, api_client(args).batches.cancel(args.batch_id), describe_batch)


def _leaf(group, name: str, func, help_: str, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser = group.add_parser(name, help=help_, parents=[common])
    parser.set_defaults(func=lambda args: run_user_command(func, args))
    return parser


def add_user_commands(sub) -> None:
    """Adds `files`, `jobs`, `models`, `merges`, `batches` and `chat` to the `openft` parser's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", default=None, help="the API's base URL (default: $OPENAI_BASE_URL)")
    common.add_argument("--api-key", default=None, help="your API key (default: $OPENAI_API_KEY)")
    common.add_argument("--json", action="store_true", help="print the API's objects as JSON")

    files = sub.add_parser("files", help="upload and list your files").add_subparsers(dest="action", required=True)
    upload = _leaf(files, "upload", cmd_files_upload, "upload a JSONL file; prints its validation result", common)
    upload.add_argument("path")
    upload.add_argument("--purpose", default="fine-tune", choices=["fine-tune", "batch"])
    _leaf(files, "list", cmd_files_list, "your files", common).add_argument("--purpose", default=None)

    user_jobs.add_job_commands(sub, common, _leaf)

    models = sub.add_parser("models", help="list and download models").add_subparsers(dest="action", required=True)
    _leaf(models, "list", cmd_models_list, "the bases and your ft: models", common)
    download = _leaf(models, "download", cmd_models_download,
                     "download an ft: model's (or checkpoint's) adapter files, resuming and verifying SHA-256", common)  # fmt: skip
    download.add_argument("model")
    download.add_argument("--dir", default=None, help="where to write (default: the model's name, colons as _)")

    merges = sub.add_parser("merges", help="merged weights of an ft: model").add_subparsers(dest="action", required=True)
    for name, func, help_ in (("create", cmd_merges_create, "start merging the adapter into its base"),
                              ("status", cmd_merges_status, "the merge's status and files")):  # fmt: skip
        _leaf(merges, name, func, help_, common).add_argument("model")
    merged = _leaf(merges, "download", cmd_merges_download, "download a succeeded merge, verifying SHA-256", common)
    merged.add_argument("model")
    merged.add_argument("--dir", default=None, help="where to write (default: the model's name, colons as _)")

    batches = sub.add_parser("batches", help="batch inference").add_subparsers(dest="action", required=True)
    create = _leaf(batches, "create", cmd_batches_create, "run a batch over an uploaded batch file", common)
    create.add_argument("--input-file", required=True)
    create.add_argument("--endpoint", default="/v1/chat/completions")
    create.add_argument("--completion-window", default="24h")
    _leaf(batches, "list", cmd_batches_list, "your batches", common).add_argument("--limit", type=int, default=20)
    for name, func in (("show", cmd_batches_show), ("cancel", cmd_batches_cancel)):
        _leaf(batches, name, func, f"{name} a batch", common).add_argument("batch_id")

    user_chat.add_chat_command(sub, _leaf)
