"""Write a W&B offline run (the `.wandb` transaction log `wandb sync` uploads) without the SDK.

Why: through the SDK a logged point costs ~0.1-0.25 ms of IPC to the wandb-core service, a run
~10 ms of init/finish, and `import wandb` ~0.3 s per process — several times the whole cost
budget of tracking a 0.1 s simulated cell (issue 16: <= ~20 ms). A simulated cell's series is
complete when the cell ends, so its offline run is written here directly, in one pass, with the
record sequence the SDK itself writes for an offline run (header, run, metric definitions, one
history record per point, summary, exit); tests/tracking compare what `wandb leet inspect` reads
from it with an SDK-written run of the same data. Live cells and `--mode online` use the SDK.

Format (the one wandb-core reads): the file starts with ":W&B", magic 0xBEE1 (little endian)
and version 0; then LevelDB-log records in 32 KiB blocks, each chunk = crc32 (IEEE, over the
chunk type byte then the data) + length (uint16) + type (1 full, 2 first, 3 middle, 4 last);
a block tail shorter than a chunk header is zero-filled. Each record is a serialized
`wandb_internal.Record` protobuf; the few fields used are encoded below by field number (the
numbers come from wandb's wandb_internal.proto; a test checks the bytes against the real
protobuf classes).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from repro.fileio import write_atomic

BLOCK = 32768
HEADER = 7
FILE_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_CHUNK_CRC = [zlib.crc32(bytes([t])) for t in range(5)]
PRODUCER = "repro"  # HeaderRecord.version_info.producer
MIN_CONSUMER = "0.70.0"  # what wandb-core 0.31 writes


# -- protobuf wire format (varint = 0, length-delimited = 2, fixed64 = 1) -----------------------
def _varint_slow(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_SMALL = [_varint_slow(i) for i in range(1 << 14)]  # the lengths of nearly every field


def _varint(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 16384 else _varint_slow(n)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _int(field: int, n: int) -> bytes:
    return _key(field, 0) + _varint(int(n)) if n else b""


def _bool(field: int, v: bool) -> bytes:
    return _key(field, 0) + b"\x01" if v else b""


# Field numbers (wandb_internal.proto)
R_NUM, R_HISTORY, R_SUMMARY, R_CONFIG, R_METRIC, R_RUN, R_EXIT, R_HEADER = 1, 2, 3, 5, 12, 17, 18, 21
ITEM_KEY, ITEM_NESTED, ITEM_VALUE = 1, 2, 16  # ConfigItem / SummaryItem / HistoryItem
_ITEM_VALUE_KEY = _key(ITEM_VALUE, 2)
_ITEM_TAG = _key(1, 2)


def _item(key: str, value_json: str) -> bytes:
    """A HistoryItem/SummaryItem/ConfigItem body: nested_key=[key], value_json."""
    v = value_json.encode()
    return _str(ITEM_NESTED, key) + _ITEM_VALUE_KEY + _varint(len(v)) + v


def _config_item(key: str, value_json: str) -> bytes:
    return _str(ITEM_KEY, key) + _str(ITEM_VALUE, value_json)


def value_json(v: Any) -> str | None:
    """JSON of a logged value; None for what is not logged (None, NaN, +-inf)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else None
    if hasattr(v, "item") and callable(v.item) and not isinstance(v, (Mapping, list, tuple)):
        return value_json(v.item())  # numpy scalar
    return json.dumps(_finite(v), sort_keys=True, default=str, allow_nan=False)


def _finite(v: Any) -> Any:
    """NaN / inf inside a nested value -> None (JSON has neither)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return _finite(v.item())
    return v


def run_record(
    *,
    run_id: str,
    project: str,
    entity: str | None,
    group: str,
    job_type: str,
    name: str,
    tags: Sequence[str],
    config: Mapping[str, Any],
    start_time: datetime,
    host: str,
) -> bytes:
    cfg = b"".join(_bytes(1, _config_item(k, json.dumps(_finite(v), default=str))) for k, v in config.items())
    ts = start_time.timestamp()
    stamp = _int(1, int(ts)) + _int(2, int(round((ts - int(ts)) * 1e9)))
    body = (
        _str(1, run_id)
        + (_str(2, entity) if entity else b"")
        + _str(3, project)
        + _bytes(4, cfg)
        + _str(6, group)
        + _str(7, job_type)
        + _str(8, name)
        + b"".join(_str(10, t) for t in tags)
        + _str(13, host)
        + _bytes(17, stamp)
    )
    return _bytes(R_RUN, body)


def header_record() -> bytes:
    return _bytes(R_HEADER, _bytes(1, _str(1, PRODUCER) + _str(2, MIN_CONSUMER)))


def metric_record(*, name: str = "", glob_name: str = "", step_metric: str = "") -> bytes:
    options = _bool(1, bool(step_metric)) + _bool(3, True)  # step_sync, defined
    body = (_str(1, name) if name else b"") + (_str(2, glob_name) if glob_name else b"")
    body += (_str(4, step_metric) if step_metric else b"") + _bytes(6, options)
    return _bytes(R_METRIC, body)


def history_record(step: int, items: Iterable[tuple[str, str]]) -> bytes:
    body = b"".join(_bytes(1, _item(k, v)) for k, v in items)
    body += _bytes(2, _int(1, step))
    return _bytes(R_HISTORY, body)


def _column_items(prefix: bytes, values: Sequence[Any], fmt: str | None = None) -> list[bytes]:
    """The encoded HistoryItem (tag + length + body) of each value of one column; b"" = not logged.
    `fmt`: float format (".9g" for float32 columns: exact, half the bytes of repr)."""
    small, finite, tag = _SMALL, math.isfinite, _ITEM_TAG
    out: list[bytes] = []
    for v in values:
        if v.__class__ is float:
            if not finite(v):
                out.append(b"")
                continue
            vb = (format(v, fmt) if fmt else repr(v)).encode()
        elif v.__class__ is int:
            vb = str(v).encode()
        else:
            sj = value_json(v)
            if sj is None:
                out.append(b"")
                continue
            vb = sj.encode()
        body = prefix + small[len(vb)] + vb
        out.append(tag + _varint(len(body)) + body)
    return out


def history_records(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    runtime: Sequence[float],
    t0: float,
    formats: Sequence[str | None] | None = None,
):
    """history_record() of every row (+ _step/_runtime/_timestamp; NaN cells left out), encoded
    column by column with the per-column bytes precomputed: the hot loop of a cell's run."""
    rows = list(rows)
    n = len(rows)
    runtime = [float(r) for r in runtime][:n]
    cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in columns]
    cols += [list(range(n)), runtime, [t0 + r for r in runtime]]
    names = (*columns, "_step", "_runtime", "_timestamp")
    fmts = [*(formats or [None] * len(columns)), None, None, None]
    encoded = [_column_items(_str(ITEM_NESTED, c) + _ITEM_VALUE_KEY, vals, f) for c, vals, f in zip(names, cols, fmts)]
    for step, items in enumerate(zip(*encoded)):
        body = b"".join(items) + _bytes(2, _int(1, step))
        yield _key(R_HISTORY, 2) + _varint(len(body)) + body


