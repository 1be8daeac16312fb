"""Experiment tracking — the only module of repro that imports wandb (and only where it must).

One W&B run per grid cell, group = experiment, job_type = backend, a readable name, tags and a
flattened config (repro.tracking.runs: ids unique per results root, stable per cell).

Simulated cells (every backend but sglang, unless tracking.stream says otherwise): the cell writes its time series, `timeseries.parquet`
(repro.tracking.series: completed req/s, hit rate, windowed P50/P95 latency and TTFT, per-worker
in flight / queue / KV use, over simulated time), with its results — before summary.json, so a
finished cell always has it — and then its W&B run is built from the cell's files by the same
code as `python -m repro.tracking.upload`: mode `offline` writes the `.wandb` file directly
(repro.tracking.wandb_file, a few ms, no W&B service, no `import wandb`), mode `online` sends it
with the SDK. The run is there when the cell ends; nothing runs after the sweep.

Live cells (sglang, or tracking.stream=true): the SDK run opens when the cell starts and points
are logged as the cell goes, x axis `wall_time_s` (seconds since the cell started): the backend's
`progress(fraction)` calls (throttled to `progress_interval_s`) and whatever it passes to
`progress.log({...})` — the call a live backend makes with its windowed metrics (see
docs/ARCHITECTURE.md "Tracking"). The streamed points become the cell's timeseries.parquet.

W&B never loses or blocks local results: a missing package or any exception from wandb warns
once (RuntimeWarning) and turns tracking off for the rest of the cell. Mode `disabled`: nothing
(no series, no run, wandb not imported).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from repro.fileio import write_atomic
from repro.tracking import runs

LIVE_BACKENDS = ("sglang",)  # tracking.stream: auto -> these stream; the others' runs come from the files
_ENV_DIRS = {
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


class Progress:
    """What a backend gets as `progress`: progress(fraction) and progress.log(metrics)."""

    def __init__(self, on_progress: Callable[[float], None], on_log: Callable[[Mapping[str, Any]], None]):
        self._on_progress, self._on_log = on_progress, on_log

    def __call__(self, fraction: float) -> None:
        self._on_progress(fraction)

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Stream a point now (live cells; ignored by simulated ones): {"window/hit_rate": 0.7, ...}."""
        self._on_log(metrics)


class CellTracker:
    """No-op tracker (mode `disabled`, or after a W&B failure)."""

    run_dir: Path | None = None

    def __init__(self) -> None:
        self.progress = Progress(self._progress, self._log)

    def _progress(self, fraction: float) -> None:
        pass

    def _log(self, metrics: Mapping[str, Any]) -> None:
        pass

    def write_series(self, cell_dir: Path, records: Any, samples: Mapping[str, Any] | None) -> None:
        """Before summary.json: the cell's timeseries.parquet."""

    def copy_series(self, cell_dir: Path, source_dir: Path) -> None:
        """Before summary.json, instead of write_series, for a cell adopted from its twin in another
        experiment (repro.harness.cell): the twin's series under this cell's swept keys."""

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        """After summary.json: the run's summary (and, for simulated cells, the whole run)."""

    def finish(self, failed: bool = False) -> None:
        pass


def _warn(what: str, exc: BaseException) -> None:
    warnings.warn(
        f"W&B tracking {what} failed ({type(exc).__name__}: {exc}); local results are unaffected, "
        f"tracking is off for this cell",
        RuntimeWarning,
        stacklevel=3,
    )


def _write_series_file(cell_dir: Path, series, swept: Mapping[str, Any]) -> dict:
    from repro.tracking.series import SERIES_FILE, series_bytes, series_meta

    meta = series_meta(series, swept=swept)
    write_atomic(Path(cell_dir) / SERIES_FILE, series_bytes(series, meta), fsync=False)  # why: repro.tracking.series
    return meta


