"""Stall detection: new requests stop going to a worker whose in-flight requests stopped moving.

A frozen worker (SIGSTOP, a hung GPU) is marked down only after its health checks fail (~5 s
with the defaults; never, for a hung GPU whose HTTP process still answers /health). Meanwhile
the router kept sending it new requests. Here each worker's progress is watched: any byte of a
reply (a stream event, a whole JSON reply, an error answer) is progress. A worker is EXCLUDED from
new requests (not marked down: its in-flight requests go on) when all of these hold:
- it has requests in flight and has been silent since `start` = max(its latest progress, the
  moment it became busy) for longer than its limit:
  max(floor_s, factor x (the longest silence seen on it in the last ~60 s, plus the prefill of
  what was waiting at `start` at the fastest prefill rate it showed));
- it has shown MIN_SAMPLES silences and, if prefill was waiting, a prefill rate (no history:
  no limit; health checks still apply);
- another healthy worker made progress after `start` + limit (a stall of the whole machine or of
  the service's own loop is not this worker's), and another healthy worker is not excluded;
- the check itself ran on time (a late tick means the service's loop was held: skipped).
Its next progress, or its last in-flight request leaving, ends the exclusion. Exclusions are
logged (warning) and counted in GET /stats (`stall`, and per worker `excluded`,
`stall_exclusions`, `excluded_s`, `stall_closest`: the largest silence / limit a check saw).
Conservative on purpose: a slow but alive worker has long silences in its history, so its limit
grows with them (tests/live/test_live_router_stall.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Sequence

log = logging.getLogger("repro.router_service")

CHECK_S = 0.1  # how often the limits are checked (wall seconds)
LATE_S = 0.1  # a check this much later than due is skipped: the service's loop was held
MIN_SAMPLES = 32  # silences seen before a worker can be excluded
WINDOW_S = 10.0  # the longest silence is kept per window, for the last N_WINDOWS windows
N_WINDOWS = 6
MIN_PREFILL_TOKENS = 64  # first tokens after fewer uncached tokens say nothing of the prefill rate


class _Peak:
    """The largest value seen in the last N_WINDOWS windows of WINDOW_S."""

    def __init__(self) -> None:
        self.peaks: list[tuple[int, float]] = []  # (window index, largest value in it)

    def add(self, now: float, value: float) -> None:
        k = int(now // WINDOW_S)
        if self.peaks and self.peaks[-1][0] == k:
            if value > self.peaks[-1][1]:
                self.peaks[-1] = (k, value)
        else:
            self.peaks.append((k, value))
            if len(self.peaks) > N_WINDOWS:
                del self.peaks[0]

    def value(self, now: float) -> float:
        k = int(now // WINDOW_S)
        return max((v for i, v in self.peaks if i > k - N_WINDOWS), default=math.nan)


class StallWatch:
    """One worker's progress: silences, prefill rate, exclusion episodes (monotonic seconds)."""

    def __init__(self) -> None:
        self.last_progress = -math.inf
        self.busy_since = -math.inf
        self.prefill_waiting_at_start = 0  # uncached prompt tokens waiting when the silence began
        self.samples = 0
        self.silence = _Peak()
        self.prefill_rate = _Peak()  # tokens per second, from dispatch to first token
        self.excluded_at: float | None = None
        self.first_excluded_at: float | None = None
        self.exclusions = 0
        self.excluded_s = 0.0
        self.closest = 0.0  # the largest silence / limit seen by a check (1: at the limit)

    @property
    def excluded(self) -> bool:
        return self.excluded_at is not None

    def start(self) -> float:
        return max(self.last_progress, self.busy_since)

    def became_busy(self, now: float, waiting_prefill: int) -> None:
        self.busy_since = now
        self.prefill_waiting_at_start = waiting_prefill

    def progress(self, now: float, waiting_prefill: int, worker_id: int) -> None:
        self.silence.add(now, now - self.start())
        self.samples += 1
        self.last_progress = now
        self.prefill_waiting_at_start = waiting_prefill
        if self.excluded_at is not None:
            self.end(now, worker_id, "it progresses again")

    def first_token(self, now: float, uncached_tokens: int, dispatched_at: float) -> None:
        if uncached_tokens >= MIN_PREFILL_TOKENS and now > dispatched_at:
            self.prefill_rate.add(now, uncached_tokens / (now - dispatched_at))

    def limit(self, now: float, floor_s: float, factor: float) -> float:
        """Seconds of silence allowed now (inf: not enough history)."""
        peak = self.silence.value(now)
        if self.samples < MIN_SAMPLES or math.isnan(peak):
            return math.inf
        prefill_s = 0.0
        if self.prefill_waiting_at_start > 0:
            rate = self.prefill_rate.value(now)
            if math.isnan(rate):
                return math.inf
            prefill_s = self.prefill_waiting_at_start / rate
        return max(floor_s, factor * (peak + prefill_s))

    def end(self, now: float, worker_id: int, why: str) -> None:
        if self.excluded_at is None:
            return
        held = now - self.excluded_at
        self.excluded_s += held
        self.excluded_at = None
        log.warning("worker %d: stall exclusion ended after %.2fs: %s", worker_id, held, why)


def check(workers: Sequence[Any], floor_s: float, factor: float, now: float) -> None:
    """Exclude the workers whose silence passed their limit (the module docstring's rules)."""
    for w in workers:
        st = w.stall
        if st.excluded or not w.healthy or w.in_flight == 0:
            continue
        start = st.start()
        limit = st.limit(now, floor_s, factor)
        st.closest = max(st.closest, (now - start) / limit)
        if now - start <= limit:
            continue
        others = [v for v in workers if v is not w and v.healthy]
        if not any(v.stall.last_progress > start + limit for v in others):
            continue
        if all(v.stall.excluded for v in others):
            continue
        st.excluded_at = now
        if st.first_excluded_at is None:
            st.first_excluded_at = now
        st.exclusions += 1
        log.warning(
            "worker %d excluded from routing new requests: its %d in-flight requests made no progress "
            "for %.2fs (limit %.2fs from its own history) while other workers progress",
            w.worker_id,
            w.in_flight,
            now - start,
            limit,
        )


async def stall_loop(workers: Sequence[Any], floor_s: float, factor: float) -> None:
    due = time.monotonic() + CHECK_S
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        now = time.monotonic()
        if now - due <= LATE_S:
            check(workers, floor_s, factor, now)
        due = now + CHECK_S


__all__ = ["StallWatch", "check", "stall_loop"]
