"""Atomic writes and the per-cell result folder.

Every file is written to a temp file in the same directory, fsynced, then renamed
over the target, so a killed process leaves either the old file or the new one,
never half a file. `summary.json` is written last: its presence marks a finished
cell, which is what lets a re-run sweep skip finished cells.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"


def _file_mode() -> int:
    """0666 minus the process umask: what open() would give, not mkstemp's private 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # collaborators on shared storage can read results
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline (byte-stable)."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=True) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, dumps_json(obj))


class CellStore:
    """results/<exp>/<sig>/ : config.yaml, requests.parquet, timings.json, summary.json (last)."""

    def __init__(self, root: str | os.PathLike, exp: str, sig: str):
        self.dir = Path(root) / exp / sig

    @property
    def summary_path(self) -> Path:
        return self.dir / SUMMARY

    def is_finished(self) -> bool:
        return self.summary_path.is_file()

    def read_summary(self) -> dict:
        return json.loads(self.summary_path.read_text())

    def write_bytes(self, name: str, data: bytes) -> Path:
        return atomic_write_bytes(self.dir / name, data)

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write_text(self.dir / name, text)

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_json(self.dir / name, obj)

    def write_parquet(self, name: str, df) -> Path:
        """Deterministic parquet bytes: no pandas index, no creation timestamp variance."""
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata(None)
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd", write_statistics=False)
        return self.write_bytes(name, buf.getvalue())