class FileCellTracker(CellTracker):
    """Simulated cells: series file with the results, then the run from the files."""

    def __init__(
        self, tracking: Mapping[str, Any], *, cell_dir: Path, config: Mapping[str, Any], swept: Mapping[str, Any]
    ):
        super().__init__()
        self._tracking = dict(tracking)
        self._mode = str(tracking.get("mode", "offline"))
        if self._mode not in ("offline", "online"):
            raise ValueError(f"tracking.mode {self._mode!r}")
        self._cell_dir = Path(cell_dir)
        self._config = config
        self._swept = dict(swept)
        self._series = self._meta = None

    def write_series(self, cell_dir: Path, records: Any, samples: Mapping[str, Any] | None) -> None:
        if records is None:  # theory cells: summary only
            return
        from repro.tracking.series import cell_series

        self._series = cell_series(records, samples, max_points=int(self._tracking.get("max_points", 320)))
        self._meta = _write_series_file(cell_dir, self._series, self._swept)

    def copy_series(self, cell_dir: Path, source_dir: Path) -> None:
        from repro.tracking.series import SERIES_FILE, read_series

        src = Path(source_dir) / SERIES_FILE
        if not src.is_file():  # a theory cell (summary only)
            return
        self._series, _ = read_series(src)
        self._meta = _write_series_file(cell_dir, self._series, self._swept)

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        from repro.tracking.upload import write_cell_run

        out = write_cell_run(
            self._cell_dir,
            self._mode,
            config=self._config,
            summary=summary,
            series=self._series,
            meta=self._meta,
            swept=self._swept,
        )
        if isinstance(out, Path):
            self.run_dir = out


class SeriesTracker(FileCellTracker):
    """The cell's timeseries.parquet and nothing of W&B: what a cell keeps when W&B failed (in this
    cell or earlier in the sweep). The series is a local result; losing W&B must not lose it."""

    def __init__(
        self, tracking: Mapping[str, Any], *, cell_dir: Path, config: Mapping[str, Any], swept: Mapping[str, Any]
    ):
        super().__init__({**tracking, "mode": "offline"}, cell_dir=cell_dir, config=config, swept=swept)

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        pass


class LiveCellTracker(CellTracker):
    """Live cells: an SDK run open for the whole cell, points streamed over wall time."""

    TIME_KEY = "wall_time_s"

    def __init__(
        self,
        tracking: Mapping[str, Any],
        *,
        cell_dir: Path,
        signature: str,
        exp_name: str,
        config: Mapping[str, Any],
        swept: Mapping[str, Any],
    ):
        import wandb  # ImportError is handled by start_cell_tracking

        super().__init__()
        self._wandb = wandb
        self._interval = float(tracking.get("progress_interval_s", 2.0))
        self._last = -float("inf")
        self._t0 = time.monotonic()
        self._points: list[dict] = []
        self._complete = False
        self._swept = dict(swept)
        self._saved_env: dict[str, str | None] = {}
        self.run = None
        wandb_dir = Path(cell_dir) / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        for var, sub in _ENV_DIRS.items():  # every W&B file inside the cell folder
            self._saved_env[var] = os.environ.get(var)
            os.environ[var] = str(wandb_dir / sub)
        mode = str(tracking.get("mode", "offline"))
        settings = wandb.Settings(
            console="off",
            silent=True,
            x_disable_stats=True,
            x_save_requirements=False,
            disable_git=True,
            save_code=False,
            init_timeout=float(tracking.get("init_timeout_s", 60.0)),
        )
        try:
            self.run = wandb.init(
                project=tracking.get("project") or "repro",
                entity=tracking.get("entity") or None,
                group=exp_name,
                job_type=str((config.get("backend") or {}).get("name", "cell")),
                id=runs.run_id(exp_name, signature, runs.root_id(Path(cell_dir).parent.parent)),
                name=runs.display_name(config, swept),
                tags=runs.tags(config, tracking.get("tags") or ()),
                dir=str(cell_dir),
                mode=mode,
                resume="allow" if mode == "online" else None,
                config=runs.flat_config(config, signature),
                settings=settings,
            )
            self.run.define_metric(self.TIME_KEY)
            self.run.define_metric("*", step_metric=self.TIME_KEY)
            self.run_dir = Path(self.run.dir).parent if getattr(self.run, "dir", None) else None
        except BaseException:
            self._restore_env()
            raise

    def _restore_env(self) -> None:
        for var, old in self._saved_env.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
        self._saved_env = {}

    def _point(self, values: Mapping[str, Any]) -> None:
        point = {self.TIME_KEY: time.monotonic() - self._t0, **values}
        self._points.append(point)
        self.run.log(point)

    def _progress(self, fraction: float) -> None:
        now = time.monotonic()
        if self._complete or (fraction < 1.0 and now - self._last < self._interval):
            return
        self._last = now
        self._complete = fraction >= 1.0
        self._point({"progress": float(fraction)})

    def _log(self, metrics: Mapping[str, Any]) -> None:
        self._point(dict(metrics))

    def write_series(self, cell_dir: Path, records: Any, samples: Mapping[str, Any] | None) -> None:
        import pandas as pd

        self._progress(1.0)  # the cell's backend is done: its last point goes into the file too
        if self._points:
            series = pd.DataFrame(self._points)  # the points streamed, as streamed (union of keys)
        elif records is not None:
            from repro.tracking.series import cell_series

            series = cell_series(records, samples, time_key=self.TIME_KEY)
        else:
            return
        _write_series_file(cell_dir, series, self._swept)

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        self.run.summary.update(dict(summary))

    def finish(self, failed: bool = False) -> None:
        try:
            if self.run is not None:
                self.run.finish(exit_code=1 if failed else 0)
                self.run = None
            self._wandb.teardown()  # its service logs under WANDB_CACHE_DIR (the cell's folder)
        finally:
            self._restore_env()