def summary_record(items: Iterable[tuple[str, str]]) -> bytes:
    return _bytes(R_SUMMARY, b"".join(_bytes(1, _item(k, v)) for k, v in items))


def exit_record(exit_code: int, runtime_s: float) -> bytes:
    return _bytes(R_EXIT, _int(1, exit_code) + _int(2, int(runtime_s)))


def frame(records: Iterable[bytes]) -> bytes:
    """The whole .wandb file: file header + LevelDB-log chunks; record i gets num = i + 1."""
    out = bytearray(FILE_HEADER)
    for num, rec in enumerate(records, start=1):
        data = _int(R_NUM, num) + rec
        first = True
        while True:
            room = BLOCK - len(out) % BLOCK
            if room < HEADER:
                out += b"\0" * room
                room = BLOCK
            n = min(len(data), room - HEADER)
            piece, data = data[:n], data[n:]
            ctype = (1 if not data else 2) if first else (4 if not data else 3)
            crc = zlib.crc32(piece, _CHUNK_CRC[ctype])
            out += struct.pack("<IHB", crc, n, ctype) + piece
            first = False
            if not data:
                break
    return bytes(out)


def history_items(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, runtime: Sequence[float], t0: float):
    """Per row: (key, value_json) pairs incl. _step/_runtime/_timestamp, NaN cells left out."""
    for step, (row, rt) in enumerate(zip(rows, runtime)):
        items = [(c, s) for c, v in zip(columns, row) if (s := value_json(v)) is not None]
        items.append(("_step", str(step)))
        items.append(("_runtime", repr(float(rt))))
        items.append(("_timestamp", repr(t0 + float(rt))))
        yield step, items


def write_offline_run(
    wandb_dir: str | os.PathLike,
    *,
    run_id: str,
    project: str,
    entity: str | None,
    group: str,
    job_type: str,
    name: str,
    tags: Sequence[str],
    config: Mapping[str, Any],
    summary: Mapping[str, Any],
    time_key: str | None,
    columns: Sequence[str] = (),
    rows: Iterable[Sequence[Any]] = (),
    runtime: Sequence[float] = (),
    formats: Sequence[str | None] | None = None,
    runtime_s: float = 0.0,
    start_time: datetime | None = None,
    host: str = "repro",
    failed: bool = False,
) -> Path:
    """Write `wandb_dir`/offline-run-<time>-<id>/run-<id>.wandb (replacing earlier ones of this id)."""
    start_time = start_time or datetime.now(timezone.utc)
    wandb_dir = Path(wandb_dir)
    for old in wandb_dir.glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(old, ignore_errors=True)
    run_dir = wandb_dir / f"offline-run-{start_time.astimezone(timezone.utc):%Y%m%d_%H%M%S}-{run_id}"
    (run_dir / "files").mkdir(parents=True, exist_ok=True)
    t0 = start_time.timestamp()

    def records():
        yield header_record()
        yield run_record(
            run_id=run_id,
            project=project,
            entity=entity,
            group=group,
            job_type=job_type,
            name=name,
            tags=tags,
            config=config,
            start_time=start_time,
            host=host,
        )
        if time_key:
            yield metric_record(name=time_key)
            yield metric_record(glob_name="*", step_metric=time_key)
        yield from history_records(columns, rows, runtime=runtime, t0=t0, formats=formats)
        items = [(k, s) for k, v in summary.items() if (s := value_json(v)) is not None]
        items.append(("_runtime", repr(float(runtime_s))))
        yield summary_record(items)
        yield exit_record(1 if failed else 0, runtime_s)

    # temp file + rename, no fsync: a run file is rebuilt from the cell's files at any time
    # (python -m repro.tracking.upload), so it is not worth a disk flush per cell
    write_atomic(run_dir / f"run-{run_id}.wandb", frame(records()), fsync=False)
    return run_dir


__all__ = ["frame", "value_json", "write_offline_run"]
