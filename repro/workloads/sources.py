"""Reading dataset files robustly: locate, JSON array, JSON lines, parquet.

Malformed rows are skipped and counted by the callers; a file that cannot be parsed
at all raises `WorkloadError` naming the file. A JSON array whose end is missing (a
truncated download, or the packaged ShareGPT file, which stops mid-record after
~120 MB) yields every complete record before the cut; the cut record counts as one
malformed row and `truncated=True` is reported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from repro.workloads.base import MissingDataError, WorkloadError

_SEP = re.compile(r"[\s,]*")


@dataclass
class JsonArrayRead:
    rows: list[Any]
    truncated: bool
    undecodable: int  # records that could not be decoded (the cut one, if truncated)


def read_json_array(path: Path) -> JsonArrayRead:
    """All complete top-level elements of a JSON array file."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from exc
    start = _SEP.match(text, 0).end()
    if start >= len(text) or text[start] != "[":
        raise WorkloadError(f"{path} is not a JSON array file (expected '[' at the start)")
    dec = json.JSONDecoder()
    i = start + 1
    n = len(text)
    rows: list[Any] = []
    truncated = False
    undecodable = 0
    while True:
        i = _SEP.match(text, i).end()
        if i >= n:  # no closing bracket
            truncated = True
            break
        if text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            # Cannot resynchronise inside a JSON array: everything from here is lost.
            undecodable += 1
            truncated = True
            if not rows:
                raise WorkloadError(f"{path} cannot be parsed as JSON: {exc}") from exc
            break
        rows.append(obj)
    return JsonArrayRead(rows=rows, truncated=truncated, undecodable=undecodable)


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or None if the line is not valid JSON); blank lines skipped."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from exc
    with f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                yield lineno, json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                yield lineno, None


def read_parquet_column(path: Path, column: str) -> list[Any]:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=[column])
    except Exception as exc:  # pyarrow raises several types for a bad file / missing column
        raise WorkloadError(f"cannot read column {column!r} from parquet file {path}: {exc}") from exc
    return table.column(column).to_pylist()


def data_files(path: Path, exts: tuple[str, ...]) -> list[Path]:
    """`path` itself, or the files with these extensions directly inside it (sorted)."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(exts))
    return []


def missing_data(workload: str, path: Path, dataset_id: str, how: str) -> MissingDataError:
    return MissingDataError(
        f"workload {workload!r}: data file not found: {path}\n"
        f"  dataset: {dataset_id}\n"
        f"  put it there ({how}), or set workload.path=<file or folder>, "
        f"or REPRO_DATA_DIR=<folder>, or use workload.source=synthetic for the labelled stand-in"
    )


def files_digest(files: list[Path], sha256_of) -> tuple[str, int]:
    """Combined sha256 of several data files (name + per-file sha256) and their total size."""
    import hashlib

    if len(files) == 1:
        return sha256_of(files[0]), files[0].stat().st_size
    h = hashlib.sha256()
    total = 0
    for f in files:
        h.update(f.name.encode() + b"\0" + sha256_of(f).encode() + b"\0")
        total += f.stat().st_size
    return h.hexdigest(), total