class _Guarded(CellTracker):
    """Forward to a real tracker until it fails once; then warn and become a no-op."""

    def __init__(self, inner: CellTracker, fallback: CellTracker | None = None):
        super().__init__()
        self._inner: CellTracker | None = inner
        self._fallback = fallback  # writes the series once the inner tracker failed
        self._series_written = False
        self.run_dir = inner.run_dir
        self.failed = False  # set by the first failure (the harness then stops tracking the sweep)

    def _call(self, what: str, *args: Any, **kwargs: Any) -> None:
        if self._inner is None:
            return
        try:
            getattr(self._inner, what)(*args, **kwargs)
        except Exception as exc:
            _warn(what, exc)
            self.failed = True
            inner, self._inner = self._inner, None
            if what != "finish":
                try:
                    inner.finish(failed=True)
                except Exception:
                    pass
        if self._inner is not None:
            self.run_dir = self._inner.run_dir

    def _progress(self, fraction: float) -> None:
        self._call("_progress", fraction)

    def _log(self, metrics: Mapping[str, Any]) -> None:
        self._call("_log", metrics)

    def write_series(self, cell_dir: Path, records: Any, samples: Mapping[str, Any] | None) -> None:
        self._call("write_series", cell_dir, records, samples)
        if self._inner is None and self._fallback is not None:
            self._fallback.write_series(cell_dir, records, samples)

    def copy_series(self, cell_dir: Path, source_dir: Path) -> None:
        self._call("copy_series", cell_dir, source_dir)
        if self._inner is None and self._fallback is not None:
            self._fallback.copy_series(cell_dir, source_dir)

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        self._call("log_result", summary, records)

    def finish(self, failed: bool = False) -> None:
        self._call("finish", failed=failed)
        self._inner = None


def start_cell_tracking(
    tracking: Mapping[str, Any] | None,
    *,
    cell_dir: str | os.PathLike,
    signature: str,
    exp_name: str,
    config: Mapping[str, Any],
    name: str | None = None,
    series_only: bool = False,
) -> CellTracker:
    """A tracker for one cell; never raises (a failure warns and returns a tracker that still
    writes the cell's series). `series_only`: W&B failed earlier in the sweep, do not try again.

    `name` is the cell's grid label ("policy=lbgr_rlt workload.request_rate=12.0"): its keys
    are the swept ones the display name shows.
    """
    tracking = dict(tracking or {})
    if str(tracking.get("mode", "offline")) == "disabled":
        return CellTracker()
    swept = runs.swept_from_label(name or "")
    backend = str((config.get("backend") or {}).get("name", ""))
    stream = tracking.get("stream", "auto")
    live = backend in LIVE_BACKENDS if stream in ("auto", None) else bool(stream)
    series = SeriesTracker(tracking, cell_dir=Path(cell_dir), config=config, swept=swept)
    if series_only:
        return series
    try:
        if not live:
            inner: CellTracker = FileCellTracker(tracking, cell_dir=Path(cell_dir), config=config, swept=swept)
        else:
            inner = LiveCellTracker(
                tracking, cell_dir=Path(cell_dir), signature=signature, exp_name=exp_name, config=config, swept=swept
            )
    except Exception as exc:  # ImportError (no wandb), init errors, timeouts
        _warn("start", exc)
        return series
    return _Guarded(inner, series)


def run_id(exp_name: str, signature: str, root: str) -> str:
    return runs.run_id(exp_name, signature, root)


__all__ = [
    "CellTracker",
    "FileCellTracker",
    "LiveCellTracker",
    "Progress",
    "SeriesTracker",
    "run_id",
    "start_cell_tracking",
]
