"""python -m repro.tracking.upload RESULTS_DIR [--mode offline|online] [--project P] [--entity E]

Builds (or rebuilds) the W&B run of every finished cell under RESULTS_DIR (a results root, one
experiment folder or one cell folder) from the cell's files alone: config.yaml, summary.json,
timings.json and timeseries.parquet (the curves; a cell without one gets a summary-only run,
counted in the report). So the committed results, or a Slurm sweep whose nodes had no W&B,
upload with one command.

--mode offline (default): writes <cell>/wandb/offline-run-*/run-<id>.wandb (repro.tracking.
wandb_file; no W&B service, a few ms per cell) — upload those later with `wandb sync` or run
this command again with --mode online. --mode online: the W&B SDK sends each run (needs
`wandb login` or WANDB_API_KEY); runs resume by id, so uploading twice updates the same runs.
Run ids: repro.tracking.runs (unique per results root, stable per cell).

Exit status: 0 every finished cell has its run; 1 some cell failed to upload; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from repro.confutil import flatten
from repro.results.store import CellStore
from repro.tracking import runs
from repro.tracking.series import SERIES_FILE, read_series


def _load_yaml(path: Path) -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader) or {}


def find_cells(path: str | Path) -> list[Path]:
    """Finished cell folders under a root, an experiment folder or one cell folder."""
    path = Path(path)
    if (path / CellStore.SUMMARY).is_file():
        return [path]
    cells = sorted(p.parent for p in path.glob("*/summary.json"))
    if cells:
        return cells
    return sorted(p.parent for p in path.glob("*/*/summary.json"))


def cell_run(
    cell_dir: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    summary: Mapping[str, Any] | None = None,
    timings: Mapping[str, Any] | None = None,
    series=None,
    meta: Mapping[str, Any] | None = None,
    swept: Mapping[str, Any] | None = None,
    tracking: Mapping[str, Any] | None = None,
) -> dict:
    """Everything a cell's W&B run holds; what is not given is read from the cell's files."""
    cell = Path(cell_dir)
    config = dict(config if config is not None else _load_yaml(cell / CellStore.CONFIG))
    if summary is None:
        summary = json.loads((cell / CellStore.SUMMARY).read_text())
    if timings is None:
        tp = cell / CellStore.TIMINGS
        timings = json.loads(tp.read_text()) if tp.is_file() else {}
    if series is None and (cell / SERIES_FILE).is_file():
        series, meta = read_series(cell / SERIES_FILE)
    meta = dict(meta or {})
    if swept is None:
        swept = meta.get("swept") or {}
    track = {**(config.get("tracking") or {}), **{k: v for k, v in (tracking or {}).items() if v is not None}}
    sig = cell.name
    exp = str(config.get("exp_name") or cell.parent.name)
    harness = (timings or {}).get("harness") or {}
    try:
        start = datetime.fromisoformat(str(harness["started_utc"]))
    except (KeyError, ValueError):
        start = datetime.fromtimestamp((cell / CellStore.SUMMARY).stat().st_mtime, timezone.utc)
    wall = float(harness.get("backend_wall_s") or 0.0)
    out = {
        "run_id": runs.run_id(exp, sig, runs.root_id(cell.parent.parent)),
        "project": str(track.get("project") or "repro"),
        "entity": track.get("entity") or None,
        "group": exp,
        "job_type": str((config.get("backend") or {}).get("name") or "cell"),
        "name": runs.display_name(config, swept),
        "tags": runs.tags(config, track.get("tags") or ()),
        "config": runs.flat_config(config, sig),
        "summary": dict(summary),
        "start_time": start,
        "host": str(harness.get("host") or "repro"),
        "runtime_s": wall,
        "time_key": None,
        "columns": [],
        "rows": [],
        "runtime": [],
        "formats": None,
    }
    if series is not None and len(series):
        t = series.iloc[:, 0].to_numpy(dtype=float)
        span = float(t[-1] - t[0]) or 1.0
        out["time_key"] = str(series.columns[0])
        out["columns"] = [str(c) for c in series.columns]
        # rows as Python scalars (ints stay ints, float32 -> float); one pass per column
        cols = [series[c].tolist() for c in series.columns]
        out["rows"] = list(zip(*cols))
        out["formats"] = [".9g" if series[c].dtype == "float32" else None for c in series.columns]
        # W&B's relative-time axis: the cell's wall time spread over its simulated time
        out["runtime"] = ((t - t[0]) / span * wall).tolist()
    return out


def write_cell_run(cell_dir: str | Path, mode: str = "offline", **given: Any) -> Path | str:
    """Offline: the run directory written; online: the run's id, after the SDK has sent it."""
    run = cell_run(cell_dir, **given)
    if mode == "offline":
        from repro.tracking.wandb_file import write_offline_run

        return write_offline_run(Path(cell_dir) / "wandb", **run)
    if mode == "online":
        return _send_online(run, Path(cell_dir))
    raise ValueError(f"mode must be offline or online, got {mode!r}")


