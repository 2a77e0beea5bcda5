"""Stand-in bases load through the Auto classes, render like their families, and regenerate
byte for byte; the model source resolves hub/dir/standin as documented."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import torch
from jinja2 import TemplateError
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from catalog.bases import BASES, get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer, parse_model_source, resolve_base_dir
from catalog.standins import MANIFEST, read_manifest, special_tokens, standin_dir
from tests.factories import chat_row

ROOT = Path(__file__).resolve().parents[2]
CONVERSATION = chat_row("The parcel never came.", "delivery", system="Classify the ticket.")["messages"]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One stand-in cache per session, shared by every test module that asks for the same path."""
    root = tmp_path_factory.getbasetemp() / "model-cache"
    for base in BASES.values():
        standin_dir(base, root)
    return root


def _tokenizer(model_cache: Path, base_id: str):
    return AutoTokenizer.from_pretrained(standin_dir(get_base(base_id), model_cache))


def _sha256s(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.parametrize("base_id", list(BASES))
def test_standin_loads_with_auto_classes_and_runs_forward(model_cache, base_id):
    base = get_base(base_id)
    directory = standin_dir(base, model_cache)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert type(model).__name__ == base.architecture
    assert model.config.tie_word_embeddings is base.tied_lm_head
    ids = tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(logits).all()
    with safe_open(directory / "model.safetensors", "pt") as shards:
        assert {shards.get_slice(k).get_dtype() for k in shards.keys()} == {"BF16"}


@pytest.mark.parametrize("base_id", list(BASES))
def test_tokenizer_has_family_tokens_and_encodes_like_its_trained_file(model_cache, base_id):
    base = get_base(base_id)
    directory = standin_dir(base, model_cache)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.eos_token == base.end_of_turn
    assert tokenizer.pad_token is not None and tokenizer.pad_token != tokenizer.eos_token
    for token in special_tokens(base):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert 2000 <= len(tokenizer) <= 4000
    # A transformers tokenizer class may rebuild the pre-tokenizer on load (Qwen2Tokenizer does):
    # the loaded tokenizer must still split text exactly as the trained tokenizer.json.
    trained = Tokenizer.from_file(str(directory / "tokenizer.json"))
    text = "Order 12345 arrived damaged!  Refund it, please.\n\nThanks"
    assert tokenizer.encode(text, add_special_tokens=False) == trained.encode(text, add_special_tokens=False).ids
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert "".join(text[a:b] for a, b in enc["offset_mapping"]) == text


@pytest.mark.parametrize("base_id,bos", [("llama-3.1-8b-instruct", "<|begin_of_text|>"), ("mistral-7b-instruct-v0.3", "<s>")])
def test_bos_families_prepend_bos_like_the_real_tokenizers(model_cache, base_id, bos):
    tokenizer = _tokenizer(model_cache, base_id)
    assert tokenizer.convert_ids_to_tokens(tokenizer("Hello")["input_ids"])[0] == bos
    assert tokenizer.convert_ids_to_tokens(_tokenizer(model_cache, "qwen2.5-0.5b-instruct")("Hello")["input_ids"])[0] != bos


def _gpt_oss_expected(today: str) -> str:
    return (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nClassify the ticket.\n\n<|end|>"
        "<|start|>user<|message|>The parcel never came.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>delivery<|return|>"
    )


QWEN_CHATML = (
    "<|im_start|>system\nClassify the ticket.<|im_end|>\n<|im_start|>user\nThe parcel never came.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EXPECTED = {
    "qwen2.5-0.5b-instruct": QWEN_CHATML + "delivery<|im_end|>\n",
    "qwen3-8b": QWEN_CHATML + "<think>\n\n</think>\n\ndelivery<|im_end|>\n",
    "qwen3.5-9b": QWEN_CHATML + "<think>\n\n</think>\n\ndelivery<|im_end|>\n",
    # v0.3 writes the system message only into a final user turn: a row ending with an answer loses it.
    "mistral-7b-instruct-v0.3": "<s>[INST] The parcel never came.[/INST] delivery</s>",
    "llama-3.1-8b-instruct": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nClassify the ticket.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThe parcel never came.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\ndelivery<|eot_id|>"
    ),
}


@pytest.mark.parametrize("base_id", [*EXPECTED, "gpt-oss-20b"])
def test_template_renders_a_conversation_like_the_family(model_cache, base_id):
    tokenizer = _tokenizer(model_cache, base_id)
    before = date.today().isoformat()
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, enable_thinking=False)
    if base_id == "gpt-oss-20b":
        assert text in {_gpt_oss_expected(before), _gpt_oss_expected(date.today().isoformat())}
    else:
        assert text == EXPECTED[base_id]


