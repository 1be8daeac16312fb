"""The per-cell result folder, results/<exp>/<sig>/: its one owner (every file name, read and write).

Every file is written atomically (repro.fileio: temp file in the same directory, fsynced, renamed
over the target), so a killed process leaves either the old file or the new one, never half a file.
`finish(summary)` ends a cell: it writes the checksum manifest `checksums.sha256` (sha256sum's
format, `sha256sum -c checksums.sha256` checks it) over every file of the folder and the summary
about to be written, then `summary.json` LAST: its presence marks a finished cell, which is what
lets a re-run sweep skip finished cells.

A finished cell is then `intact`, `unsealed` (no manifest: made before manifests existed, or by
another tool; rerun like a stale cell) or `damaged` (a file changed, truncated or removed since it
was sealed, or a local requests.parquet that is not the one requests.sha256 names; rerun, never
read as data). requests.parquet is covered through requests.sha256 (the parquet itself is
git-ignored, so a clone has only its hash). Sub-folders (the W&B run files) and hidden files
(the lock, temp files) are not covered: they are rebuilt or belong to the process at work.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from repro.fileio import dumps_json, sha256_file, write_atomic, write_json_atomic

SUMMARY = "summary.json"


class DamagedCell(RuntimeError):
    """A finished cell's files do not match its checksum manifest (or cannot be read)."""


class CellStore:
    """results/<exp>/<sig>/ : config.yaml, requests.parquet + requests.sha256, timings.json,
    timeseries.parquet, fingerprint.json, checksums.sha256, summary.json (last)."""

    CONFIG = "config.yaml"
    REQUESTS = "requests.parquet"
    REQUESTS_SHA256 = "requests.sha256"
    TIMINGS = "timings.json"
    SERIES = "timeseries.parquet"
    FINGERPRINT = "fingerprint.json"
    ERROR = "error.txt"
    MANIFEST = "checksums.sha256"
    SUMMARY = SUMMARY
    LOCK = ".lock"

    def __init__(self, root: str | os.PathLike, exp: str, sig: str):
        self.dir = Path(root) / exp / sig

    @classmethod
    def at(cls, cell_dir: str | os.PathLike) -> "CellStore":
        d = Path(cell_dir)
        return cls(d.parent.parent, d.parent.name, d.name)

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def summary_path(self) -> Path:
        return self.dir / SUMMARY

    def is_finished(self) -> bool:
        return self.summary_path.is_file()

    def is_failed(self) -> bool:
        return not self.is_finished() and (self.dir / self.ERROR).is_file()

    # -- reading ------------------------------------------------------------------------------

    def read_json(self, name: str) -> Any:
        try:
            return json.loads((self.dir / name).read_text())
        except ValueError as exc:  # truncated, edited by hand: name the cell, not just the parser
            raise DamagedCell(f"{self.dir}: {name} is not valid JSON ({exc})") from None

    def read_summary(self) -> dict:
        return self.read_json(SUMMARY)

    def read_config(self) -> dict:
        import yaml

        path = self.dir / self.CONFIG
        if not path.is_file():
            raise DamagedCell(f"{self.dir}: no {self.CONFIG}")
        try:
            return yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise DamagedCell(f"{self.dir}: {self.CONFIG} is not valid YAML ({exc})") from None

    def requests_sha256(self) -> str | None:
        """The requests.parquet hash recorded beside it (None: a cell without records)."""
        try:
            return (self.dir / self.REQUESTS_SHA256).read_text().split()[0]
        except (OSError, IndexError):
            return None

    def manifest(self) -> dict[str, str] | None:
        """{file name: sha256} from checksums.sha256 (None: none written)."""
        try:
            text = (self.dir / self.MANIFEST).read_text()
        except FileNotFoundError:
            return None
        out = {}
        for line in text.splitlines():
            digest, sep, name = line.partition("  ")
            if not sep or len(digest) != 64:
                raise DamagedCell(f"{self.dir}: {self.MANIFEST} has a malformed line {line!r}")
            out[name] = digest
        return out

    def integrity(self) -> tuple[str, list[str]]:
        """("intact" | "unsealed" | "damaged", what is wrong) of a finished cell's files."""
        try:
            listed = self.manifest()
        except (DamagedCell, OSError, UnicodeDecodeError) as exc:
            return "damaged", [str(exc) if isinstance(exc, DamagedCell) else f"{self.MANIFEST}: {exc}"]
        problems: list[str] = []
        if listed is None:
            return "unsealed", [f"no {self.MANIFEST} (made before cells were sealed, or by another tool)"]
        edited = self._manifest_rewritten()
        for name, digest in sorted(listed.items()):
            try:
                if sha256_file(self.dir / name) != digest:
                    problems.append(
                        f"{name} does not match its digest in {self.MANIFEST}, which was written after summary.json "
                        f"(the manifest was edited?)"
                        if edited
                        else f"{name} changed since the cell was finished"
                    )
            except FileNotFoundError:
                problems.append(f"{name} is missing")
            except OSError as exc:
                problems.append(f"{name}: {exc}")
        for name in self._covered_files():
            if name not in listed:
                problems.append(f"{name} was added after the cell was finished")
        recorded = self.requests_sha256()
        parquet = self.dir / self.REQUESTS
        if parquet.is_symlink() or (parquet.exists() and not parquet.is_file()):  # a folder in its place
            problems.append(f"{self.REQUESTS} is not a plain file")
        if recorded is not None and parquet.is_file() and sha256_file(parquet) != recorded:
            problems.append(f"{self.REQUESTS} is not the one {self.REQUESTS_SHA256} names")
        return ("damaged", problems) if problems else ("intact", [])

    def _manifest_rewritten(self) -> bool:
        """The manifest is newer than summary.json, which `finish` writes after it."""
        try:
            return (self.dir / self.MANIFEST).stat().st_mtime_ns > self.summary_path.stat().st_mtime_ns
        except OSError:
            return False

    def _covered_files(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(
            e.name
            for e in os.scandir(self.dir)
            if e.is_file(follow_symlinks=False)
            and not e.name.startswith(".")
            and e.name not in (self.MANIFEST, self.REQUESTS, self.ERROR)
        )

    # -- writing ------------------------------------------------------------------------------

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

    def write_requests(self, df) -> Path:
        """requests.parquet and requests.sha256 (its hash: committed while the parquet is not)."""
        parquet = self.write_parquet(self.REQUESTS, df)
        self.write_text(self.REQUESTS_SHA256, f"{sha256_file(parquet)}  {self.REQUESTS}\n")
        return parquet

    def finish(self, summary: dict | bytes) -> Path:
        """Seal the cell: the manifest over its files and `summary`, then summary.json (last)."""
        data = summary if isinstance(summary, bytes) else dumps_json(summary).encode()
        sums = {name: sha256_file(self.dir / name) for name in self._covered_files() if name != SUMMARY}
        sums[SUMMARY] = hashlib.sha256(data).hexdigest()
        self.write_text(self.MANIFEST, "".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))
        return self.write_bytes(SUMMARY, data)
