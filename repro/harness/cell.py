"""Run one grid cell into results/<exp>/<sig>/ — the same function for every launcher.

Order of work (a crash at any point loses nothing already finished and leaves no corrupt
file behind: every write is atomic, see repro.results.store):
1. summary.json present, intact and fresh (fingerprint.json equal to this checkout's, see
   repro.harness.freshness; or `keep_stale`) -> the cell is finished: skip it.
2. Take the cell's lock (repro.results.lock): another live process computing it -> wait for it
   (or hand back "busy"); re-check 1 under the lock.
3. The folder holds at most an unfinished or stale attempt: clear it (the lock excepted).
   The same cell (signature) finished and fresh in another experiment's folder, on a
   deterministic backend: its files are taken instead of running the backend again (its twin's
   requests, summary and timings; this cell's own config.yaml, fingerprint, series and W&B run),
   in the order below.
4. config.yaml (the resolved cell config, sorted keys).
5. The backend runs (W&B tracking alongside, never in the way; live cells stream to W&B; a
   failed W&B start turns tracking off for the rest of the sweep).
6. requests.parquet (RECORD_COLUMNS, deterministic bytes) and requests.sha256 (its hash, committed
   with the results while the parquet is not), timings.json (the backend's
   wall-clock timings at the top level + a `harness` entry: backend wall time, host, pid, start;
   never part of any identity check), fingerprint.json (the inputs this process computed it
   from), checksums.sha256 (the manifest over all of them and the summary), then summary.json
   LAST (repro.metrics.summarize + provenance). A finished cell whose files no longer match
   its manifest is `damaged` and recomputed like a stale one (repro.results.store).
   A backend that returns a plain dict (theory) has no requests.parquet: that dict is the
   summary.
A failing cell writes error.txt (the traceback) and no summary.json; the sweep goes on. Every
failure, folder errors included, stays in the cell's outcome. Ctrl-C / SIGTERM (`Stopped`)
remove the cell's partial files, its lock and its folder if that is left empty; a stop that a
library turned into its own exception (OmegaConf does) is still a stop, never a failure.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import shutil
import socket
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Mapping

from repro.confutil import to_yaml
from repro.harness import faults
from repro.results import CellStore
from repro.results.fingerprint import PYTHON_VERSION
from repro.results.lock import CellLock

# The cell folder's file names (CellStore owns them; kept here as short aliases).
CONFIG, REQUESTS, REQUESTS_SHA256 = CellStore.CONFIG, CellStore.REQUESTS, CellStore.REQUESTS_SHA256
TIMINGS, ERROR, SUMMARY, FINGERPRINT = CellStore.TIMINGS, CellStore.ERROR, CellStore.SUMMARY, CellStore.FINGERPRINT

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
    keep_stale: bool = False  # a finished cell counts as done even if its fingerprint differs


@dataclass
class CellOutcome:
    index: int
    signature: str
    status: (
        str  # "ran" | "copied" (from a finished twin) | "skipped" | "failed" | "busy" (locked by another live process)
    )
    dir: str
    summary: dict | None = None
    error: str | None = None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    traceback: str | None = None


@functools.lru_cache(maxsize=1)  # installed versions do not change within a process
def _package_versions() -> tuple[tuple[str, str], ...]:
    import repro

    out = {"repro": repro.__version__, "python": PYTHON_VERSION}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return tuple(out.items())


def package_versions() -> dict[str, str]:
    return dict(_package_versions())


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


class Stopped(BaseException):
    """SIGTERM (scancel, kill) or the sweep stopping: unwind the running cell and leave nothing half-done."""


# The signal that asked this process to stop, recorded by the handlers below before they raise: a
# library that catches what they raise and raises its own error instead (OmegaConf turns one
# inside OmegaConf.create into a ConfigKeyError) cannot turn a stop into a cell failure.
_stop: dict[str, int | None] = {"signum": None}


def raise_stopped(signum: int, frame: Any = None) -> None:  # noqa: ARG001
    """SIGTERM handler: unwind the running cell (Stopped)."""
    _stop["signum"] = signum
    raise Stopped(f"signal {signum}")


def raise_stopped_once(signum: int, frame: Any = None) -> None:
    """raise_stopped, with SIGTERM ignored from then on: a second stop signal (PR_SET_PDEATHSIG and
    repro.lifeline's watchdog, a repeated kill) raised inside the unwinding (partial-file cleanup,
    lock release) would leave the cell half-cleaned. Whoever stops the process kills it if it
    outlives their grace period."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise_stopped(signum, frame)


