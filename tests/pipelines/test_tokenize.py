"""pipelines/tokenize.py on every stand-in base: labels cover exactly the assistant content of
weight-1 turns plus the end-of-turn token that closes each; weight-0 turns, truncation, skipped
rows and the loss-mask report; then the Ray Data job writing and reusing Parquet shards."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from transformers import AutoTokenizer

from catalog.bases import BASES, get_base
from catalog.model_source import ModelSource
from catalog.standins import standin_dir
from openft.errors import TrainingError
from pipelines.tokenize import (
    IGNORE_INDEX,
    build_tokenized,
    read_tokenized,
    tokenize_chat_row,
    tokenize_lines,
    tokenize_preference_row,
    tokenized_dataset,
)
from storage.objects import open_object_store
from tests.factories import chat_row, jsonl, preference_row

# The Mistral template writes "[/INST] " before an answer and its tokenizer folds that space into
# the answer's first token, which therefore trains.
LEADING = {"mistral": " "}


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "model-cache"


@pytest.fixture(scope="session")
def tokenizers(model_cache) -> dict:
    return {base_id: AutoTokenizer.from_pretrained(standin_dir(base, model_cache)) for base_id, base in BASES.items()}


def _trained_text(tok, tokens) -> str:
    return tok.decode([i for i in tokens.labels if i != IGNORE_INDEX])


@pytest.mark.parametrize("base_id", list(BASES))
def test_labels_cover_each_trained_answer_and_its_end_of_turn(tokenizers, base_id):
    base, tok = get_base(base_id), tokenizers[base_id]
    row = chat_row("Where is my parcel?", "It left the depot.", "And now?", "It is out for delivery.", system=None)
    tokens = tokenize_chat_row(row["messages"], tok, base, 2048, line=7)

    lead = LEADING.get(base.family, "")
    first_end = base.earlier_end_of_turn or base.end_of_turn
    assert _trained_text(tok, tokens) == f"{lead}It left the depot.{first_end}{lead}It is out for delivery.{base.end_of_turn}"
    assert (tokens.turns_trained, tokens.turns_ending_with_eot, tokens.truncated, tokens.line) == (2, 2, False, 7)
    assert tokens.labels[-1] == tok.convert_tokens_to_ids(base.end_of_turn) or tokens.labels[-1] == IGNORE_INDEX
    assert sum(tokens.trained.values()) == tokens.trained["assistant"] == sum(i != IGNORE_INDEX for i in tokens.labels)
    assert sum(tokens.trained.values()) + sum(tokens.context.values()) == len(tokens.input_ids)


@pytest.mark.parametrize("base_id", list(BASES))
def test_weight_zero_answers_stay_context(tokenizers, base_id):
    base, tok = get_base(base_id), tokenizers[base_id]
    row = chat_row("Where is my parcel?", "It left the depot.", "And now?", "It is out for delivery.", system=None)
    row["messages"][1]["weight"] = 0
    tokens = tokenize_chat_row(row["messages"], tok, base, 2048, line=1)
    assert _trained_text(tok, tokens) == f"{LEADING.get(base.family, '')}It is out for delivery.{base.end_of_turn}"
    assert tokens.context["assistant"] > 0 and tokens.turns_trained == 1


def test_truncation_cuts_the_answer_and_the_report_says_so(tokenizers):
    base, tok = get_base("qwen2.5-0.5b-instruct"), tokenizers["qwen2.5-0.5b-instruct"]
    row = chat_row("Where is my parcel?", "It left the depot this morning and is on its way.")
    full = tokenize_chat_row(row["messages"], tok, base, 2048, line=1)
    cut = tokenize_chat_row(row["messages"], tok, base, len(full.input_ids) - 3, line=1)
    assert cut.truncated and cut.input_ids == full.input_ids[:-3] and cut.labels == full.labels[:-3]
    assert (cut.turns_trained, cut.turns_ending_with_eot) == (1, 0)
    first_trained = next(i for i, label in enumerate(full.labels) if label != IGNORE_INDEX)
    nothing = tokenize_chat_row(row["messages"], tok, base, first_trained, line=1)
    assert not nothing.trainable


def test_report_on_a_small_file(tokenizers):
    base, tok = get_base("qwen2.5-0.5b-instruct"), tokenizers["qwen2.5-0.5b-instruct"]
    only_context = chat_row("Hi", "Hello.")
    only_context["messages"][-1]["weight"] = 0
    lines = jsonl([chat_row("Where is my parcel?", "On its way."), only_context, chat_row("Refund?", "Done, sorry for the trouble.")]).splitlines()
    cut_at = 40
    table, report = tokenize_lines(lines, 1, tok, base, cut_at, "supervised")

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    # Each row is the default-free template: system, user and assistant turns around the contents.
    full = [count(tok.apply_chat_template(orjson.loads(line)["messages"], tokenize=False)) for line in lines]
    assert full[0] <= cut_at < full[2]
    assert table.column("line").to_pylist() == [1, 3]
    assert report["rows"] == 3 and report["rows_used"] == 2 and report["rows_skipped_no_trainable_token"] == 1
    assert report["rows_truncated"] == 1 and report["tokens"] == full[0] + cut_at
    first_answer = count("On its way.") + 1  # + <|im_end|>
    third_kept = cut_at - (full[2] - count("Done, sorry for the trouble.") - 2)  # its answer up to the cut
    assert report["trained_tokens"] == {"system": 0, "user": 0, "assistant": first_answer + third_kept, "template": 0}
    assert report["context_tokens"]["system"] == 2 * count("You are terse.")
    assert report["context_tokens"]["user"] == count("Where is my parcel?") + count("Refund?")
    assert (report["assistant_turns_trained"], report["assistant_turns_ending_with_eot"]) == (2, 1)


def test_preference_rows_split_prompt_and_answers(tokenizers):
    base, tok = get_base("qwen2.5-0.5b-instruct"), tokenizers["qwen2.5-0.5b-instruct"]
    pair = tokenize_preference_row(preference_row(), tok, base, 2048, line=1)
    assert tok.decode(pair.prompt_ids).endswith("<|im_start|>assistant\n")
    assert (tok.decode(pair.chosen_ids), tok.decode(pair.rejected_ids)) == ("Paris.<|im_end|>", "Lyon.<|im_end|>")
    assert pair.ends_with_eot and not pair.truncated
    short = tokenize_preference_row(preference_row(), tok, base, len(pair.prompt_ids) + 2, line=1)
    assert short.truncated and short.chosen_ids == pair.chosen_ids[:2] and not short.ends_with_eot


def test_bad_rows_fail_with_their_line(tokenizers):
    base, tok = get_base("qwen2.5-0.5b-instruct"), tokenizers["qwen2.5-0.5b-instruct"]
    good = jsonl([chat_row()]).strip()
    with pytest.raises(TrainingError) as info:
        tokenize_lines([good, b"{not json"], 1, tok, base, 2048, "supervised")
    assert (info.value.code, info.value.message.split(":")[0]) == ("invalid_row", "line 2")
    with pytest.raises(TrainingError) as info:
        tokenize_lines([good, good, jsonl([chat_row("Say <|im_end|> please", "No.")]).strip()], 1, tok, base, 2048, "supervised")
    assert info.value.code == "template_mismatch" and info.value.message.startswith("line 3, messages[1]")
    assert "please" not in info.value.message


@pytest.mark.usefixtures("ray_cluster")
def test_build_tokenized_writes_shards_and_reuses_them(tmp_path, model_cache):
    store = open_object_store(f"file://{tmp_path / 'objects'}")
    rows = [chat_row(f"Ticket number {i}?", f"Answer {i}.") for i in range(30)]
    data = jsonl(rows)
    store.put_bytes("files/a/file-1", data)
    sha = hashlib.sha256(data).hexdigest()
    args = (store.spec(), "files/a/file-1", sha, "qwen2.5-0.5b-instruct", ModelSource("standin"), model_cache, 256, "supervised")

    ref = build_tokenized(*args, block_bytes=1024)

    assert len(ref.shards) > 1 and ref.rows == 30 and ref.report["rows"] == 30
    assert ref.report["every_trained_turn_ends_with_eot"] is True and ref.report["max_seq_length"] == 256
    got = read_tokenized(store, ref.prefix)
    assert [r["line"] for r in got] == list(range(1, 31))
    tok = AutoTokenizer.from_pretrained(standin_dir(get_base("qwen2.5-0.5b-instruct"), model_cache))
    assert got[12]["input_ids"] == tok(tok.apply_chat_template(rows[12]["messages"], tokenize=False), add_special_tokens=False)["input_ids"]
    assert tokenized_dataset(store.spec(), ref.prefix).count() == 30

    with pytest.raises(TrainingError) as info:
        build_tokenized(*args[:6], 8, "supervised")
    assert info.value.code == "context_too_long" and "30 rows checked" in info.value.message

    # At or below the Ray threshold the run tokenizes the same ranges itself: the same shards, byte for byte.
    here = open_object_store(f"file://{tmp_path / 'here'}")
    here.put_bytes("files/a/file-1", data)
    inline = build_tokenized(here.spec(), *args[1:], block_bytes=1024, ray_threshold_bytes=len(data))
    assert inline == ref
    assert [here.get_bytes(key) for key in inline.shards] == [store.get_bytes(key) for key in ref.shards]

    store.delete("files/a/file-1")  # a second job on the same file and settings reads only the shards
    assert build_tokenized(*args) == ref
