"""Tokenize a job's file with its base's tokenizer: token ids, loss-mask labels, and the loss-mask report.

Where it sits: after job create (render checks passed) and before training. The job's run calls
`build_tokenized`, which reads the stored JSONL in byte ranges, tokenizes each range's rows with the
pure functions below and writes one Parquet shard per range to the object store under a key derived
from (file sha256, base id, revision, max_seq_length, method), then a `manifest.json` last; a later
job on the same file and settings finds the manifest and reuses the shards. Above the
`tokenize_ray_threshold_bytes` setting the ranges are a Ray Data job's tasks and the Ray Train
workers read the shards with `tokenized_dataset` (one Ray Data task per shard); at or below it the
run tokenizes them itself and the workers read them with `read_tokenized`.

Loss mask (supervised): each row is rendered with the base's chat template (`render_row`), which
gives the char span of every message; the rendered text is encoded with `add_special_tokens=False`
(the template already writes BOS where the family has one) and a token trains when it overlaps an
assistant message of weight 1, from its content up to and including the end-of-turn token that
closes the turn (`<|im_end|>`, `</s>`, `<|eot_id|>`, gpt-oss `<|end|>`/`<|return|>`), so the model
learns to stop. A token that straddles the start of a content (Mistral's `[/INST]` + " word" is
encoded as one " word" token) trains. Everything else (system, user, weight-0 assistant turns,
template markup such as Qwen3's empty think block) is context. Rows are cut at `max_seq_length`
tokens; a row left with no trained token is skipped and counted.

Preference rows: prompt, chosen and rejected are encoded separately (the prompt ends with the
template's generation prompt, so the completions are what the model would generate after it); the
completions are cut so that prompt + completion fits `max_seq_length`; a prompt that leaves no room
skips the row.

Reinforcement rows (prompts): the messages are rendered with the generation prompt (the text a
sampled completion continues) and encoded; the row itself is kept beside them as JSON (`item`), what
the grader reads as `{{item.*}}`. A prompt that leaves no room for one completion token within
`max_seq_length` skips the row.

Shards are written through the store's own writer (pyarrow into memory, then `put_bytes`), the same
code on the local and the S3 backend, and each object appears whole or not at all. Reading goes
through the store too, one task per shard named in the manifest: Ray Data's `read_parquet` (2.60)
starts a pool of 32 `FooterReader` actors per read to list footers the manifest already lists, and
each attempt's train and eval reads left 64 dead actors on the dashboard.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from catalog.bases import BaseModelSpec, get_base
from catalog.model_source import ModelSource, load_tokenizer
from openft.errors import InvalidRequest, TrainingError
from pipelines._items import item_dataset
from pipelines.render import render_generation_prompt, render_preference_row, render_row
from storage import keys

IGNORE_INDEX = -100  # label of a context token (PyTorch cross_entropy's ignore_index)
ROLES = ("system", "user", "assistant", "template")  # "template": markup outside every message
METHODS = ("supervised", "dpo", "reinforcement")
ROW_KINDS = {"supervised": "chat", "dpo": "preference", "reinforcement": "reinforcement"}
MANIFEST = "manifest.json"


@dataclass
class ChatTokens:
    line: int
    input_ids: list[int]
    labels: list[int]  # the token id where it trains, IGNORE_INDEX where it is context
    truncated: bool
    trained: dict[str, int]  # tokens per role (after truncation)
    context: dict[str, int]
    turns_trained: int  # assistant turns with at least one trained token left
    turns_ending_with_eot: int  # ... whose last trained token is an end-of-turn token

    @property
    def trainable(self) -> bool:
        return sum(self.trained.values()) > 0


@dataclass
class PreferenceTokens:
    line: int
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    truncated: bool
    ends_with_eot: bool  # both completions still end with the end-of-turn token


@dataclass
class PromptTokens:
    line: int
    prompt_ids: list[int]
    item: str  # the row as JSON: the grader's item
    truncated: bool  # the prompt fills max_seq_length: the row is skipped


def _eot_ids(tokenizer, base: BaseModelSpec) -> set[int]:
    tokens = [t for t in (base.end_of_turn, base.earlier_end_of_turn) if t]
    return {tokenizer.convert_tokens_to_ids(t) for t in tokens}


def _as_training_error(exc: InvalidRequest) -> TrainingError:
    # render.py refuses with template_mismatch once training is under way; its message names the
    # line and message position, never the content.
    return TrainingError("template_mismatch", exc.message)


def tokenize_chat_row(messages: list[dict], tokenizer, base: BaseModelSpec, max_seq_length: int, line: int) -> ChatTokens:
    """One chat row as ids and labels; raises TrainingError(template_mismatch) when it cannot render."""
    try:
        rendered = render_row(messages, tokenizer, base, line)
    except InvalidRequest as exc:
        raise _as_training_error(exc) from None
    # (start, stop, role, trains, turn number) per message; an assistant range runs to its turn end.
    ranges = []
    for span in rendered.spans:
        trains = span.role == "assistant" and messages[span.index].get("weight", 1) != 0
        ranges.append((span.start, span.turn_end or span.end, span.role, trains, span.index))
    encoding = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoding["input_ids"]
    truncated = len(ids) > max_seq_length
    ids, offsets = ids[:max_seq_length], encoding["offset_mapping"][:max_seq_length]
    labels = [IGNORE_INDEX] * len(ids)
    trained = dict.fromkeys(ROLES, 0)
    context = dict.fromkeys(ROLES, 0)
    last_trained: dict[int, int] = {}  # turn -> its last trained token's id
    p = 0
    for i, (token_id, (start, end)) in enumerate(zip(ids, offsets)):
        while p < len(ranges) and ranges[p][1] <= start:
            p += 1
        owner = ranges[p] if p < len(ranges) and ranges[p][0] < end else None
        role = owner[2] if owner else "template"
        if owner and owner[3]:
            labels[i] = token_id
            trained[role] += 1
            last_trained[owner[4]] = token_id
        else:
            context[role] += 1
    eot = _eot_ids(tokenizer, base)
    return ChatTokens(
        line=line,
        input_ids=ids,
        labels=labels,
        truncated=truncated,
        trained=trained,
        context=context,
        turns_trained=len(last_trained),
        turns_ending_with_eot=sum(1 for t in last_trained.values() if t in eot),
    )


def tokenize_preference_row(row: dict, tokenizer, base: BaseModelSpec, max_seq_length: int, line: int) -> PreferenceTokens:
    try:
        prompt, chosen, rejected = render_preference_row(row, tokenizer, base, line)
    except InvalidRequest as exc:
        raise _as_training_error(exc) from None
    prompt_ids, chosen_ids, rejected_ids = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (prompt, chosen, rejected))
    room = max(max_seq_length - len(prompt_ids), 0)
    truncated = len(prompt_ids) + max(len(chosen_ids), len(rejected_ids)) > max_seq_length
    chosen_ids, rejected_ids = chosen_ids[:room], rejected_ids[:room]
    eot = _eot_ids(tokenizer, base)
    ends = bool(chosen_ids and rejected_ids) and chosen_ids[-1] in eot and rejected_ids[-1] in eot
    return PreferenceTokens(line, prompt_ids, chosen_ids, rejected_ids, truncated, ends)


def tokenize_prompt_row(row: dict, tokenizer, base: BaseModelSpec, max_seq_length: int, line: int) -> PromptTokens:
    try:
        text = render_generation_prompt(row["messages"], tokenizer, base, line, "training_file")
    except InvalidRequest as exc:
        raise _as_training_error(exc) from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    too_long = len(ids) >= max_seq_length
    return PromptTokens(line, ids if not too_long else [], orjson.dumps(row).decode(), too_long)


# --- the loss-mask report: counts summed over rows, mergeable across shards ---


def empty_report(method: str) -> dict:
    report = {"method": method, "rows": 0, "rows_used": 0, "rows_skipped_no_trainable_token": 0, "rows_truncated": 0, "tokens": 0}
    if method == "supervised":
        report |= {
            "trained_tokens": dict.fromkeys(ROLES, 0),
            "context_tokens": dict.fromkeys(ROLES, 0),
            "assistant_turns_trained": 0,
            "assistant_turns_ending_with_eot": 0,
        }
    elif method == "dpo":
        report |= {"prompt_tokens": 0, "chosen_tokens": 0, "rejected_tokens": 0, "pairs_ending_with_eot": 0}
    else:
        report |= {"prompt_tokens": 0}
    return report


def add_row(report: dict, row: ChatTokens | PreferenceTokens | PromptTokens) -> bool:
    """Count `row` into `report`; True when the row trains (and so is kept)."""
    report["rows"] += 1
    report["rows_truncated"] += row.truncated
    if isinstance(row, ChatTokens):
        keep = row.trainable
        if keep:
            for role in ROLES:
                report["trained_tokens"][role] += row.trained[role]
                report["context_tokens"][role] += row.context[role]
            report["assistant_turns_trained"] += row.turns_trained
            report["assistant_turns_ending_with_eot"] += row.turns_ending_with_eot
            report["tokens"] += len(row.input_ids)
    elif isinstance(row, PromptTokens):
        keep = bool(row.prompt_ids)
        report["prompt_tokens"] += len(row.prompt_ids)
        report["tokens"] += len(row.prompt_ids)
    else:
        keep = bool(row.chosen_ids and row.rejected_ids)
        if keep:
            report["prompt_tokens"] += len(row.prompt_ids)
            report["chosen_tokens"] += len(row.chosen_ids)
            report["rejected_tokens"] += len(row.rejected_ids)
            report["pairs_ending_with_eot"] += row.ends_with_eot
            report["tokens"] += len(row.prompt_ids) + len(row.chosen_ids) + len(row.rejected_ids)  # the billed basis
    report["rows_used"] += keep
    report["rows_skipped_no_trainable_token"] += not keep
    return keep


def merge_reports(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict):
            out[key] = {k: a[key][k] + v for k, v in value.items()}
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = a[key] + value
    return out


def finish_report(report: dict) -> dict:
    """Adds the verdicts: whether every trained turn (every pair) ends with its end-of-turn token."""
    if report["method"] == "supervised":
        ok = report["assistant_turns_ending_with_eot"] == report["assistant_turns_trained"]
        return report | {"every_trained_turn_ends_with_eot": ok}
    if report["method"] == "reinforcement":  # nothing written is trained: the samples end as they end
        return report | {"every_trained_turn_ends_with_eot": None}
    return report | {"every_trained_turn_ends_with_eot": report["pairs_ending_with_eot"] == report["rows_used"]}


# --- lines -> rows -> one Parquet table ---


def tokenize_lines(lines: list[bytes], first_line: int, tokenizer, base: BaseModelSpec, max_seq_length: int, method: str) -> tuple[pa.Table, dict]:
    """Tokenize consecutive JSONL lines (numbered from `first_line`); (kept rows as a table, report)."""
    report = empty_report(method)
    kept = []
    for n, raw in enumerate(lines):
        line = first_line + n
        if not raw.strip():
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            row = None
        if not _has_shape(row, method):
            raise TrainingError("invalid_row", f"line {line}: the row could not be read as a {ROW_KINDS[method]} row; "
                                               "upload the file again.")
        if method == "supervised":
            tokens = tokenize_chat_row(row["messages"], tokenizer, base, max_seq_length, line)
        elif method == "reinforcement":
            tokens = tokenize_prompt_row(row, tokenizer, base, max_seq_length, line)
        else:
            tokens = tokenize_preference_row(row, tokenizer, base, max_seq_length, line)
        if add_row(report, tokens):
            kept.append(tokens)
    return rows_table(kept, method), report


def _has_shape(row, method: str) -> bool:
    """The shape the tokenizer indexes into; upload validation checked the rest."""
    def messages(value) -> bool:
        return isinstance(value, list) and all(isinstance(m, dict) for m in value)

    if not isinstance(row, dict):
        return False
    if method in ("supervised", "reinforcement"):
        return messages(row.get("messages"))
    prompt = row.get("input")
    return (
        isinstance(prompt, dict)
        and messages(prompt.get("messages"))
        and all(messages(row.get(k)) and len(row[k]) == 1 for k in ("preferred_output", "non_preferred_output"))
    )


def rows_table(rows: list, method: str) -> pa.Table:
    ids = pa.list_(pa.int32())
    if method == "supervised":
        schema = pa.schema([("line", pa.int64()), ("input_ids", ids), ("labels", ids)])
        columns = [[r.line for r in rows], [r.input_ids for r in rows], [r.labels for r in rows]]
    elif method == "reinforcement":
        schema = pa.schema([("line", pa.int64()), ("prompt_ids", ids), ("item", pa.string())])
        columns = [[r.line for r in rows], [r.prompt_ids for r in rows], [r.item for r in rows]]
    else:
        schema = pa.schema([("line", pa.int64()), ("prompt_ids", ids), ("chosen_ids", ids), ("rejected_ids", ids)])
        columns = [[r.line for r in rows], [r.prompt_ids for r in rows], [r.chosen_ids for r in rows], [r.rejected_ids for r in rows]]
    return pa.Table.from_arrays([pa.array(c, type=t) for c, t in zip(columns, schema.types)], schema=schema)


# --- the Ray Data job ---


@dataclass(frozen=True)
class TokenizedRef:
    prefix: str  # object-store prefix holding the shards and manifest.json
    rows: int  # rows kept (with at least one trained token)
    report: dict  # the loss-mask report; report["rows"] counts every row of the file
    shards: tuple[str, ...] = field(default=())


def tokenized_prefix(file_sha256: str, base: BaseModelSpec, max_seq_length: int, method: str) -> str:
    return keys.tokenized(file_sha256, base.id, base.revision, method, max_seq_length)


@functools.lru_cache(maxsize=4)
def cached_tokenizer(base_id: str, source: ModelSource, cache_root: str):
    """A base's tokenizer, loaded once per process (tokenize tasks, the online route)."""
    return load_tokenizer(get_base(base_id), source, Path(cache_root))