def raise_interrupt(signum: int, frame: Any = None) -> None:  # noqa: ARG001
    """SIGINT handler of an in-process sweep: Python's KeyboardInterrupt, remembered."""
    _stop["signum"] = signum
    raise KeyboardInterrupt


def stop_requested() -> bool:
    return _stop["signum"] is not None


def clear_stop() -> None:
    _stop["signum"] = None


def _stop_exception(cause: BaseException) -> BaseException:
    """What a stop that a library turned into `cause` should have raised."""
    import signal

    if _stop["signum"] == signal.SIGINT:
        return KeyboardInterrupt()
    return Stopped(f"signal {_stop['signum']} (raised inside {type(cause).__name__})")


# W&B: within one sweep (an in-process grid, its workers through a shared event, or the jobs of
# a -m sweep that run in the launching process), after the first failed start tracking is off for
# the rest of it (one warning). A lone run_cell_spec call outside any sweep always tries.
_tracking: dict = {"sweep": False, "off": False, "event": None}


def begin_sweep(event: Any = None) -> None:
    """A sweep starts (event: a multiprocessing.Event shared by its workers; set = tracking off)."""
    clear_stop()
    _tracking.update(sweep=True, off=False, event=event)
    use_workload_memo(True)


def end_sweep() -> None:
    _tracking.update(sweep=False, off=False, event=None)
    use_workload_memo(False)


def use_workload_memo(on: bool) -> None:
    """A sweep builds each distinct workload once per process (repro.workloads.base.use_memo)."""
    from repro.workloads.base import use_memo

    use_memo(on)


def tracking_off() -> bool:
    ev = _tracking["event"]
    return _tracking["sweep"] and (_tracking["off"] or (ev is not None and ev.is_set()))


def _turn_tracking_off() -> None:
    if not _tracking["sweep"]:
        return
    _tracking["off"] = True
    if _tracking["event"] is not None:
        _tracking["event"].set()


def _clear_unfinished(store: CellStore) -> None:
    """Remove an unfinished (or stale) attempt: every file but the lock we hold."""
    if not store.dir.exists():
        return
    for child in store.dir.iterdir():
        if child.name == CellStore.LOCK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def current_state(store: CellStore, cfg: Mapping, keep_stale: bool) -> tuple[str, list[str]]:
    """missing | fresh | stale | damaged of this cell folder (stale counts as fresh with
    keep_stale; damaged never does: its files are not what was finished)."""
    if not store.is_finished():
        return "missing", []
    integrity, why = store.integrity()
    if integrity == "damaged":
        return "damaged", why
    if keep_stale:
        return "fresh", []
    if integrity == "unsealed":  # made before manifests (or by another tool): rerun, like stale
        return "stale", why
    from repro.harness.freshness import cell_fingerprint, cell_state

    try:
        current = cell_fingerprint(cfg)
    except Exception as exc:  # e.g. its data file is gone: this checkout cannot make that cell
        return "stale", [f"cannot compute its fingerprint here: {type(exc).__name__}: {exc}"]
    return cell_state(store.dir, current)


def _records_frame(records: Any):
    import pandas as pd

    from repro.metrics import RECORD_COLUMNS

    if not isinstance(records, pd.DataFrame):
        raise TypeError(f"backend returned records of type {type(records).__name__}, expected a pandas DataFrame")
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"backend records lack columns {missing} (RECORD_COLUMNS: {list(RECORD_COLUMNS)})")
    return records.loc[:, list(RECORD_COLUMNS)].reset_index(drop=True)


def run_cell_spec(spec: CellSpec, *, wait: bool = True, poll_s: float = 1.0) -> CellOutcome:
    """Run (or skip) one cell. Never raises for a failing backend or folder: the outcome says so.

    A cell another live process is computing (its lock) is waited for (`wait`, the -m path:
    one job = one cell) or handed back with status "busy" (the in-process sweep retries it
    later). KeyboardInterrupt / Stopped unwind it: its partial files are removed, the lock
    released, and the exception goes on.
    """
    t0 = time.perf_counter()
    store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
    out = CellOutcome(spec.index, spec.signature, "skipped", str(store.dir))
    lock = CellLock(store.dir)
    try:  # one finally releases the lock on every way out (a stop may land between any two lines)
        try:
            while True:
                state, why = current_state(store, spec.config, spec.keep_stale)
                if state == "fresh":
                    out.summary = store.read_summary()
                    out.extra["kept_stale"] = bool(spec.keep_stale)
                    return out
                if lock.try_acquire():
                    state, why = current_state(store, spec.config, spec.keep_stale)  # finished meanwhile?
                    if state == "fresh":
                        out.summary = store.read_summary()
                        return out
                    break
                if not wait:
                    out.status = "busy"
                    return out
                time.sleep(poll_s)
        except Exception as exc:
            if stop_requested():  # a stop a library turned into its own error
                raise _stop_exception(exc) from exc
            return _failed(out, store, exc, t0, write=False)
        if state == "stale":
            out.extra["was_stale"] = why
        elif state == "damaged":
            out.extra["was_damaged"] = why
        twin = _finished_twin(spec)
        if twin is not None:
            return _adopt(spec, store, lock, out, t0, *twin)
        return _compute(spec, store, lock, out, t0)
    finally:
        lock.release()


