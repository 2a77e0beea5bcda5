"""Job create on a file whose stored rows are not what its record says (issue 12: a file of batch
lines followed by chat rows, stored as `fine-tune` through a validation bypass, made create answer
500 with `KeyError: 'messages'`). The file is written straight into the store and the files table;
create must refuse it cleanly, naming the line, on the inline path (through the API, SQLite and
PostgreSQL) and on the Ray Data path (the create checks called on the stored file)."""

from __future__ import annotations

import orjson
import pytest

from catalog.bases import get_base
from openft.errors import InvalidRequest
from pipelines.create_checks import check_file_for_base
from storage.objects import open_object_store
from tests.factories import batch_request_line, chat_row, db_stored_file, jsonl, preference_row
from tests.serve_app.test_jobs_api import MARKER, refused

MODEL = "qwen2.5-0.5b-instruct"
CHAT_STATS = {"row_kind": "chat", "rows": 30, "messages": 90, "content_bytes": 3000, "token_upper_bound": 6000,
              "token_estimates": {}}


def swapped(batch_lines: int = 5, chat_rows: int = 25) -> bytes:
    """Batch request lines (a planted marker in their text), then valid chat rows."""
    batch = [batch_request_line(f"r{i}", [{"role": "user", "content": MARKER}]) for i in range(batch_lines)]
    return jsonl([*batch, *(chat_row(f"Question {i}?", "delivery") for i in range(chat_rows))])


@pytest.mark.parametrize("data, line, code", [
    (swapped(), 1, "invalid_messages"),  # a batch line: no `messages`
    (jsonl([chat_row("Hi?", "delivery")] * 12 + [preference_row()] + [chat_row()] * 17), 13, "invalid_file_format"),
    (jsonl([chat_row("Hi?", "delivery")] * 3 + [b'["not", "a", "row"]'] + [chat_row()] * 26), 4, "invalid_json"),
])
def test_create_refuses_rows_of_the_wrong_shape_naming_the_line(account, api, data, line, code):
    client, account_id, _ = account
    file_id = db_stored_file(api.settings, account_id, data, stats=CHAT_STATS)
    body = refused(client, model=MODEL, training_file=file_id)
    assert (body["code"], body["param"]) == (code, "training_file")
    assert body["message"].startswith(f"line {line}")


@pytest.mark.heavy  # a Ray Data job with cold tokenizer workers: 20-60 s here
def test_the_ray_data_path_refuses_the_swapped_file_with_its_global_line(tmp_path, ray_cluster):
    """Above the inline threshold the rows are checked as a Ray Data job over byte ranges."""
    store = open_object_store(f"file://{tmp_path}/objects")
    good = orjson.dumps(chat_row("Where is it?", "delivery")) + b"\n"
    bad = orjson.dumps(batch_request_line("r1", [{"role": "user", "content": MARKER}])) + b"\n"
    store.put_bytes("f.jsonl", good * 40 + bad + good * 40)
    with pytest.raises(InvalidRequest) as info:
        check_file_for_base(store.spec(), "f.jsonl", row_kind="chat", base=get_base(MODEL), model_source="standin",
                            cache_root=tmp_path / "cache", param="training_file", inline_bytes=0,
                            block_bytes=len(good) * 45)
    assert (info.value.code, info.value.param) == ("invalid_messages", "training_file")
    assert info.value.message.startswith("line 41:") and MARKER not in info.value.message