def _tokenize_range(item: dict, *, store_spec: tuple, key: str, prefix: str, base_id: str, source: ModelSource, cache_root: str, max_seq_length: int, method: str) -> dict:
    from storage.objects import open_object_store

    store = open_object_store(*store_spec)
    data = store.read_range(key, item["start"], item["stop"])
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    try:
        table, report = tokenize_lines(lines, item["first_line"], cached_tokenizer(base_id, source, cache_root), get_base(base_id), max_seq_length, method)
    except TrainingError as exc:
        # Returned, not raised: the driver fails the job with the first bad line of the whole file.
        return {"index": item["index"], "error_line": item["first_line"], "error_code": exc.code, "error_message": exc.message, "shard": "", "report": b""}
    shard = f"{prefix}shard-{item['index']:05d}.parquet"
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    store.put_bytes(shard, buffer.getvalue())
    return {"index": item["index"], "error_line": 0, "error_code": "", "error_message": "", "shard": shard, "report": orjson.dumps(report)}


def build_tokenized(
    store_spec: tuple,
    source_key: str,
    file_sha256: str,
    base_id: str,
    source: ModelSource,
    cache_root: Path,
    max_seq_length: int,
    method: str,
    *,
    block_bytes: int = 4 << 20,
    ray_threshold_bytes: int = 0,
    name: str | None = None,
) -> TokenizedRef:
    """Tokenize the stored JSONL `source_key` (or reuse an earlier run's shards). A file larger than
    `ray_threshold_bytes` is tokenized by a Ray Data job (Ray must be initialised), named `name` on
    the Ray dashboard (`<job id> tokenize`); a smaller one here, range by range, with the same code:
    a Ray Data job's fixed cost (its executor, a task process per range loading the tokenizer) was
    most of a small file's 9 s of tokenization.

    Raises TrainingError: `invalid_row` / `template_mismatch` for the first row that cannot be
    tokenized, `context_too_long` when no row keeps a trained token within `max_seq_length`.
    """
    from pipelines.validate_ray import block_ranges
    from storage.objects import open_object_store

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}")
    base = get_base(base_id)
    store = open_object_store(*store_spec)
    prefix = tokenized_prefix(file_sha256, base, max_seq_length, method)
    if store.exists(prefix + MANIFEST):
        ref = load_ref(store, prefix)
    else:
        size = store.size(source_key)
        ranges = block_ranges(store, source_key, 0, size, block_bytes)
        items, line = [], 1
        # Line numbers of each range's first row: one sequential read of the file (at most 64 MiB)
        # so that every error names the line as upload validation numbered it.
        for index, (start, stop) in enumerate(ranges):
            items.append({"index": index, "start": start, "stop": stop, "first_line": line})
            line += store.read_range(source_key, start, stop).count(b"\n")
        fn_kwargs = dict(store_spec=tuple(store_spec), key=source_key, prefix=prefix, base_id=base_id, source=source,
                         cache_root=str(cache_root), max_seq_length=max_seq_length, method=method)
        if size <= ray_threshold_bytes:
            results = [_tokenize_range(item, **fn_kwargs) for item in items]
        elif items:
            ds = item_dataset(items, name=name)
            results = sorted(ds.map(_tokenize_range, fn_kwargs=fn_kwargs).take_all(), key=lambda r: r["index"])
        else:
            results = []
        failed = [r for r in results if r["error_code"]]
        if failed:
            raise TrainingError(failed[0]["error_code"], failed[0]["error_message"])
        report = empty_report(method)
        for r in results:
            report = merge_reports(report, orjson.loads(r["report"]))
        report = finish_report(report | {"max_seq_length": max_seq_length})
        ref = TokenizedRef(prefix, report["rows_used"], report, tuple(r["shard"] for r in results))
        store.put_bytes(prefix + MANIFEST, orjson.dumps({"rows": ref.rows, "report": report, "shards": list(ref.shards)}))
    if ref.rows == 0:
        raise TrainingError(
            "context_too_long",
            f"No row keeps {'room for a completion' if method == 'reinforcement' else 'an assistant token'} within "
            f"max_seq_length {max_seq_length} "
            f"({ref.report['rows']} rows checked); raise max_seq_length or shorten the rows.",
        )
    return ref


