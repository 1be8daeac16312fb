"""Run cells on local cores, stoppable: the in-process sweep's executor.

Not concurrent.futures: its workers keep running queued tasks after Ctrl-C, outlive a killed
parent, and one dead worker breaks the whole pool. Here
- the parent hands each worker (spawn start method) one cell at a time over a pipe, so nothing
  is queued inside a worker;
- a worker exits when its parent dies, from its first instruction: its command line arms
  PR_SET_PDEATHSIG (Linux) before spawn imports anything, then checks that the parent did not
  die before that (repro.harness.boot; while it imports, SIGTERM just ends it); once it runs,
  PR_SET_PDEATHSIG and a watchdog thread that compares getppid() (elsewhere) both raise Stopped
  in it, which removes its cell's partial files and releases the cell's lock;
- Ctrl-C / SIGTERM of the parent: nothing more is handed out, the workers get SIGTERM (they
  ignore SIGINT, which the terminal sends to the whole group, from birth: they start with
  it blocked), are joined for up to STOP_GRACE_S, then killed; the parent re-raises, so the
  sweep ends within seconds;
- a worker that dies (kill -9, OOM) fails only the cell it was running and is replaced;
- a cell whose lock another live process holds ("busy") is retried after the others, every
  POLL_S, until that process finishes it (then it is skipped) or dies (then it runs here);
- a `Task` (work that is not a cell: building the workloads validation needs, drawing a
  finished experiment's figures) runs on the same workers, before any cell still waiting, so
  that no core idles while the parent does it;
- a worker the parent releases ends without interpreter teardown (`_exit_without_teardown`).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from repro.harness.boot import BootProcess
from repro.lifeline import die_with_parent
from repro.harness.cell import CellOutcome, CellSpec, Stopped, begin_sweep, end_sweep, raise_stopped_once, run_cell_spec
from repro.results import CellStore
from repro.results.lock import CellLock, signals_deferred

STOP_GRACE_S = 5.0
POLL_S = 1.0


@dataclass(eq=False)
class Task:
    """Work other than a cell for the pool: `fn(*args)` runs in a worker (fn and args picklable:
    a module-level function); `done(value, error)` then runs in this process, error being None
    or the traceback (a worker that died: its exit code)."""

    fn: Callable[..., Any]
    args: tuple = ()
    done: Callable[[Any, str | None], None] = field(default=lambda value, error: None)


# While a sweep runs (its process and its workers): the young generation collected every 10k
# allocations (CPython's default: 700) and the old one after 100 middle-generation passes (10).
# Planning and cells make many long-lived objects (configs, workloads, frames), which every
# full pass walks again: with the defaults a paper build spent ~13 of its ~160 CPU-seconds in
# the collector, with these ~6.5 (gc.callbacks, both measured; peak memory the same).
SWEEP_GC_THRESHOLD = (10_000, 10, 100)


@contextmanager
def sweep_gc_thresholds():
    """SWEEP_GC_THRESHOLD (never lower than what is set) for the block, then as before."""
    old = gc.get_threshold()
    gc.set_threshold(
        max(old[0], SWEEP_GC_THRESHOLD[0]), max(old[1], SWEEP_GC_THRESHOLD[1]), max(old[2], SWEEP_GC_THRESHOLD[2])
    )
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _call(fn: Callable[..., Any], args: tuple) -> tuple[Any, str | None]:
    try:
        return fn(*args), None
    except Exception:  # the parent reports it; the worker goes on
        return None, traceback.format_exc()


def _worker_main(conn, ppid: int, tracking_event) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C that came during start-up is dropped here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, raise_stopped_once)  # the parent kills a worker that outlives STOP_GRACE_S
    die_with_parent(ppid)
    begin_sweep(tracking_event)
    gc.set_threshold(*SWEEP_GC_THRESHOLD)  # this process exists for the sweep
    try:
        while True:
            try:
                spec = conn.recv()
            except EOFError:
                return
            if spec is None:
                break
            conn.send(_call(*spec) if isinstance(spec, tuple) else run_cell_spec(spec, wait=False))
    except (Stopped, BrokenPipeError, EOFError):
        return
    _exit_without_teardown()


def _exit_without_teardown() -> None:
    """End a worker the parent released without finalizing its interpreter: freeing a sweep's
    heap object by object (about a gigabyte of small objects after the paper's cells) takes a
    second or more while the parent waits, and there is nothing left to save: every cell's
    files are written before its outcome is sent. Not with W&B's library loaded (its exit
    hook flushes the upload service): then the normal exit."""
    if "wandb" in sys.modules:
        return
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing to flush
            pass
    os._exit(0)


class _Worker:
    def __init__(self, ctx, tracking_event):
        self.conn, child = ctx.Pipe()
        self.proc = BootProcess(target=_worker_main, args=(child, os.getpid(), tracking_event), daemon=True)
        # born with SIGINT blocked (the mask survives fork and exec): a Ctrl-C to the group while
        # the worker still imports must not kill it half-started; the parent gets its own
        # Ctrl-C as soon as the mask is restored
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child.close()
        self.spec: CellSpec | None = None


def _twin_key(spec: Any) -> tuple[str, str] | None:
    return None if isinstance(spec, Task) else (spec.results_dir, spec.signature)


def _next_spec(pending: deque, workers: list) -> Any:
    """The first pending item that is not the twin (same results folder and signature, another
    experiment) of a cell a worker is running: run after it, it is filled from its files
    (repro.harness.cell._finished_twin) instead of being computed twice at once. None if every
    pending item is such a twin."""
    running = {_twin_key(w.spec) for w in workers if w.spec is not None}
    for i, spec in enumerate(pending):
        key = _twin_key(spec)
        if key is None or key not in running:
            del pending[i]
            return spec
    return None


def _busy_elsewhere(spec: CellSpec) -> bool:
    store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
    return CellLock(store.dir).held_by_other()


def _died(spec: CellSpec, why: str) -> CellOutcome:
    store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
    return CellOutcome(
        spec.index,
        spec.signature,
        "failed",
        str(store.dir),
        error=f"worker process died before finishing this cell ({why}); rerun to resume",
    )


class Feed:
    """Specs that arrive while the pool runs (a planner thread puts them, the pool takes them):
    the workers start before the planning of the later experiments is done. Tasks may still be
    put after `close` (by on_done, while the pool runs)."""

    def __init__(self, cost: Callable[[CellSpec], float] | None = None) -> None:
        self.cost = cost  # the pool hands out the costliest pending spec first (shorter tail)
        self._lock = threading.Lock()
        self._items: list[CellSpec] = []
        self._closed = False
        self.arrived = threading.Event()

    def put(self, specs: Sequence[CellSpec]) -> None:
        with self._lock:
            self._items.extend(specs)
        self.arrived.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.arrived.set()

    def take(self) -> tuple[list[CellSpec], bool]:
        """(the specs put since the last take, whether no more will come)."""
        with self._lock:
            items, self._items = self._items, []
            self.arrived.clear()
            return items, self._closed


def run_cells(
    specs: Sequence[CellSpec], n_jobs: int, on_done: Callable[[CellOutcome], None], feed: Feed | None = None
) -> None:
    """Run every spec, then those `feed` brings until it is closed (n_jobs == 1: in this
    process); on_done(outcome) once per spec."""
    begin_sweep()
    try:
        with sweep_gc_thresholds():
            _run_cells(specs, n_jobs, on_done, feed)
    finally:
        end_sweep()


FEED_POLL_S = 0.05


def _run_cells(
    specs: Sequence[CellSpec], n_jobs: int, on_done: Callable[[CellOutcome], None], feed: Feed | None = None
) -> None:
    pending = deque(specs)
    deferred: list[CellSpec] = []
    open_feed = feed is not None

    def take() -> None:
        nonlocal open_feed
        if feed is not None:
            items, closed = feed.take()
            open_feed = not closed
            if items:
                pending.extend(items)
                # stable: equal costs keep their order; tasks first (what they follow is done)
                ordered = sorted(
                    pending,
                    key=lambda s: -math.inf if isinstance(s, Task) else -feed.cost(s) if feed.cost is not None else 0.0,
                )
                pending.clear()
                pending.extend(ordered)

    def finish(item, out) -> None:
        if isinstance(item, Task):
            item.done(*out)
        elif out.status == "busy":
            deferred.append(item)
        else:
            on_done(out)

    if n_jobs <= 1:
        while True:
            take()
            if not (pending or deferred):
                if not open_feed:
                    break
                feed.arrived.wait(POLL_S)
                continue
            if not pending:
                time.sleep(POLL_S)
                pending.extend(s for s in deferred if not _busy_elsewhere(s))
                deferred = [s for s in deferred if s not in pending]
                continue
            spec = pending.popleft()
            finish(spec, _call(spec.fn, spec.args) if isinstance(spec, Task) else run_cell_spec(spec, wait=False))
        return

    ctx = multiprocessing.get_context("spawn")
    tracking_event = ctx.Event()
    begin_sweep(tracking_event)
    workers: list[_Worker] = []
    try:
        n = n_jobs if open_feed else min(n_jobs, len(specs))
        workers = [_Worker(ctx, tracking_event) for _ in range(n)]
        last_poll = time.monotonic()
        while True:
            take()
            if not (open_feed or pending or deferred or any(w.spec is not None for w in workers)):
                break
            for w in workers:
                if w.spec is None and pending:
                    w.spec = _next_spec(pending, workers)
                    if w.spec is None:
                        continue
                    try:
                        w.conn.send((w.spec.fn, w.spec.args) if isinstance(w.spec, Task) else w.spec)
                    except (BrokenPipeError, OSError):
                        pass  # its death is noticed below
            active = [w for w in workers if w.spec is not None]
            poll = FEED_POLL_S if open_feed else POLL_S  # a fed spec waits at most this long for a free worker
            if active:
                ready = wait([w.conn for w in active] + [w.proc.sentinel for w in active], timeout=poll)
            else:
                ready = []
                feed.arrived.wait(poll) if open_feed else time.sleep(poll)
            survivors: list[_Worker] = []
            for w in workers:
                out = None
                if w.spec is not None and w.conn in ready:
                    try:
                        out = w.conn.recv()
                    except (EOFError, OSError):
                        out = None
                if out is None and not w.proc.is_alive():
                    w.proc.join(1)
                    if isinstance(w.spec, Task):
                        out = (None, f"worker process died (exit code {w.proc.exitcode})")
                    elif w.spec is not None:
                        out = _died(w.spec, f"exit code {w.proc.exitcode}")
                    w.conn.close()
                else:
                    survivors.append(w)
                if out is None:
                    continue
                spec, w.spec = w.spec, None
                finish(spec, out)
            workers = survivors
            if deferred and (time.monotonic() - last_poll >= POLL_S or not pending):
                last_poll = time.monotonic()
                free = [s for s in deferred if not _busy_elsewhere(s)]
                deferred = [s for s in deferred if s not in free]
                pending.extend(free)
            need = n_jobs if open_feed else min(n_jobs, len(pending) + sum(w.spec is not None for w in workers))
            while len(workers) < need:  # replace workers that died
                workers.append(_Worker(ctx, tracking_event))
    finally:
        _stop_workers(workers)


def _stop_workers(workers: list[_Worker]) -> None:
    """Release idle workers, SIGTERM busy ones, join for STOP_GRACE_S, then kill. Ctrl-C and
    SIGTERM wait until it is done (a second Ctrl-C cutting the joins short left a worker that
    multiprocessing's exit hook then waited for forever); they are raised afterwards."""
    with signals_deferred():
        _stop_workers_now(workers)


def _stop_workers_now(workers: list[_Worker]) -> None:
    for w in workers:
        if w.proc.is_alive():
            if w.spec is None:
                try:
                    w.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            else:
                try:
                    os.kill(w.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(1)
        try:
            w.conn.close()
        except OSError:
            pass
