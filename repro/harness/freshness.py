"""Is a finished cell fresh? Its fingerprint (repro.results.fingerprint) against the checkout's.

A cell's inputs besides its config: the code it runs — the import closure of its backend
module, of every `_target_` in the part of its config the backend reads (its `identity`: a
theory cell names no router) and of the writers of its files (repro.metrics,
repro.results.store), out-of-tree modules included (repro.codehash) — the files shipped with
that code (cost-model profile),
the workload's data file (sha256, from the workload's own `resolve_data`) and the versions of
the libraries the closure imports. Not inputs: the harness's orchestration, tracking, figures.

States of a cell folder: `missing` (no summary.json), `fresh` (finished, fingerprint.json equal
to what this checkout computes), `stale` (finished, but made by other code/data/libraries, or
before fingerprints were recorded). See docs/ARCHITECTURE.md "Freshness".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from repro.codehash import stat_identity
from repro.confutil import PROJECT_ROOT
from repro.results import fingerprint as fp
from repro.results.store import SUMMARY, CellStore

# Modules that write a cell's files from the backend's result (their code decides the bytes).
WRITER_MODULES = ("repro.metrics", "repro.results.store")
# Never change a number: not followed when collecting the closure.
NOT_INPUTS = ("repro.tracking", "repro.figures", "repro.harness")

_data_memo: dict[str, dict] = {}


def _yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~20x faster than the pure-Python loader


def use_project_cache() -> None:
    """Entry points: the workload cache and checksum memo go to <project>/.cache, not the cwd."""
    import os

    os.environ.setdefault("REPRO_CACHE_DIR", str(PROJECT_ROOT / ".cache" / "workloads"))


def _targets(node: Any, out: list[str]) -> None:
    if isinstance(node, Mapping):
        t = node.get("_target_")
        if isinstance(t, str):
            parts = t.split(".")
            out.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # non-modules are skipped
        for v in node.values():
            _targets(v, out)
    elif isinstance(node, list):
        for v in node:
            _targets(v, out)


def code_roots(cfg: Mapping) -> list[str]:
    """The backend's module, the file writers and every `_target_` of the cell's identity config."""
    from repro.backends import backend_module_path

    name = str((cfg.get("backend") or {}).get("name"))
    roots = [backend_module_path(name).partition(":")[0], *WRITER_MODULES]
    _targets(_identity(cfg), roots)
    return roots


def _identity(cfg: Mapping) -> Mapping:
    from repro.backends import get_backend

    ident = get_backend(str((cfg.get("backend") or {}).get("name"))).identity
    return ident(cfg) if ident is not None else cfg


def data_inputs(identity_cfg: Mapping) -> dict:
    """{"workload": {kind, sha256}} for cells that read a workload (memoised per process)."""
    wl = identity_cfg.get("workload")
    if not isinstance(wl, Mapping) or not wl.get("_target_"):
        return {}
    key = json.dumps(wl, sort_keys=True, default=str)
    hit = _data_memo.get(key)
    if hit is not None and hit[0] == _stamp(hit[1]):
        return hit[2]
    from repro.workloads import resolve_spec

    src = resolve_spec(dict(wl)).resolve_data()
    value = {"workload": {"kind": src.kind, "sha256": src.sha256}}
    _data_memo[key] = (_stamp(src.path), src.path, value)
    return value


def _stamp(path: Path | None) -> tuple:
    """Stat identities (repro.codehash.stat_identity) of a data file or of a data folder's files."""
    if path is None:
        return ()
    p = Path(path)
    files = sorted(p.iterdir()) if p.is_dir() else [p]
    out = []
    for f in files:
        try:
            out.append((str(f), stat_identity(f.stat())))
        except OSError:
            out.append((str(f), None))
    return tuple(out)


def cell_fingerprint(cfg: Mapping, *, root_dir: Path | None = None) -> dict:
    """The fingerprint this checkout gives a cell with resolved config `cfg`."""
    root = Path(root_dir or PROJECT_ROOT)
    parts = fp.code_fingerprint(code_roots(cfg), root_dir=root, exclude=NOT_INPUTS)
    return fp.finish({**parts, "data": data_inputs(_identity(cfg))})


def cell_state(cell_dir: str | Path, current: Mapping | None) -> tuple[str, list[str]]:
    """("missing" | "fresh" | "stale", reasons) of a cell folder against the current fingerprint."""
    cell_dir = Path(cell_dir)
    if not (cell_dir / SUMMARY).is_file():
        return "missing", []
    if current is None:
        return "fresh", []
    reasons = fp.differences(fp.read_fingerprint(cell_dir), current)
    series = missing_series(cell_dir)
    if series:
        reasons.append(series)
    return ("stale", reasons) if reasons else ("fresh", [])


def missing_series(cell_dir: Path) -> str | None:
    """Why a finished cell lacks a result it should hold: records, tracking on in its own config,
    and no timeseries.parquet (W&B trouble once dropped it; the curves are never made then)."""
    if not (cell_dir / CellStore.REQUESTS_SHA256).is_file() or (cell_dir / CellStore.SERIES).is_file():
        return None
    try:
        mode = (CellStore.at(cell_dir).read_config().get("tracking") or {}).get("mode", "offline")
    except Exception:  # an unreadable config is the integrity check's to report
        return None
    return None if mode == "disabled" else f"no {CellStore.SERIES} although tracking was {mode}"


def folder_report(results_dir: str | Path, experiments: list[str] | None = None) -> dict[str, list[dict]]:
    """Every finished cell under results_dir/<exp>/ with its state, from its own config.yaml."""
    import yaml

    root = Path(results_dir)
    _YAML_LOADER = _yaml_loader()
    exps = experiments or sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    out: dict[str, list[dict]] = {}
    for exp in exps:
        rows = []
        for cell in sorted((root / exp).glob("*/" + SUMMARY)):
            d = cell.parent
            try:
                cfg = yaml.load((d / "config.yaml").read_text(), Loader=_YAML_LOADER)
                state, why = cell_state(d, cell_fingerprint(cfg))
            except Exception as exc:  # unreadable config, unknown backend, missing data file
                state, why = "stale", [f"cannot compute its fingerprint: {type(exc).__name__}: {exc}"]
            rows.append({"sig": d.name, "state": state, "why": why})
        out[exp] = rows
    return out