def load_ref(store, prefix: str) -> TokenizedRef:
    manifest = orjson.loads(store.get_bytes(prefix + MANIFEST))
    return TokenizedRef(prefix, manifest["rows"], manifest["report"], tuple(manifest["shards"]))


def read_tokenized(store, prefix: str) -> list[dict]:
    """Every kept row under `prefix` as dicts (no Ray), in line order."""
    ref = load_ref(store, prefix)
    tables = [pq.read_table(io.BytesIO(store.get_bytes(key))) for key in ref.shards]
    rows = [row for t in tables for row in t.to_pylist()]
    return sorted(rows, key=lambda r: r["line"])


def _read_shards(batch: pa.Table, *, store_spec: tuple) -> pa.Table:
    from storage.objects import open_object_store

    store = open_object_store(*store_spec)
    return pa.concat_tables([pq.read_table(io.BytesIO(store.get_bytes(key))) for key in batch["key"].to_pylist()])


def tokenized_dataset(store_spec: tuple, prefix: str, *, name: str | None = None):
    """The shards under `prefix` as a Ray Data dataset (for TorchTrainer `datasets=`), named `name`
    on the Ray dashboard."""
    from storage.objects import open_object_store

    ref = load_ref(open_object_store(*store_spec), prefix)
    items = [{"key": key} for key in ref.shards]
    ds = item_dataset(items, name=name).map_batches(_read_shards, batch_size=1, batch_format="pyarrow",
                                                    fn_kwargs={"store_spec": tuple(store_spec)})
    ds.set_name(name)  # the dashboard lists the dataset Train reads under the job's name
    return ds
