"""Read back what wandb wrote for an offline run: the records of its `run-<id>.wandb` file.

wandb 0.31 has no public reader of its transaction log (wandb.sdk.internal.datastore is gone;
`wandb sync` only uploads), and an offline run writes no `files/wandb-summary.json`. The file is
LevelDB's log format (32 KiB blocks of records, each a 7-byte header: CRC32C, length, type
FULL/FIRST/MIDDLE/LAST) after a 7-byte `:W&B` header, and each record is a protobuf
`wandb.proto.wandb_internal_pb2.Record`, parsed here with wandb's own classes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    assert data[:4] == b":W&B", "not a wandb transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@dataclass
class OfflineRun:
    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)  # one dict per logged step, with `_step`
    summary: dict = field(default_factory=dict)
    exit_code: int | None = None


def read_offline_run(run_dir: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = run_dir.glob("run-*.wandb")
    out = OfflineRun()
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.run_id, out.project, out.entity, out.name = run.run_id, run.project, run.entity, run.display_name
            out.tags = list(run.tags)
            out.config.update(_items(run.config.update))
        elif kind == "config":
            out.config.update(_items(record.config.update))
        elif kind == "history":
            out.history.append(_items(record.history.item))
        elif kind == "summary":
            out.summary.update(_items(record.summary.update))
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out


def offline_runs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline run directories wandb made for `run_id` under `wandb_dir`."""
    return sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def finished_offline_run(wandb_dir: Path, run_id: str, timeout: float = 600) -> OfflineRun:
    """The one offline run of `run_id`, once its exit record is on disk: `run.finish()` returns
    before wandb-core has flushed the file to its end."""
    from tests.utils.polling import until

    def read():
        runs = offline_runs(wandb_dir, run_id)
        if len(runs) == 1 and list(runs[0].glob("run-*.wandb")):
            run = read_offline_run(runs[0])
            return run if run.exit_code is not None else None
        assert len(runs) <= 1, runs
        return None

    return until(read, f"finished wandb run {run_id}", timeout=timeout, interval=0.5)
