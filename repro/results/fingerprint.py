"""Input fingerprints: what decides a cell's numbers besides its config (docs/ARCHITECTURE.md "Freshness").

A fingerprint is a plain JSON dict with four parts, each a sorted mapping:
  code          module file -> sha256 of its AST without docstrings, for the import closure of
                the cell's entry modules: repro's and any out-of-tree code that can change under
                one version (repro.codehash, which computes code, package_data and versions);
  package_data  non-Python files shipped next to those modules (e.g. repro/costmodel/data/*.json);
  data          the external data a cell reads (workload file sha256, given by the caller);
  versions      the released distributions the closure imports, and Python's major.minor.
and `fingerprint`, the sha256 of the four. Modules named in `exclude` (tracking, figures, the
harness's orchestration) are not followed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from repro import codehash
from repro.fileio import sha256_json
from repro.results.store import CellStore

FINGERPRINT = CellStore.FINGERPRINT
FORMAT = 1


PYTHON_VERSION = codehash.PYTHON_VERSION
file_sha256 = codehash.file_sha256


def code_fingerprint(roots: Sequence[str], *, root_dir: Path, exclude: Sequence[str] = ()) -> dict:
    """{code, package_data, versions} of the import closure of `roots` (repro.codehash)."""
    return codehash.code_fingerprint(roots, root_dir=root_dir, exclude=exclude)


def finish(parts: Mapping[str, Any]) -> dict:
    """The full fingerprint dict: the parts plus `fingerprint` (sha256 of the parts) and `format`."""
    body = {k: parts[k] for k in ("code", "package_data", "data", "versions")}
    return {"format": FORMAT, "fingerprint": sha256_json(body), **body}


def differences(old: Mapping[str, Any] | None, new: Mapping[str, Any], limit: int = 4) -> list[str]:
    """Why `old` is not `new`, in words ("code: repro/routing/lbgr.py changed", ...)."""
    if not old:
        return ["no fingerprint.json (made before fingerprints were recorded, or by another tool)"]
    if old.get("fingerprint") == new.get("fingerprint"):
        return []
    out: list[str] = []
    for part in ("code", "package_data", "data", "versions"):
        a, b = old.get(part) or {}, new.get(part) or {}
        for k in sorted(set(a) | set(b)):
            if a.get(k) == b.get(k):
                continue
            if k not in a:
                out.append(f"{part}: {k} added")
            elif k not in b:
                out.append(f"{part}: {k} removed")
            elif part == "versions":
                out.append(f"versions: {k} {a[k]} -> {b[k]}")
            else:
                out.append(f"{part}: {k} changed")
    if not out:
        out.append("fingerprint format changed")
    if len(out) > limit:
        out = out[:limit] + [f"... {len(out) - limit} more"]
    return out


def read_fingerprint(cell_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(cell_dir) / FINGERPRINT).read_text())
    except (OSError, ValueError):
        return None
