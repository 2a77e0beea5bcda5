"""Check, estimate and render training rows on Ray Data with the service's own rules.

Per file, the same pieces the Files API and job create use, in the same order:
- line rules: `pipelines/_rows.LINE_CHECKS["fine-tune"]` via `pipelines.validate.check_line`, over
  line-aligned byte ranges (`pipelines.validate_ray.block_ranges`), one Ray Data task per range;
- file rules: `Tally` decides `mixed_row_kinds` (a valid row of another kind than the file's first
  valid row) and `empty_file`; over 64 MiB is `file_too_large`;
- statistics: `FileStats` of the file's rows, whose `token_estimates()` / `token_upper_bound()` are
  what an upload records in `gridline.token_estimates` / `token_upper_bound` and the quote counts;
- template: `pipelines.create_checks.check_line_for_base` (job create's `template_token_in_content`,
  `invalid_file_format`, `template_mismatch`), then `render_row` / `render_preference_row` for the text.
Where an upload stops at its first bad line, this reports every bad line, each with the code and
message (`line N: ...`) the upload would answer were it the first; job-create messages likewise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import ray

from catalog.bases import get_base
from catalog.model_source import load_tokenizer, parse_model_source
from datakit.sources import S3, Source, StoredFile, resolve
from openft.errors import InvalidRequest
from openft.limits import FINE_TUNE_FILE_BYTES
from pipelines.create_checks import check_line_for_base
from pipelines.render import render_preference_row, render_row
from pipelines.validate import BlockResult, FileStats, FileValidationError, Tally, check_line, file_too_large
from pipelines.validate_ray import block_ranges

__all__ = ["BadLine", "FileReport", "check_files", "estimate_tokens", "render", "validate"]

_KIND_MARK = {"chat": "c", "preference": "p", "reinforcement": "r", None: "-"}
_MARK_KIND = {"c": "chat", "p": "preference", "r": "reinforcement"}


@dataclass(frozen=True)
class BadLine:
    path: str
    line: int | None  # None: a whole-file rule (empty_file, file_too_large)
    code: str
    message: str  # the service's message: "line N: ..." (upload) or "line N, ..." (job create)


@dataclass
class FileReport:
    path: str
    stats: FileStats  # the rows of the file's kind that pass the line rules
    bad: list[BadLine] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.bad


def _dataset(items: list[dict]) -> ray.data.Dataset:
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds.context.op_resource_reservation_enabled = False  # one operator: the reservation only idles CPUs
    return ds


def _ranges(files: list[StoredFile], block_bytes: int) -> tuple[list[dict], list[int]]:
    items, sizes = [], []
    for f, file in enumerate(files):
        store = file.store()
        size = store.size(file.key)
        sizes.append(size)
        for i, (start, stop) in enumerate(block_ranges(store, file.key, 0, size, block_bytes)):
            items.append({"file": f, "index": i, "start": start, "stop": stop})
    return items, sizes


def _lines(file: StoredFile, start: int, stop: int) -> list[bytes]:
    data = file.store().read_range(file.key, start, stop)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # what follows the range's last newline, not an empty line
    return lines


def _check_range(item: dict, *, files: list[StoredFile]) -> dict:
    lines = _lines(files[item["file"]], item["start"], item["stop"])
    marks, errors = [], []
    sums = {kind: [0, 0, 0] for kind in _MARK_KIND.values()}  # rows, messages, content bytes
    for i, line in enumerate(lines, 1):
        try:
            kind, messages, content = check_line(line, i, "fine-tune")
        except FileValidationError as err:
            marks.append("-")
            errors.append([i, err.code, err.detail])
            continue
        marks.append(_KIND_MARK[kind])
        s = sums[kind]
        s[0], s[1], s[2] = s[0] + 1, s[1] + messages, s[2] + content
    return {**item, "lines": len(lines), "marks": "".join(marks), "errors": orjson.dumps(errors),
            "sums": orjson.dumps(sums)}


def _mixed(file_kind: str, other: str, line: int) -> FileValidationError:
    """The upload's refusal for a row of kind `other` (`mixed_row_kinds`, or `invalid_messages` for a
    prompt in a chat file), from `Tally` itself."""
    try:
        Tally(FileStats(row_kind=file_kind)).add(BlockResult(1, FileStats(row_kind=other, rows=1)))
    except FileValidationError as err:
        return err.at(line)
    raise AssertionError("Tally accepted two row kinds")


def check_files(source: Source, *, s3: S3 | None = None, staging: str | None = None,
                block_bytes: int = 8 << 20) -> list[FileReport]:
    """Every input file's statistics and bad lines (the line rules of a fine-tune upload)."""
    files = resolve(source, s3=s3, staging=staging)
    return _reports(files, *_scan(files, block_bytes))


