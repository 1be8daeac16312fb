"""The simulator's worker in real time: repro.sim.worker.SimWorker driven by the wall clock.

The emulated SGLang worker (emulated_worker.py) is this plus SGLang's HTTP surface. One place per
idea: SGLang-like continuous batching over a `repro.kvcache` radix cache is the simulator's own
SimWorker (with that module's documented simplifications), timed by the same step-cost model
(`repro.costmodel.StepCostModel`); only the event heap is replaced by a real-time loop. A step of
modelled duration d sleeps d / time_scale wall seconds. The clock is emulated seconds: while the
worker is busy the next step starts exactly when the previous one was due to end (so wall-clock
overheads do not pile up on its timeline, as on a GPU that runs ahead of its host), unless it has
fallen more than MAX_LAG_WALL_S (20 ms) of wall time behind, in which case the debt is dropped;
when it is idle the clock catches up with the wall clock (x time_scale).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import numpy as np

from repro.backends.sglang import protocol
from repro.backends.sglang.config import EmulatorConfig
from repro.kvcache import as_key
from repro.workloads.request import Request

log = logging.getLogger("repro.emulated_worker")

MAX_LAG_WALL_S = 0.02


def _growing_table():
    """A repro.sim RequestTable that grows as requests arrive over HTTP."""
    from repro.sim.worker import RequestTable

    class GrowingRequestTable(RequestTable):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__([])

        def add(self, request) -> int:
            i = self.n
            prompt = np.ascontiguousarray(request.prompt_tokens, dtype=np.int32)
            self.requests.append(request)
            self.arrival_s.append(float(request.arrival_s))
            self.prompt_tokens.append(prompt)
            self.prompt_key.append(as_key(prompt))
            self.prompt_len.append(len(prompt))
            self.output_len.append(int(request.output_len))
            for name, value in (
                ("worker", -1),
                ("prefill_start_s", math.nan),
                ("first_token_s", math.nan),
                ("finish_s", math.nan),
                ("cached_tokens", 0),
                ("compute_start", 0),
                ("compute_len", 0),
                ("prefilled", 0),
                ("lock_node", None),
                ("est_hit", 0),
                ("peek_len", 0),
                ("peek_version", -1),
            ):
                getattr(self, name).append(value)
            self.n = i + 1
            return i

    return GrowingRequestTable()


class Stream:
    """One request's events (dicts; an exception if the scheduler failed), in order."""

    __slots__ = ("rid", "queue", "emitted", "output_ids", "open")

    def __init__(self, rid: str, output_ids: np.ndarray):
        self.rid = rid
        self.queue: asyncio.Queue = asyncio.Queue()
        self.emitted = 0
        self.output_ids = output_ids
        self.open = True


