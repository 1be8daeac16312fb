"""Experiment tracking — the only module of repro that imports wandb.

One W&B run per grid cell: config (the resolved cell config + signature), live progress
(`progress` points, throttled in wall-clock time), the final summary (summary.json's
values) and the per-request table; group = experiment name, run id derived from the run
signature (`<exp>-<sig>`), so a rerun of a cell reuses its id.

Choices:
- mode `offline` by default; `online` and `disabled` by config (conf/tracking/).
- Every W&B path lives in the cell's folder, results/<exp>/<sig>/wandb/: the run directory
  (`dir=`), and WANDB_CACHE_DIR / CONFIG_DIR / DATA_DIR / ARTIFACT_DIR point there while the
  run is open. The wandb-core service writes its log under the cache dir when it starts, so
  the service is torn down after each cell (≈0.5 s per cell) and the next cell starts its
  own — the price of keeping every W&B file inside its cell.
- W&B is never allowed to lose or block local results: a missing package or any exception
  from wandb warns once (RuntimeWarning) and turns tracking off for the rest of the cell.
  The harness writes summary.json before it logs the summary here.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

_ENV_DIRS = {
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


class CellTracker:
    """No-op tracker (mode `disabled`, or after a W&B failure)."""

    run_dir: Path | None = None

    def progress(self, fraction: float) -> None:
        pass

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


def run_id(exp_name: str, signature: str) -> str:
    """W&B run id derived from the signature (ids may not contain / \\ # ? % :)."""
    exp = re.sub(r"[^A-Za-z0-9_.-]+", "_", exp_name)[:48]
    return f"{exp}-{signature}"


def _warn(what: str, exc: BaseException) -> None:
    warnings.warn(
        f"W&B tracking {what} failed ({type(exc).__name__}: {exc}); local results are unaffected, "
        f"tracking is off for this cell",
        RuntimeWarning,
        stacklevel=3,
    )


class WandbCellTracker(CellTracker):
    def __init__(
        self,
        tracking: Mapping[str, Any],
        *,
        cell_dir: Path,
        signature: str,
        exp_name: str,
        config: Mapping[str, Any],
        name: str | None = None,
    ):
        import wandb  # ImportError is handled by start_cell_tracking

        self._wandb = wandb
        self._interval = float(tracking.get("progress_interval_s", 2.0))
        self._last = -float("inf")
        self._log_table = bool(tracking.get("log_requests_table", True))
        self._saved_env: dict[str, str | None] = {}
        self.run = None
        wandb_dir = Path(cell_dir) / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        for var, sub in _ENV_DIRS.items():
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
                id=run_id(exp_name, signature),
                name=name or signature,
                tags=list(tracking.get("tags") or []),
                dir=str(cell_dir),
                mode=mode,
                resume="allow" if mode == "online" else None,
                config={"signature": signature, **dict(config)},
                settings=settings,
            )
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

    def progress(self, fraction: float) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - self._last < self._interval:
            return
        self._last = now
        self.run.log({"progress": float(fraction)})

    def log_result(self, summary: Mapping[str, Any], records: Any = None) -> None:
        self.run.summary.update(dict(summary))
        if records is not None and self._log_table and len(records):
            # Built from plain per-column lists: ~3x faster than Table(dataframe=...), same values.
            columns = [str(c) for c in records.columns]
            data = [list(row) for row in zip(*(records[c].tolist() for c in records.columns))]
            self.run.log({"requests": self._wandb.Table(columns=columns, data=data)})

    def finish(self, failed: bool = False) -> None:
        try:
            if self.run is not None:
                self.run.finish(exit_code=1 if failed else 0)
                self.run = None
            # the wandb-core service logs under WANDB_CACHE_DIR: one service per cell
            self._wandb.teardown()
        finally:
            self._restore_env()


class _Guarded(CellTracker):
    """Forward to a real tracker until it fails once; then warn and become a no-op."""

    def __init__(self, inner: CellTracker):
        self._inner: CellTracker | None = inner
        self.run_dir = inner.run_dir

    def _call(self, what: str, *args: Any, **kwargs: Any) -> None:
        if self._inner is None:
            return
        try:
            getattr(self._inner, what)(*args, **kwargs)
        except Exception as exc:
            _warn(what, exc)
            inner, self._inner = self._inner, None
            if what != "finish":
                try:
                    inner.finish(failed=True)
                except Exception:
                    pass

    def progress(self, fraction: float) -> None:
        self._call("progress", fraction)

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
) -> CellTracker:
    """A tracker for one cell; never raises (a failure warns and returns the no-op tracker)."""
    tracking = dict(tracking or {})
    if str(tracking.get("mode", "offline")) == "disabled":
        return CellTracker()
    try:
        inner = WandbCellTracker(
            tracking, cell_dir=Path(cell_dir), signature=signature, exp_name=exp_name, config=config, name=name
        )
    except Exception as exc:  # ImportError (no wandb), init errors, timeouts
        _warn("start", exc)
        return CellTracker()
    return _Guarded(inner)


__all__ = ["CellTracker", "WandbCellTracker", "run_id", "start_cell_tracking"]