def _scan(files: list[StoredFile], block_bytes: int) -> tuple[list[dict], list[int]]:
    """The line rules over every range of `files`, results in file and range order."""
    items, sizes = _ranges(files, block_bytes)
    results: list[dict] = []
    if items:
        results = _dataset(items).map(_check_range, fn_kwargs={"files": files}).take_all()
    results.sort(key=lambda r: (r["file"], r["index"]))
    return results, sizes


def _file_kind(marks: str) -> str | None:
    """The kind of the file's first row that passes the line rules: the kind the file is held to."""
    return next((_MARK_KIND[m] for m in marks if m != "-"), None)


def _reports(files: list[StoredFile], results: list[dict], sizes: list[int]) -> list[FileReport]:
    reports = []
    for f, file in enumerate(files):
        ranges = [r for r in results if r["file"] == f]
        marks = "".join(r["marks"] for r in ranges)
        file_kind = _file_kind(marks)
        bad: dict[int, BadLine] = {}
        offset = 0
        for r in ranges:
            for i, code, detail in orjson.loads(r["errors"]):
                bad[offset + i] = BadLine(file.path, offset + i, code, FileValidationError(code, detail, offset + i).message)
            offset += r["lines"]
        for n, mark in enumerate(marks, 1):
            if mark != "-" and _MARK_KIND[mark] != file_kind:
                err = _mixed(file_kind, _MARK_KIND[mark], n)
                bad[n] = BadLine(file.path, n, err.code, err.message)
        stats = FileStats(bytes=sizes[f])
        if file_kind is not None:
            rows, messages, content = (sum(orjson.loads(r["sums"])[file_kind][k] for r in ranges) for k in range(3))
            stats = FileStats(file_kind, rows, messages, content, sizes[f])
        found = [bad[n] for n in sorted(bad)]
        if not marks:
            try:
                Tally().finish()
            except FileValidationError as err:
                found.append(BadLine(file.path, None, err.code, err.message))
        if sizes[f] > FINE_TUNE_FILE_BYTES:
            err = file_too_large(FINE_TUNE_FILE_BYTES)
            found.append(BadLine(file.path, None, err.code, err.message))
        reports.append(FileReport(file.path, stats, found))
    return reports


def validate(source: Source, *, s3: S3 | None = None, staging: str | None = None,
             block_bytes: int = 8 << 20) -> ray.data.Dataset:
    """The bad lines of chat or preference files: a Dataset of {path, line, code, message}, in file
    and line order (empty when every file would upload). `line` is 0 for a whole-file rule."""
    reports = check_files(source, s3=s3, staging=staging, block_bytes=block_bytes)
    rows = [{"path": b.path, "line": b.line or 0, "code": b.code, "message": b.message} for r in reports for b in r.bad]
    return ray.data.from_items(rows) if rows else ray.data.from_items([]).limit(0)


