"""Discrete-event cluster: arrivals -> router -> workers; step ends -> completions -> router.

The event loop merges two sources: the arrivals (already sorted by time) and a heap of
step-end events ``(time, seq, worker)`` with its own sequence counter, so ties are broken
deterministically. Time is simulated time only; the wall clock is read solely to measure the
CPU cost of routing / completion callbacks / evictions (SimTimings), which never feeds back.

Simultaneous events (same simulated time) are applied in this order: step ends (in the order
the steps were started), then arrivals (in arrival order); only then do idle workers with work
start their next step. So a request arriving exactly when a worker frees up joins that worker's
next batch, and a router that is told of a completion at time t sees it before routing an
arrival at t.
"""

from __future__ import annotations

import gc
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from heapq import heappop, heappush
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pandas as pd

from repro.kvcache.protocol import KVCache
from repro.metrics import RECORD_COLUMNS
from repro.routing.base import offer_request_key, offer_request_text
from repro.sim.worker import Observer, RequestTable, SchedulerConfig, SimTimings, SimWorker, SimWorkerView

GC_YOUNG_THRESHOLD = 50_000  # allocations between young-generation collections during run()

if TYPE_CHECKING:  # pragma: no cover
    from repro.routing.base import Router
    from repro.workloads.clients import Client
    from repro.workloads.request import Request


@dataclass
class SimResult:
    """Output of one simulation: records (RECORD_COLUMNS), timings (wall clock), stats."""

    records: pd.DataFrame
    timings: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