def _send_online(run: Mapping[str, Any], cell_dir: Path) -> str:
    import wandb

    wb = wandb.init(
        project=run["project"],
        entity=run["entity"],
        group=run["group"],
        job_type=run["job_type"],
        id=run["run_id"],
        name=run["name"],
        tags=list(run["tags"]),
        config=dict(run["config"]),
        dir=str(cell_dir),
        mode="online",
        resume="allow",
        settings=wandb.Settings(
            console="off",
            silent=True,
            x_disable_stats=True,
            disable_git=True,
            save_code=False,
            x_save_requirements=False,
        ),
    )
    try:
        if run["time_key"]:
            wb.define_metric(run["time_key"])
            wb.define_metric("*", step_metric=run["time_key"])
        from repro.tracking.wandb_file import value_json

        cols = run["columns"]
        for row in run["rows"]:
            wb.log({c: v for c, v in zip(cols, row) if value_json(v) is not None})
        wb.summary.update(dict(run["summary"]))
    finally:
        wb.finish()
    return str(run["run_id"])


def upload(results_dir: str | Path, mode: str = "offline", *, project=None, entity=None, out=sys.stderr) -> dict:
    cells = find_cells(results_dir)
    tracking = {"project": project, "entity": entity}
    counts = {"cells": len(cells), "with_series": 0, "failed": 0}
    by_exp: dict[Path, dict] = {}
    t0 = time.perf_counter()
    for cell in cells:
        try:
            exp_dir = cell.parent
            if exp_dir not in by_exp:  # old results: swept keys from the differences between cells
                configs = {
                    c.name: _load_yaml(c / CellStore.CONFIG)
                    for c in exp_dir.iterdir()
                    if (c / CellStore.CONFIG).is_file()
                }
                by_exp[exp_dir] = {"configs": configs, "swept": runs.swept_from_siblings(configs)}
            info = by_exp[exp_dir]
            cfg = info["configs"].get(cell.name)
            series = meta = swept = None
            if (cell / SERIES_FILE).is_file():
                series, meta = read_series(cell / SERIES_FILE)
                counts["with_series"] += 1
            if not (meta or {}).get("swept"):
                flat = flatten(cfg or {})
                swept = {k: flat.get(k) for k in sorted(info["swept"])}
            write_cell_run(cell, mode, config=cfg, series=series, meta=meta, swept=swept, tracking=tracking)
        except Exception as exc:  # one bad cell does not stop the others
            counts["failed"] += 1
            print(f"[upload] {cell}: {type(exc).__name__}: {exc}", file=out)
    counts["wall_s"] = time.perf_counter() - t0
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m repro.tracking.upload",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("results_dir", help="a results root, one experiment folder or one cell folder")
    ap.add_argument("--mode", choices=("offline", "online"), default="offline")
    ap.add_argument("--project", default=None, help="W&B project (default: the cells' tracking.project)")
    ap.add_argument("--entity", default=None, help="W&B entity (default: the cells' tracking.entity)")
    a = ap.parse_args(argv)
    if not Path(a.results_dir).is_dir():
        print(f"repro.tracking.upload: {a.results_dir} is not a directory", file=sys.stderr)
        return 2
    counts = upload(a.results_dir, a.mode, project=a.project, entity=a.entity)
    if not counts["cells"]:
        print(f"repro.tracking.upload: no finished cell (summary.json) under {a.results_dir}", file=sys.stderr)
        return 2
    print(
        f"[upload] {counts['cells']} cell(s) -> W&B {a.mode} runs in {counts['wall_s']:.1f} s; "
        f"{counts['with_series']} with time series, {counts['cells'] - counts['with_series']} summary only, "
        f"{counts['failed']} failed",
        file=sys.stderr,
    )
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
