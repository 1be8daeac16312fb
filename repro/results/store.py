"""The per-cell result folder.

Every file is written atomically (repro.fileio: temp file in the same directory,
fsynced, renamed over the target), so a killed process leaves either the old file
or the new one, never half a file. `summary.json` is written last: its presence
marks a finished cell, which is what lets a re-run sweep skip finished cells.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from repro.fileio import write_atomic, write_json_atomic

SUMMARY = "summary.json"


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
        return write_atomic(self.dir / name, data)

    def write_text(self, name: str, text: str) -> Path:
        return write_atomic(self.dir / name, text)

    def write_json(self, name: str, obj: Any) -> Path:
        return write_json_atomic(self.dir / name, obj)

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