def _finished_twin(spec: CellSpec) -> tuple[CellStore, dict] | None:
    """The same cell (signature) finished and fresh in another experiment's folder of this results
    folder, if its backend is deterministic (its files are then what running it here would write):
    fig2_main's GSP cells recur in fig5, fig6, fig12, ... with the same signature. With the files
    this cell takes from it, read and checked (requests.parquet against its requests.sha256)."""
    from repro.backends import get_backend

    if spec.config.get("reuse_twins") is False:  # e.g. tab2_ablation: it reports its cells' timings
        return None
    try:
        if not get_backend(str(spec.config["backend"]["name"])).deterministic:
            return None
        exps = sorted(
            e.name
            for e in os.scandir(spec.results_dir)
            if e.is_dir() and e.name != spec.exp_name and not e.name.startswith(".")
        )
    except Exception:  # unknown backend, unreadable folder: computing it reports what is wrong
        return None
    tracked = str((spec.config.get("tracking") or {}).get("mode", "offline")) != "disabled"  # a series to take
    for exp in exps:
        twin = CellStore(spec.results_dir, exp, spec.signature)
        if not twin.is_finished() or current_state(twin, spec.config, False)[0] != "fresh":
            continue
        if tracked and (twin.dir / REQUESTS).is_file() and not twin.path(CellStore.SERIES).is_file():
            continue  # finished without tracking: the series this cell tracks needs the run
        try:
            files = {SUMMARY: twin.summary_path.read_bytes(), TIMINGS: (twin.dir / TIMINGS).read_text()}
            if (twin.dir / REQUESTS).is_file():
                files[REQUESTS] = (twin.dir / REQUESTS).read_bytes()
                files[REQUESTS_SHA256] = (twin.dir / REQUESTS_SHA256).read_text()
                if files[REQUESTS_SHA256].split()[0] != hashlib.sha256(files[REQUESTS]).hexdigest():
                    continue
            json.loads(files[TIMINGS])
            json.loads(files[SUMMARY])
        except (OSError, ValueError, IndexError):  # changed since its fresh check: compute it
            continue
        return twin, files
    return None


def _adopt(
    spec: CellSpec, store: CellStore, lock: CellLock, out: CellOutcome, t0: float, twin: CellStore, files: dict
) -> CellOutcome:
    """Fill the cell from its twin's files, in _compute's order (summary.json last): its own
    config.yaml, fingerprint and tracking run; the twin's requests, summary and backend timings
    (timings.json `harness.reused_from` names the twin)."""
    from repro.harness.freshness import cell_fingerprint

    cfg = spec.config
    with _attempt(store, out, t0) as attempt:
        summary = json.loads(files[SUMMARY])
        timings = json.loads(files[TIMINGS])
        store.write_text(CONFIG, to_yaml(cfg))
        fingerprint = cell_fingerprint(cfg)
        tracker = attempt.tracker = _start_tracking(spec, store, out)
        if REQUESTS in files:
            store.write_bytes(REQUESTS, files[REQUESTS])
            store.write_text(REQUESTS_SHA256, files[REQUESTS_SHA256])
        harness = dict(timings.get("harness") or {})
        harness.update(
            host=socket.gethostname(),
            pid=os.getpid(),
            started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            reused_from=f"{twin.dir.parent.name}/{twin.dir.name}",
        )
        timings["harness"] = harness
        store.write_json(TIMINGS, timings)
        tracker.copy_series(store.dir, twin.dir)
        store.write_json(FINGERPRINT, fingerprint)
        _check_lock(lock, store)
        store.finish(files[SUMMARY])  # manifest, then summary.json last: marks the cell finished
        attempt.failed = False
        out.status, out.summary = "copied", summary
        out.extra["reused_from"] = str(twin.dir)
        tracker.progress(1.0)
        tracker.log_result(summary, None)
    return out