class SimCluster:
    """M SimWorkers behind one router; `run()` simulates every request to completion.

    `caches[i]` is worker i's radix cache (repro.kvcache contract), `cost_model` the
    step-cost model (repro.costmodel contract) shared by all workers, `router` a
    repro.routing.base.Router (reset here with the plain int `router_seed`). `requests` are
    taken as valid: sorted by arrival, unique ids, each fitting every cache
    (repro.backends.assembly.validate_requests checks that before a cell builds anything).
    """

    def __init__(
        self,
        requests: Sequence["Request"],
        caches: Sequence[KVCache],
        cost_model: Any,
        router: "Router",
        scheduler: SchedulerConfig,
        eviction_policy: str,
        router_seed: int,
        observer: Observer | None = None,
        client: "Client | None" = None,
    ):
        if not caches:
            raise ValueError("need at least one worker")
        if not requests:
            raise ValueError("no requests to simulate")
        # a client (repro.workloads.clients) decides the sends; `requests` is then what it may send
        self.client = client
        self.table = RequestTable(requests if client is None else ())
        self.timings = SimTimings()
        self.workers = [
            SimWorker(w, cache, cost_model, scheduler, self.table, eviction_policy, self.timings, observer)
            for w, cache in enumerate(caches)
        ]
        self.views = [SimWorkerView(w) for w in self.workers]
        if client is not None and scheduler.exact_budgets:  # the workers' own check sees an empty table
            _check_fits(requests, self.workers[0])
        self.router = router
        self.router_seed = router_seed
        self._ran = False

    def run(self, progress: Callable[[float], None] | None = None, sampler: "StateSampler | None" = None) -> SimResult:
        """Simulate to the end; `sampler` (optional) records worker state on a simulated-time grid."""
        if self._ran:
            raise RuntimeError("a SimCluster runs once; build a new one")
        self._ran = True
        # The loop allocates many short-lived acyclic objects (results, tuples, tree nodes) and
        # few cycles; CPython's default young-generation threshold (700) then spends ~15-20 % of
        # the run in collections that find almost nothing. Fewer young passes while it runs;
        # cycles are still collected, and the thresholds are restored afterwards.
        with _fewer_young_collections():
            return self._run(progress, sampler)

    def _run(self, progress, sampler) -> SimResult:
        t_wall0 = perf_counter_ns()
        table, workers, views, router, tm = self.table, self.workers, self.views, self.router, self.timings
        router.reset(views, self.router_seed)
        select, complete = router.select_worker, router.on_request_complete
        uses_text = getattr(router, "uses_text", False)  # test doubles need not subclass Router
        reqs = table.requests
        keys = table.prompt_key
        n = table.n
        m = len(workers)
        inf = math.inf
        client = self.client
        if client is None:
            arrival = table.arrival_s + [inf]  # sentinel: no bounds checks in the loop
        else:  # arrival[:ai]: the sent requests' times; arrival[ai:-1]: open send slots
            arrival = [*client.start(), inf]
            n = client.expected_requests
        heap: list[tuple[float, int, int]] = []
        seq = 0
        ai = 0
        n_done = 0
        report_every = max(1, n // 100)
        next_report = report_every
        kick: list[int] = []
        last = arrival[n - 1] if client is None else max(arrival[-2], arrival[0] + 1.0)  # a client's: a hint
        next_sample = sampler.start(views, arrival[0], last) if sampler is not None else inf
        while True:
            ta = arrival[ai]
            if heap and heap[0][0] <= ta:
                now, _, w = heappop(heap)
                if now >= next_sample:  # state before the events at `now`
                    next_sample = sampler.sample(now)
                worker = workers[w]
                done = worker.end_step(now)
                if done:
                    first, finish, cached = table.first_token_s, table.finish_s, table.cached_tokens
                    for i in done:
                        a = arrival[i]
                        req = reqs[i]
                        offer_request_key(req, keys[i])
                        keys[i] = b""  # the request is no longer in flight: its key goes
                        t0 = perf_counter_ns()
                        complete(req, w, finish[i] - a, first[i] - a, cached[i], now)
                        tm.complete_ns += perf_counter_ns() - t0
                        if client is not None:
                            _open_slots(arrival, client.on_complete(req, now), now)
                    tm.complete_calls += len(done)
                    n_done += len(done)
                    if progress is not None and n_done >= next_report:
                        progress(min(1.0, n_done / n))
                        next_report = n_done + report_every
            elif ta < inf:
                now = ta
                if now >= next_sample:
                    next_sample = sampler.sample(now)
                i = ai
                if client is not None and not _client_send(client, table, arrival, ai, now):
                    if not kick:  # the slot found nothing to send (dropped)
                        continue
                    w = -1  # workers kicked earlier at `now` may be due
                else:
                    ai += 1
                    req = reqs[i]
                    offer_request_key(req, table.key(i))  # built once, here: routers and workers share it
                    if uses_text:  # the workload's text, made outside the routing time
                        offer_request_text(req, req.text)
                    t0 = perf_counter_ns()
                    w = select(req, views, now)
                    tm.route_ns += perf_counter_ns() - t0
                    tm.route_calls += 1
                    if w.__class__ is not int:
                        w = _as_worker_id(w, m)
                    elif not 0 <= w < m:
                        raise ValueError(f"router returned worker {w!r}; valid ids are 0..{m - 1}")
                    table.worker[i] = w
                    worker = workers[w]
                    worker.enqueue(i)
                    if worker.busy:
                        if not kick:
                            continue
                        w = -1  # nothing new to kick, but workers kicked earlier at `now` may be due
            else:
                break
            # worker w (unless -1) may start a step once every event at `now` is applied
            nt = arrival[ai]
            if heap and heap[0][0] < nt:
                nt = heap[0][0]
            if nt > now:
                if kick:  # idle workers kicked earlier at `now`, in event order, then w
                    if w >= 0:
                        kick.append(w)
                    for w in kick:
                        worker = workers[w]
                        if not worker.busy:
                            dur = worker.start_step(now)
                            if dur >= 0.0:
                                heappush(heap, (now + dur, seq, w))
                                seq += 1
                    kick.clear()
                else:  # the common case: w alone
                    dur = worker.start_step(now)
                    if dur >= 0.0:
                        heappush(heap, (now + dur, seq, w))
                        seq += 1
            elif w >= 0:
                kick.append(w)
        n = table.n
        if n_done != n:  # cannot happen unless a component broke its contract
            stuck = [i for i in range(n) if math.isnan(table.finish_s[i])][:5]
            raise RuntimeError(f"simulation ended with {n - n_done} unfinished requests, e.g. {stuck}")
        if progress is not None:
            progress(1.0)
        if sampler is not None:
            sampler.sample(sampler.sample(now))  # the grid runs to one point past the last event
        wall_s = (perf_counter_ns() - t_wall0) / 1e9
        timings = tm.as_dict()
        timings["simulation"] = {"wall_s": wall_s, "requests_per_wall_s": n / wall_s if wall_s > 0 else None}
        stats = {
            "prefill_steps": [wk.prefill_steps for wk in workers],
            "decode_steps": [wk.decode_steps for wk in workers],
            "busy_s": [wk.busy_s for wk in workers],
        }
        return SimResult(self.records(), timings, stats)

    def records(self) -> pd.DataFrame:
        """One row per request, RECORD_COLUMNS, in arrival order."""
        t = self.table
        reqs = t.requests
        arrival = np.array(t.arrival_s, dtype=np.float64)
        prefill_start = np.array(t.prefill_start_s, dtype=np.float64)
        first = np.array(t.first_token_s, dtype=np.float64)
        finish = np.array(t.finish_s, dtype=np.float64)
        df = pd.DataFrame(
            {
                "id": np.array([r.id for r in reqs], dtype=np.int64),
                "worker": np.array(t.worker, dtype=np.int64),
                "arrival_s": arrival,
                "first_token_s": first,
                "finish_s": finish,
                "queue_wait_s": prefill_start - arrival,
                "prefill_s": first - prefill_start,
                "decode_s": finish - first,
                "prompt_tokens": np.array(t.prompt_len, dtype=np.int64),
                "cached_tokens": np.array(t.cached_tokens, dtype=np.int64),
                "output_tokens": np.array(t.output_len, dtype=np.int64),
                "group": np.array([r.group_id for r in reqs], dtype=np.int64),
                "failed": np.zeros(t.n, dtype=bool),
            }
        )
        return df[list(RECORD_COLUMNS)]


class StateSampler:
    """Per-worker state (in flight, queued, KV tokens in use) on a regular grid of simulated time.

    Grid t_k = t0 + k * dt; the value at t_k is the state after every event before t_k. dt
    starts at (last arrival - first arrival) / (max_points / 2); whenever the grid would pass
    `max_points` (a long drain), every other point is dropped and dt doubles, so a cell ends with
    max_points/2 .. max_points points whatever its length, at one float compare per event.
    Reads only the router-facing SimWorkerView attributes.
    """

    def __init__(self, max_points: int = 320):
        if max_points < 4:
            raise ValueError(f"max_points must be >= 4, got {max_points}")
        self.max_points = int(max_points)
        self.t0 = 0.0
        self.dt = 1.0
        self.in_flight: list[list[int]] = []  # one row per grid point, one column per worker
        self.queue: list[list[int]] = []
        self.kv_used: list[list[int]] = []
        self.kv_capacity: list[int] = []
        self._views: Sequence[SimWorkerView] = ()

    def start(self, views: Sequence[SimWorkerView], first_arrival_s: float, last_arrival_s: float) -> float:
        self._views = views
        self.kv_capacity = [int(v.kv_capacity_tokens) for v in views]
        span = float(last_arrival_s) - float(first_arrival_s)
        self.t0 = float(first_arrival_s)
        self.dt = span / (self.max_points // 2) if span > 0 else 1e-3
        return self.t0

    def sample(self, now: float) -> float:
        """Record the current state at every grid time <= now not yet recorded; next grid time."""
        views = self._views
        fl = [v.in_flight for v in views]
        q = [v.waiting for v in views]
        kv = [v.kv_used_tokens for v in views]
        while True:
            k = len(self.in_flight)
            t = self.t0 + k * self.dt
            if t > now:
                return t
            self.in_flight.append(fl)
            self.queue.append(q)
            self.kv_used.append(kv)
            if len(self.in_flight) >= self.max_points:
                self.in_flight = self.in_flight[::2]
                self.queue = self.queue[::2]
                self.kv_used = self.kv_used[::2]
                self.dt *= 2.0

    def as_dict(self) -> dict:
        """Plain arrays: time_s (K,), in_flight / queue / kv_used_tokens (K, M), kv_capacity_tokens (M,)."""
        k = len(self.in_flight)
        m = len(self.kv_capacity)
        return {
            "time_s": self.t0 + self.dt * np.arange(k, dtype=np.float64),
            "in_flight": np.array(self.in_flight, dtype=np.int32).reshape(k, m),
            "queue": np.array(self.queue, dtype=np.int32).reshape(k, m),
            "kv_used_tokens": np.array(self.kv_used, dtype=np.int64).reshape(k, m),
            "kv_capacity_tokens": np.array(self.kv_capacity, dtype=np.int64),
        }


_gc_lock = threading.Lock()
_gc_depth = [0, None]  # runs in progress in this process, thresholds before the first


@contextmanager
def _fewer_young_collections():
    """GC_YOUNG_THRESHOLD while any simulation of this process runs (threads nest), then as before."""
    with _gc_lock:
        if _gc_depth[0] == 0:
            old = _gc_depth[1] = gc.get_threshold()
            gc.set_threshold(max(old[0], GC_YOUNG_THRESHOLD), *old[1:])
        _gc_depth[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth[0] -= 1
            if _gc_depth[0] == 0:
                gc.set_threshold(*_gc_depth[1])


def _as_worker_id(w: Any, m: int) -> int:
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)):
        raise TypeError(f"router.select_worker must return an int worker id, got {w!r}")
    w = int(w)
    if not 0 <= w < m:
        raise ValueError(f"router returned worker {w}; valid ids are 0..{m - 1}")
    return w


# --------------------------------------------------------------------------- a client's sends
def _client_send(client: "Client", table: RequestTable, arrival: list[float], ai: int, now: float) -> bool:
    """Ask the client what slot `ai` sends; False (slot dropped) when it has nothing left."""
    req = client.send(now, ai)
    if req is None:
        del arrival[ai]
        return False
    if req.id != ai or req.arrival_s != now:
        raise ValueError(f"client sent request id {req.id} at {req.arrival_s}; expected id {ai} at {now}")
    _append(table, req)
    return True


def _open_slots(arrival: list[float], times: Sequence[float], now: float) -> None:
    """Insert a completion's new send slots before the sentinel (they come in time order)."""
    for t in times:
        if not (t >= now and (len(arrival) < 2 or t >= arrival[-2])):
            raise ValueError(f"client opened a send slot at {t}, before now ({now}) or an open slot")
        arrival.insert(len(arrival) - 1, t)


_PER_REQUEST_DEFAULTS = {
    "prompt_key": b"",
    "worker": -1,
    "prefill_start_s": math.nan,
    "first_token_s": math.nan,
    "finish_s": math.nan,
    "cached_tokens": 0,
    "compute_start": 0,
    "compute_len": 0,
    "prefilled": 0,
    "lock_node": None,
    "est_hit": 0,
    "peek_len": 0,
    "peek_version": -1,
}


def _append(table: RequestTable, req: "Request") -> None:
    """One more request at the end of the table (every per-request list grows in place: workers hold them)."""
    table.requests.append(req)
    table.arrival_s.append(float(req.arrival_s))
    table.prompt_len.append(int(req.prompt_len))
    table.output_len.append(int(req.output_len))
    for name, default in _PER_REQUEST_DEFAULTS.items():
        getattr(table, name).append(default)
    table.n += 1


def _check_fits(requests: Sequence["Request"], worker: SimWorker) -> None:
    """The workers' exact-budget admission check, over what the client may send."""
    worst = max(requests, key=lambda r: r.prompt_len + r.output_len)
    if worst.prompt_len + worst.output_len > worker.max_request_kv_tokens:
        raise ValueError(
            f"request {worst.id} needs {worst.prompt_len} prompt + {worst.output_len} output tokens; with "
            f"scheduler.exact_budgets SGLang admits a request only when that + 2 <= the worker's KV capacity "
            f"({worker.capacity} tokens)"
        )
