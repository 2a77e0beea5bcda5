"""Job-create checks of a file's rows against the base's chat template (tokenizer only, no weights).

Every row is checked with `check_row_for_base` (control tokens written as text, Qwen3 think
blocks, Mistral alternation, tool rows) and rendered with `render_row`, which locates every
message and refuses a row the template changes or drops (`template_mismatch`): the reference finds
those only after a GPU started. Small files are checked inline; larger ones as a Ray Data job over
line-aligned byte ranges, which still reports the file's first bad line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import orjson

from catalog.bases import BaseModelSpec, get_base
from catalog.model_source import load_tokenizer, parse_model_source
from graders.templates import MISSING, Reference, lookup, shown
from openft.errors import InvalidRequest
from pipelines._items import item_dataset
from pipelines.validate import FileValidationError, check_line
from pipelines.render import (
    check_preference_row_for_base,
    check_row_for_base,
    render_generation_prompt,
    render_preference_row,
    render_row,
)
from storage.objects import open_object_store


def check_line_for_base(line: bytes, line_no: int, row_kind: str, base: BaseModelSpec, tokenizer, param: str,
                        references: References = ()) -> None:
    """`references`: a reinforcement job's grader's `{{item.*}}` references, each of which the row
    must hold (OpenAI's RFT rows are the grader's items)."""
    row = _row_of_kind(line, line_no, row_kind, param)
    if row_kind == "preference":
        check_preference_row_for_base(row, base, line_no, param)
        render_preference_row(row, tokenizer, base, line_no, param)
    elif row_kind == "reinforcement":
        render_generation_prompt(row["messages"], tokenizer, base, line_no, param)
        for ref, where in references:
            if lookup(row, ref.path) is MISSING:
                raise InvalidRequest(
                    f"line {line_no} has no field for {shown(ref.text)}, which {where} reads; every row must hold "
                    "every field the grader reads. Add it to the row, or change the grader.",
                    code="invalid_template", param=param)
    else:
        check_row_for_base(row["messages"], base, line_no, param)
        render_row(row["messages"], tokenizer, base, line_no, param)


References = tuple[tuple[Reference, str], ...]


def _row_of_kind(line: bytes, line_no: int, row_kind: str, param: str) -> dict:
    """The line as a row of the file's kind, checked with the upload's own rules first: the stored
    bytes may not be what a fine-tune upload let through (a file recorded with another purpose's
    checks), and a row of the wrong shape is a refusal naming the line, never a KeyError."""
    try:
        kind = check_line(line, line_no, "fine-tune").kind
    except FileValidationError as err:
        raise InvalidRequest(f"line {line_no}: {err.detail}", code=err.code, param=param) from None
    if kind != row_kind:
        raise InvalidRequest(
            f"line {line_no} holds a {kind or 'non-training'} row, but {param} holds {row_kind} rows; every "
            "line of a training file must be a row of one kind. Fix the line and upload the file again.",
            code="invalid_file_format", param=param,
        )
    return orjson.loads(line)


def first_bad_line(lines: Iterable[bytes], row_kind: str, base: BaseModelSpec, tokenizer, param: str,
                   references: References = ()) -> tuple[int, int] | None:
    """(index, byte offset) of the first line that fails within `lines`, or None."""
    offset = 0
    for index, line in enumerate(lines):
        try:
            check_line_for_base(line, index + 1, row_kind, base, tokenizer, param, references)
        except InvalidRequest:
            return index, offset
        offset += len(line) + 1
    return None


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip(b"\r") for line in lines]


def _check_range(item: dict[str, Any], *, store_spec: tuple, key: str, row_kind: str, base_id: str,
                 model_source: str, cache_root: str, param: str, references: References = ()) -> dict[str, Any]:
    base = get_base(base_id)
    tokenizer = load_tokenizer(base, parse_model_source(model_source), Path(cache_root))
    data = open_object_store(*store_spec).read_range(key, item["start"], item["stop"])
    lines = _lines(data)
    bad = first_bad_line(lines, row_kind, base, tokenizer, param, references)
    return {
        "index": item["index"],
        "lines": len(lines),
        "bad_index": -1 if bad is None else bad[0],
        "bad_offset": -1 if bad is None else item["start"] + bad[1],
    }


def check_file_for_base(
    store_spec: tuple, key: str, *, row_kind: str, base: BaseModelSpec, model_source: str, cache_root: Path,
    param: str, inline_bytes: int, block_bytes: int, name: str | None = None, references: References = (),
) -> None:
    """Raise the refusal of the file's first bad row (its line number in the message), or return.
    `name` names the Ray Data dataset of a file past `inline_bytes` (`<file id> check <base>`)."""
    store = open_object_store(*store_spec)
    size = store.size(key)
    if size <= inline_bytes:
        tokenizer = load_tokenizer(base, parse_model_source(model_source), cache_root)
        lines = _lines(store.get_bytes(key))
        for line_no, line in enumerate(lines, start=1):
            check_line_for_base(line, line_no, row_kind, base, tokenizer, param, references)
        return
    from pipelines.validate_ray import block_ranges

    ranges = block_ranges(store, key, 0, size, block_bytes)
    items = [{"index": i, "start": s, "stop": e} for i, (s, e) in enumerate(ranges)]
    ds = item_dataset(items, name=name)
    results = sorted(
        ds.map(_check_range, fn_kwargs={
            "store_spec": tuple(store_spec), "key": key, "row_kind": row_kind, "base_id": base.id,
            "model_source": model_source, "cache_root": str(cache_root), "param": param, "references": references,
        }).take_all(),
        key=lambda r: r["index"],
    )
    lines_before = 0
    for result in results:
        if result["bad_index"] >= 0:
            # Re-check just that line on the driver so the refusal carries its global line number.
            line_no = lines_before + result["bad_index"] + 1
            raw = store.read_range(key, result["bad_offset"], min(result["bad_offset"] + (1 << 20) + 2, size))
            tokenizer = load_tokenizer(base, parse_model_source(model_source), cache_root)
            check_line_for_base(_lines(raw)[0], line_no, row_kind, base, tokenizer, param, references)
        lines_before += result["lines"]