def _failed(out: CellOutcome, store: CellStore, exc: BaseException, t0: float, write: bool = True) -> CellOutcome:
    out.status = "failed"
    out.error = f"{type(exc).__name__}: {exc}"
    out.traceback = traceback.format_exc()
    if write and not store.is_finished():
        try:
            store.write_text(ERROR, out.traceback)
            out.extra["error_file"] = str(store.dir / ERROR)
        except Exception:  # full disk, read-only folder: the error stays in the outcome
            pass
    out.wall_s = time.perf_counter() - t0
    return out


def _compute(spec: CellSpec, store: CellStore, lock: CellLock, out: CellOutcome, t0: float) -> CellOutcome:
    from omegaconf import OmegaConf

    from repro.backends import get_backend
    from repro.backends.base import CellResult
    from repro.harness.freshness import cell_fingerprint
    from repro.metrics import summarize

    cfg = spec.config
    with _attempt(store, out, t0) as attempt:
        backend = get_backend(str(cfg["backend"]["name"]))
        node = copy.deepcopy(cfg) if backend.plain_config else OmegaConf.create(cfg)  # the backend's own
        store.write_text(CONFIG, to_yaml(cfg))
        fingerprint = cell_fingerprint(cfg)  # this process's code/data: it is what computes the cell
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        tracker = attempt.tracker = _start_tracking(spec, store, out)
        faults.checkpoint("start")
        tb0 = time.perf_counter()
        result = backend.run_cell(node, progress=tracker.progress)
        backend_s = time.perf_counter() - tb0

        records = None
        if isinstance(result, CellResult):
            records = _records_frame(result.records)
            metrics = str((cfg.get("protocol") or {}).get("metrics") or "text")  # conf/protocol/
            summary = summarize(records, provenance(cfg, result.provenance, spec.signature), definition=metrics)
            backend_timings = dict(result.timings or {})
            store.write_requests(records)  # + requests.sha256, committed while the parquet is not
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
        store.write_json(FINGERPRINT, fingerprint)
        faults.checkpoint("before_summary")
        _check_lock(lock, store)
        store.finish(summary)  # manifest, then summary.json last: marks the cell finished
        attempt.failed = False
        out.status, out.summary = "ran", summary
        tracker.progress(1.0)
        tracker.log_result(summary, records)
    return out


class _Attempt:
    """What _attempt's caller fills in: its tracker, and whether the cell got its summary."""

    def __init__(self) -> None:
        from repro.tracking import CellTracker

        self.tracker: Any = CellTracker()
        self.failed = True


@contextmanager
def _attempt(store: CellStore, out: CellOutcome, t0: float):
    """One attempt at filling a cell folder (_compute, _adopt): an unfinished or stale attempt
    cleared first; an error becomes the outcome (error.txt); Stopped / Ctrl-C leave no
    half-written cell; the tracker is finished whatever happened, never in the way."""
    attempt = _Attempt()
    try:
        _clear_unfinished(store)
        yield attempt
    except Exception as exc:
        if not stop_requested():
            _failed(out, store, exc, t0)
        else:  # a stop a library turned into its own error: a stop all the same, never a failure
            if not store.is_finished():
                _clear_unfinished(store)
            raise _stop_exception(exc) from exc
    except (Stopped, KeyboardInterrupt):
        if not store.is_finished():
            _clear_unfinished(store)  # no half-written cell
        raise
    finally:
        try:
            attempt.tracker.finish(failed=attempt.failed)
        except BaseException:  # never in the way of the cell's outcome
            pass
        if getattr(attempt.tracker, "failed", False) and not out.extra.get("tracking_failed"):
            _turn_tracking_off()  # e.g. an online upload that failed at the end of the cell
            out.extra["tracking_failed"] = True
        out.wall_s = time.perf_counter() - t0


def _start_tracking(spec: CellSpec, store: CellStore, out: CellOutcome) -> Any:
    from repro.tracking import CellTracker, start_cell_tracking

    from repro.tracking import SeriesTracker

    tracking = dict(spec.config.get("tracking") or {})
    off = tracking_off()  # W&B failed earlier in this sweep: the series only (a local result)
    tracker = start_cell_tracking(
        tracking,
        cell_dir=store.dir,
        signature=spec.signature,
        exp_name=spec.exp_name,
        config=spec.config,
        name=spec.label,
        series_only=off,
    )
    if not off and tracking.get("mode", "offline") != "disabled" and type(tracker) in (CellTracker, SeriesTracker):
        _turn_tracking_off()  # start failed (it warned): no other cell of this sweep tries again
        out.extra["tracking_failed"] = True
    return tracker


def _check_lock(lock: CellLock, store: CellStore) -> None:
    if not lock.still_mine():
        raise RuntimeError(f"lost the lock of {store.dir} (broken by another process); not finishing it")
