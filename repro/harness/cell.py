"""Run one grid cell into results/<exp>/<sig>/ — the same function for every launcher.

Order of work (a crash at any point loses nothing already finished and leaves no corrupt
file behind: every write is atomic, see repro.results.store):
1. summary.json present -> the cell is finished: skip it.
2. Otherwise the folder holds at most an unfinished attempt (killed or failed): clear it.
3. config.yaml (the resolved cell config, sorted keys).
4. The backend runs (W&B tracking alongside, never in the way; live cells stream to W&B).
5. requests.parquet (RECORD_COLUMNS, deterministic bytes), timings.json (the backend's
   wall-clock timings at the top level + a `harness` entry: backend wall time, host, pid, start;
   never part of any identity check), timeseries.parquet (repro.tracking.series; not with
   tracking=disabled), then summary.json LAST (repro.metrics.summarize + provenance), then
   the cell's W&B run (repro.tracking).
   A backend that returns a plain dict (theory) has no requests.parquet: that dict is the
   summary.
A failing cell writes error.txt (the traceback) and no summary.json; the sweep goes on.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Mapping

from repro.harness import faults
from repro.results import CellStore

CONFIG = "config.yaml"
REQUESTS = "requests.parquet"
TIMINGS = "timings.json"
ERROR = "error.txt"

# Packages whose versions go into every summary's provenance (same env -> same bytes).
VERSIONED_PACKAGES = ("numpy", "pandas", "pyarrow", "hydra-core", "omegaconf", "scipy")


@dataclass
class CellSpec:
    """Everything a worker process needs to run one cell (plain, picklable)."""

    index: int
    label: str
    config: dict
    signature: str
    results_dir: str  # absolute
    exp_name: str


@dataclass
class CellOutcome:
    index: int
    signature: str
    status: str  # "ran" | "skipped" | "failed"
    dir: str
    summary: dict | None = None
    error: str | None = None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


def package_versions() -> dict[str, str]:
    import repro

    out = {"repro": repro.__version__, "python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def provenance(cfg: Mapping[str, Any], backend_provenance: Mapping[str, Any] | None, signature: str) -> dict:
    """Backend's provenance first; the harness fills what it left out (nothing machine-specific)."""
    prov = dict(backend_provenance or {})
    model = cfg.get("model") or {}
    hardware = cfg.get("hardware") or {}
    workload = cfg.get("workload") or {}
    prov.setdefault("backend", (cfg.get("backend") or {}).get("name"))
    if (cfg.get("backend") or {}).get("name") != "theory":
        prov.setdefault("model", model.get("name"))
        prov.setdefault("gpu", hardware.get("name"))
        prov.setdefault("workload", {"name": workload.get("name")})
        prov.setdefault("policy_name", cfg.get("policy_name"))
    prov.setdefault("seed", cfg.get("seed"))
    prov.setdefault("signature", signature)
    versions = package_versions()
    versions.update(prov.get("versions") or {})
    prov["versions"] = versions
    return prov


def _clear_unfinished(store: CellStore) -> None:
    """Remove an unfinished attempt (partial files, temp files, its W&B dir, error.txt)."""
    if not store.dir.exists():
        return
    for child in store.dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _records_frame(records: Any):
    import pandas as pd

    from repro.backends.base import RECORD_COLUMNS

    if not isinstance(records, pd.DataFrame):
        raise TypeError(f"backend returned records of type {type(records).__name__}, expected a pandas DataFrame")
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"backend records lack columns {missing} (RECORD_COLUMNS: {list(RECORD_COLUMNS)})")
    return records.loc[:, list(RECORD_COLUMNS)].reset_index(drop=True)


def run_cell_spec(spec: CellSpec) -> CellOutcome:
    """Run (or skip) one cell. Never raises for a failing backend: the outcome says so."""
    from omegaconf import OmegaConf

    from repro.backends import get_backend
    from repro.backends.base import CellResult
    from repro.metrics import summarize
    from repro.tracking import start_cell_tracking

    t0 = time.perf_counter()
    store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
    out = CellOutcome(spec.index, spec.signature, "skipped", str(store.dir))
    if store.is_finished():
        out.summary = store.read_summary()
        return out

    _clear_unfinished(store)
    cfg = spec.config
    store.write_text(CONFIG, OmegaConf.to_yaml(OmegaConf.create(cfg), sort_keys=True))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    tracker = start_cell_tracking(
        cfg.get("tracking"),
        cell_dir=store.dir,
        signature=spec.signature,
        exp_name=spec.exp_name,
        config=cfg,
        name=spec.label,
    )
    failed = True
    try:
        faults.checkpoint("start")
        backend = get_backend(str(cfg["backend"]["name"]))
        tb0 = time.perf_counter()
        result = backend.run_cell(OmegaConf.create(cfg), progress=tracker.progress)
        backend_s = time.perf_counter() - tb0

        records = None
        if isinstance(result, CellResult):
            records = _records_frame(result.records)
            summary = summarize(records, provenance(cfg, result.provenance, spec.signature))
            backend_timings = dict(result.timings or {})
            store.write_parquet(REQUESTS, records)
        elif isinstance(result, Mapping):
            summary = {k: v for k, v in result.items() if k not in ("provenance", "timings")}
            summary["provenance"] = provenance(cfg, result.get("provenance"), spec.signature)
            backend_timings = dict(result.get("timings") or {})
        else:
            raise TypeError(f"backend returned {type(result).__name__}, expected CellResult or dict")

        timings = dict(backend_timings)  # the backend's own keys at the top (as the theory CLI writes them)
        timings["harness"] = {
            "backend_wall_s": backend_s,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_utc": started,
        }
        store.write_json(TIMINGS, timings)
        tracker.write_series(store.dir, records, getattr(result, "samples", None))  # timeseries.parquet
        faults.checkpoint("before_summary")
        store.write_json("summary.json", summary)  # last: marks the cell finished
        failed = False
        out.status, out.summary = "ran", summary
        tracker.progress(1.0)
        tracker.log_result(summary, records)
    except Exception as exc:
        out.status = "failed"
        out.error = f"{type(exc).__name__}: {exc}"
        try:
            store.write_text(ERROR, traceback.format_exc())
        except Exception:  # the error itself is in the outcome
            pass
    finally:
        tracker.finish(failed=failed)
        out.wall_s = time.perf_counter() - t0
    return out
