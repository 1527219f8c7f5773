"""Reading back the run file (``.wandb``) the real ``wandb`` package writes, as tests check what
``gyre run --metrics wandb`` logged without reaching W&B's servers."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb


def wandb_records(path: Path) -> list[pb.Record]:
    """The records of a ``.wandb`` run file: a 7-byte header, then 32 KiB blocks of chunks, each
    a 7-byte header (CRC, length, type: 1 whole, 2 first, 3 middle, 4 last) and its bytes."""
    data, records, pending, pos, block = path.read_bytes(), [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def key_of(item: pb.HistoryItem | pb.SummaryItem) -> str:
    return item.key or "/".join(item.nested_key)  # a key with "/" is written as its parts


def history(records: list[pb.Record]) -> dict[int, dict[str, str]]:
    return {
        r.history.step.num: {key_of(i): i.value_json for i in r.history.item if not key_of(i).startswith("_")}
        for r in records
        if r.WhichOneof("record_type") == "history"
    }


def whole_records(path: Path, timeout_s: float = 60.0) -> list[pb.Record]:
    """The records of ``path`` once it is whole: wandb's writer is a process of its own, and the
    file is complete when its last record is the run's exit."""
    deadline = time.monotonic() + timeout_s
    records = wandb_records(path) if path.exists() else []
    while not records or records[-1].WhichOneof("record_type") != "exit":
        assert time.monotonic() < deadline, [r.WhichOneof("record_type") for r in records]
        time.sleep(0.2)
        records = wandb_records(path) if path.exists() else []
    return records