class RealTimeWorker:
    """A SimWorker driven by the wall clock: `submit` requests, read their events from each stream's queue."""

    def __init__(self, cfg: EmulatorConfig, cost_model: Any = None):
        from repro.kvcache import make_cache
        from repro.sim.worker import SchedulerConfig, SimWorker

        self.cfg = cfg
        if cost_model is None:
            from repro.costmodel import StepCostModel

            cost_model = StepCostModel.from_config(cfg.model, cfg.hardware)
        self.cost_model = cost_model
        self.time_scale = float(cfg.time_scale)
        self.cache = make_cache(int(cfg.kv_capacity_tokens), dict(cfg.eviction), int(cfg.seed))
        self.table = _growing_table()
        self.sim = SimWorker(
            int(cfg.worker_id),
            self.cache,
            cost_model,
            SchedulerConfig.from_config(cfg.scheduler),
            self.table,
            str(cfg.eviction["name"]),
            observer=self._observe,
        )
        self.streams: dict[int, Stream] = {}
        self.running: list[int] = []  # first token emitted, not finished (the decode batch)
        self._step_info = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._t0_wall = 0.0
        self._clock = 0.0  # emulated seconds: end of the last step
        self._started_wall = 0.0
        self.requests_finished = 0
        self.scheduler_error: BaseException | None = None
        self._prompt_ids = protocol.PromptIds(cfg.tokenizer)  # text requests: the cell's tokenizer

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        """Emulated seconds since start (wall x time_scale)."""
        return (asyncio.get_running_loop().time() - self._t0_wall) * self.time_scale

    def _wall_at(self, emulated_s: float) -> float:
        return self._t0_wall + emulated_s / self.time_scale

    # ------------------------------------------------------------------ scheduler
    def _observe(self, event: str, worker: Any, info: Any) -> None:
        if event == "start":
            self._step_info = info

    def _has_work(self) -> bool:
        s = self.sim
        return bool(s.waiting) or s.chunked >= 0 or s.n_running > 0

    async def _scheduler_loop(self) -> None:
        loop = asyncio.get_running_loop()
        sim = self.sim
        try:
            while True:
                if not self._has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                now = self.now()
                # Back-to-back steps while busy; a debt of more than MAX_LAG_WALL_S of wall time
                # (the process was starved) is forgiven rather than repaid in a burst.
                start = self._clock if now - self._clock <= MAX_LAG_WALL_S * self.time_scale else now
                dur = sim.start_step(start)
                if dur < 0:  # work that cannot be scheduled yet (cannot happen with validated sizes)
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                info = self._step_info
                end = start + dur
                delay = self._wall_at(end) - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # let the HTTP handlers run between back-to-back steps
                done = sim.end_step(end)
                self._clock = end
                self._emit(info, done)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a broken invariant: fail every open request loudly
            log.exception("emulated worker %d: scheduler failed", self.cfg.worker_id)
            self.scheduler_error = exc
            for st in self.streams.values():
                st.queue.put_nowait(exc)

    def _event(self, i: int, st: Stream, finished: bool) -> dict:
        k = st.emitted
        meta = {
            "id": st.rid,
            "finish_reason": {"type": "length", "length": k} if finished else None,
            "prompt_tokens": self.table.prompt_len[i],
            "completion_tokens": k,
            "cached_tokens": int(self.table.cached_tokens[i]),
        }
        start = self.table.prefill_start_s[i]
        if self.cfg.enable_metrics and not math.isnan(start):  # SGLang's queue time: wall seconds
            meta["queue_time"] = max(0.0, start - self.table.arrival_s[i]) / self.time_scale
        return {"text": "", "output_ids": st.output_ids[:k].tolist(), "meta_info": meta}

    def _emit(self, info: Any, done: list[int]) -> None:
        finished = set(done)
        t = self.table
        if info is not None and info.prefill:
            advanced = [
                i for i, _ in info.prefill if not math.isnan(t.first_token_s[i]) and self.streams[i].emitted == 0
            ]
        else:
            advanced = list(self.running)
        for i in advanced:
            st = self.streams[i]
            st.emitted += 1
            is_done = i in finished
            if st.emitted == 1 and not is_done:
                self.running.append(i)
            st.queue.put_nowait(self._event(i, st, is_done))
        if finished:
            self.running = [i for i in self.running if i not in finished]
            for i in done:
                self.streams.pop(i, None)
                self.requests_finished += 1
        if len(self.running) != self.sim.n_running:  # the SimWorker and this loop disagree
            raise RuntimeError(
                f"emulated worker {self.cfg.worker_id}: {len(self.running)} streams decoding, "
                f"scheduler says {self.sim.n_running}"
            )

    # ------------------------------------------------------------------ admission
    def _output_ids(self, index: int, n: int, reference: np.ndarray | None) -> np.ndarray:
        out = np.empty(n, dtype=np.int32)
        k = 0
        if reference is not None:
            k = min(n, len(reference))
            out[:k] = reference[:k]
        if k < n:
            rng = np.random.default_rng([int(self.cfg.seed) % (2**63), index])
            out[k:] = rng.integers(0, 128_000, n - k, dtype=np.int32)
        return out

    def submit(self, inp: protocol.GenerateInput) -> tuple[int, Stream]:
        """Queue one request on the scheduler; returns (index, its stream)."""
        if self.scheduler_error is not None:
            raise RuntimeError(f"scheduler failed: {self.scheduler_error!r}")
        prompt = self._prompt_ids(inp)
        n_out = inp.max_new_tokens
        need = len(prompt) + n_out
        if need > self.sim.max_request_kv_tokens:  # capacity - 2 under SGLang's exact admission rule
            raise protocol.ProtocolError(
                f"the request needs {len(prompt)} prompt + {n_out} output = {need} KV tokens, "
                f"more than this worker can admit ({self.sim.max_request_kv_tokens} of its "
                f"{self.sim.capacity} tokens of KV cache)"
            )
        index = self.table.n
        out = self._output_ids(index, n_out, inp.reference_output_ids)
        req = Request(index, self.now(), prompt, n_out, out, 0, 0, 0, None)
        i = self.table.add(req)
        rid = inp.rid or f"emu{self.cfg.worker_id}-{i}"
        st = Stream(rid, out)
        self.streams[i] = st
        self.table.worker[i] = self.cfg.worker_id
        if not self._has_work():
            # An idle worker's clock catches up with the wall clock before the new work starts.
            self._clock = max(self._clock, self.now())
        self.sim.enqueue(i)
        self._wake.set()
        return i, st

    # ------------------------------------------------------------------ lifecycle
    def start_scheduler(self) -> None:
        """Start the clock and the scheduler loop (inside the running event loop)."""
        loop = asyncio.get_running_loop()
        self._t0_wall = self._started_wall = loop.time()
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._scheduler_loop())

    async def stop_scheduler(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):
                pass


__all__ = ["MAX_LAG_WALL_S", "RealTimeWorker", "Stream"]