def estimate_tokens(source: Source, *, s3: S3 | None = None, staging: str | None = None) -> dict[str, dict[str, Any]]:
    """Per file: {row_kind, rows, messages, content_bytes, token_upper_bound, token_estimates: {base: tokens},
    bad_lines}: the numbers an upload of it records (when `bad_lines` is 0) and the quote counts."""
    out = {}
    for r in check_files(source, s3=s3, staging=staging):
        s = r.stats
        out[r.path] = {"row_kind": s.row_kind, "rows": s.rows, "messages": s.messages, "content_bytes": s.content_bytes,
                       "token_upper_bound": s.token_upper_bound(), "token_estimates": s.token_estimates(),
                       "bad_lines": len(r.bad)}
    return out


@functools.lru_cache(maxsize=4)
def _tokenizer(base_id: str, model_source: str, cache_dir: str):
    return load_tokenizer(get_base(base_id), parse_model_source(model_source), Path(cache_dir))


def _render_range(item: dict, *, files: list[StoredFile], kinds: list[str | None], base_id: str,
                  model_source: str, cache_dir: str, param: str) -> dict:
    file, kind = files[item["file"]], kinds[item["file"]]
    base = get_base(base_id)
    tokenizer = _tokenizer(base_id, model_source, cache_dir)
    out = []
    for i, line in enumerate(_lines(file, item["start"], item["stop"]), 1):
        n = item["first_line"] + i - 1
        row = {"path": file.path, "line": n, "code": "", "message": "", "text": "", "chosen": "", "rejected": ""}
        try:
            # job create's own check of a line: the upload's rules, the file's kind, then the template
            check_line_for_base(line.rstrip(b"\r"), n, kind or "chat", base, tokenizer, param)
            parsed = orjson.loads(line)
            if kind == "preference":
                row["text"], row["chosen"], row["rejected"] = render_preference_row(parsed, tokenizer, base, n, param)
            else:
                row["text"] = render_row(parsed["messages"], tokenizer, base, n, param).text
        except InvalidRequest as err:
            row["code"], row["message"] = err.code, err.message
        out.append(row)
    return {"file": item["file"], "index": item["index"], "rows": orjson.dumps(out)}


def render(source: Source, base: str, *, model_source: str = "hub", cache_dir: str | Path = "~/.cache/openft/models",
           s3: S3 | None = None, staging: str | None = None, param: str = "training_file",
           block_bytes: int = 8 << 20) -> ray.data.Dataset:
    """Every row rendered with `base`'s chat template, as job create and the trainer render it: a
    Dataset of {path, line, text, chosen, rejected, code, message} in file and line order. Chat rows:
    `text` is the rendered conversation; preference rows: `text` the prompt with its generation
    prompt, `chosen` / `rejected` each output up to its end-of-turn token. A row job create would
    refuse has its `code` (`template_token_in_content`, `invalid_file_format`, `template_mismatch`,
    or an upload rule's) and message, and no text. `model_source` is the service's
    `OPENFT_MODEL_SOURCE` (`hub`, `dir:/mirror`, `standin`); tokenizers are cached under `cache_dir`
    on each node."""
    get_base(base)  # an unknown base is refused here, before any task
    files = resolve(source, s3=s3, staging=staging)
    scanned, _ = _scan(files, block_bytes)
    kinds = [_file_kind("".join(r["marks"] for r in scanned if r["file"] == f)) for f in range(len(files))]
    items, first = [], {}
    for r in scanned:  # each range's first line number, from the line counts of the ranges before it
        line = first.get(r["file"], 1)
        items.append({"file": r["file"], "index": r["index"], "start": r["start"], "stop": r["stop"], "first_line": line})
        first[r["file"]] = line + r["lines"]
    kwargs = {"files": files, "kinds": kinds, "base_id": base, "model_source": model_source,
              "cache_dir": str(Path(cache_dir).expanduser()), "param": param}
    results = _dataset(items).map(_render_range, fn_kwargs=kwargs).take_all() if items else []
    results.sort(key=lambda r: (r["file"], r["index"]))
    rows = [row for r in results for row in orjson.loads(r["rows"])]
    return ray.data.from_items(rows) if rows else ray.data.from_items([]).limit(0)