def test_qwen25_adds_its_default_system_prompt(model_cache):
    text = _tokenizer(model_cache, "qwen2.5-0.5b-instruct").apply_chat_template(
        CONVERSATION[1:2], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nThe parcel never came.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_thinks_only_in_the_final_turn_and_drops_earlier_reasoning(model_cache):
    messages = chat_row("Hi", "<think>\nplan\n</think>\n\nHello", "Bye", "Goodbye", system=None)["messages"]
    tokenizer = _tokenizer(model_cache, "qwen3-8b")
    assert tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nGoodbye<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_gpt_oss_closes_earlier_answers_with_end_and_the_last_with_return(model_cache):
    messages = chat_row("a", "b", "c", "d", system=None)["messages"]
    text = _tokenizer(model_cache, "gpt-oss-20b").apply_chat_template(messages, tokenize=False)
    assert text.endswith(
        "<|start|>user<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|end|>"
        "<|start|>user<|message|>c<|end|><|start|>assistant<|channel|>final<|message|>d<|return|>"
    )


@pytest.mark.parametrize("roles", [("user", "user", "assistant"), ("assistant", "user"), ("user", "system", "assistant")])
def test_mistral_template_refuses_rows_that_do_not_alternate(model_cache, roles):
    messages = [{"role": r, "content": "x"} for r in roles]
    with pytest.raises(TemplateError, match="must alternate user/assistant"):
        _tokenizer(model_cache, "mistral-7b-instruct-v0.3").apply_chat_template(messages, tokenize=False)


def test_manifest_records_base_revision_and_digests(model_cache):
    base = get_base("qwen2.5-0.5b-instruct")
    directory = standin_dir(base, model_cache)
    manifest = read_manifest(directory)
    assert (manifest["base"], manifest["revision"], manifest["hf_repo"]) == (base.id, base.revision, base.hf_repo)
    digests = _sha256s(directory)
    assert manifest["files"] == {k: v for k, v in digests.items() if k != MANIFEST}
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def test_regeneration_in_a_fresh_process_is_byte_identical(model_cache, tmp_path):
    base = get_base("qwen3.5-9b")
    code = (
        "import sys; from pathlib import Path; from catalog.bases import get_base; "
        "from catalog.standins import standin_dir; print(standin_dir(get_base(sys.argv[1]), Path(sys.argv[2])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, base.id, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    again = Path(out.stdout.strip().splitlines()[-1])
    assert _sha256s(again) == _sha256s(standin_dir(base, model_cache))


def test_standin_dir_reuses_a_complete_directory(model_cache):
    directory = standin_dir(get_base("qwen3-8b"), model_cache)
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    assert standin_dir(get_base("qwen3-8b"), model_cache) == directory
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]  # no leftover temp dirs


@pytest.mark.parametrize(
    "value,expected",
    [("hub", ModelSource("hub")), ("standin", ModelSource("standin")), ("dir:/srv/m", ModelSource("dir", Path("/srv/m")))],
)
def test_parse_model_source(value, expected):
    assert parse_model_source(value) == expected


@pytest.mark.parametrize("value", ["", "dir:", "s3://bucket", "Hub"])
def test_parse_model_source_refuses_other_values(value):
    with pytest.raises(ValueError, match="hub, dir:/path/to/mirror, standin"):
        parse_model_source(value)


def test_dir_source_loads_a_plain_mirror_at_the_pinned_revision(model_cache, tmp_path):
    base = get_base("qwen2.5-0.5b-instruct")
    mirror = tmp_path / base.hf_repo
    shutil.copytree(standin_dir(base, model_cache), mirror)
    source = parse_model_source(f"dir:{tmp_path}")
    (mirror / ".openft_revision").write_text("0" * 40 + "\n")
    with pytest.raises(ValueError, match=f"pinned to {base.revision}"):
        resolve_base_dir(base, source, tmp_path / "cache")
    (mirror / ".openft_revision").write_text(base.revision + "\n")
    assert resolve_base_dir(base, source, tmp_path / "cache") == mirror
    model = load_model(base, source, tmp_path / "cache", dtype=torch.bfloat16)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.bfloat16
    assert load_tokenizer(base, source, tmp_path / "cache").eos_token == "<|im_end|>"


def test_dir_source_accepts_an_hf_cache_layout_and_refuses_a_missing_base(model_cache, tmp_path):
    base = get_base("llama-3.1-8b-instruct")
    source = ModelSource("dir", tmp_path)
    with pytest.raises(FileNotFoundError, match=base.revision):
        resolve_base_dir(base, source, tmp_path)
    snapshot = tmp_path / "models--RedHatAI--Llama-3.1-8B-Instruct" / "snapshots" / base.revision
    shutil.copytree(standin_dir(base, model_cache), snapshot)
    assert resolve_base_dir(base, source, tmp_path) == snapshot
    (tmp_path / base.hf_repo).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=".openft_revision"):
        resolve_base_dir(base, source, tmp_path)


def test_standin_source_resolves_to_the_cached_standin(model_cache):
    base = get_base("gpt-oss-20b")
    assert resolve_base_dir(base, ModelSource("standin"), model_cache) == standin_dir(base, model_cache)
    assert json.loads((standin_dir(base, model_cache) / "config.json").read_text())["num_local_experts"] == 4
