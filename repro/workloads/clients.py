"""Clients whose sends depend on completions: the authors' benchmark clients (protocol=artifact).

A workload whose `Workload.client` is set is not a list of timed requests: `requests` is the
universe of distinct requests the client may send (arrival 0, validated like any workload) and
the simulator asks a fresh client (`plan.start()`) what to send, on simulated time:

* `start()` -> send times ("slots") open at the start;
* `send(now, rid)` at each slot, in time order, after every completion up to `now` is applied:
  the request sent (a copy of a universe request with id `rid` and arrival `now`), or None when
  nothing is left to send (the slot is dropped);
* `on_complete(request, now)` -> the slot times this completion opens (never before `now`, never
  before a slot already open: the simulator appends them in order).

Two clients, with the facts of the authors' scripts (docs in REPRODUCE.md, protocol=artifact):

`WarmupThenOpenLoop` (bench_serving.py, long.py): optional warm-up requests sent at t = 0; once the
last of them completes, `start_gap_s` (bench_serving sleeps 1 s after its cache flush, which the
0.1.4 router answers with 404, so nothing is flushed) and then the timed stream, its offsets
fixed when the workload is built (Poisson, first request at once).

`ClosedLoop` (multi-turn.py): `concurrency` requests in flight. Each conversation has a state, the
number of its turns done; a send draws a conversation uniformly among those with turns left
(Python's `random.choice` over `available_indices()`), in flight or not, and sends its next turn
(so a conversation drawn twice sends the same turn twice). A completion of turn k sets the
state to k + 1, also when a later turn already finished (their client stores
`finished_prompts = prompt_idx + 1`). The client polls on a Poisson clock of rate
`poll_rate_per_s` (their `sleep(exponential(1 / request_rate))`): every completion is seen at the
first poll at or after it, and the freed slot is filled there; a slot that finds nothing to send
is carried to the next poll that follows a completion (their loop tries to refill on every poll,
and only a completion can make a conversation available again). The loop ends when nothing is in
flight and nothing is left. The history of a turn is fixed when the workload is built (the
model's replies are the deterministic generated tokens), so a state is one integer.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from repro.workloads.request import Request


class Client(Protocol):
    """What the simulator asks (module docstring); one object per simulation."""

    expected_requests: int

    def start(self) -> list[float]: ...

    def send(self, now: float, rid: int) -> Request | None: ...

    def on_complete(self, request: Request, now: float) -> list[float]: ...


@dataclass(frozen=True)
class WarmupThenOpenLoopPlan:
    """Universe indices: `warmup` sent at 0, then `stream[k]` at (warm-up end + gap + offsets_s[k])."""

    warmup: tuple[int, ...]
    stream: tuple[int, ...]
    offsets_s: tuple[float, ...]
    start_gap_s: float = 1.0

    kind = "warmup_then_open_loop"

    def __post_init__(self) -> None:
        if len(self.stream) != len(self.offsets_s):
            raise ValueError("stream and offsets_s differ in length")
        if any(b < a for a, b in zip(self.offsets_s, self.offsets_s[1:])) or (self.offsets_s and self.offsets_s[0] < 0):
            raise ValueError("offsets_s must be non-negative and sorted")
        if not math.isfinite(self.start_gap_s) or self.start_gap_s < 0:
            raise ValueError(f"start_gap_s must be >= 0, got {self.start_gap_s}")

    @property
    def expected_requests(self) -> int:
        return len(self.warmup) + len(self.stream)

    def describe(self) -> dict:
        return {
            "client": self.kind,
            "warmup_requests": len(self.warmup),
            "stream_requests": len(self.stream),
            "start_gap_s": self.start_gap_s,
        }

    def start(self, universe: Sequence[Request]) -> "WarmupThenOpenLoop":
        return WarmupThenOpenLoop(self, universe)


class WarmupThenOpenLoop:
    def __init__(self, plan: WarmupThenOpenLoopPlan, universe: Sequence[Request]):
        self.plan = plan
        self.universe = universe
        self._queue: list[int] = []  # universe indices, in send order
        self._next = 0
        self._warm_left = len(plan.warmup)
        self._warm_ids: set[int] = set()

    @property
    def expected_requests(self) -> int:
        return self.plan.expected_requests

    def start(self) -> list[float]:
        p = self.plan
        if p.warmup:
            self._queue = list(p.warmup)
            return [0.0] * len(p.warmup)
        self._queue = list(p.stream)
        return [float(t) for t in p.offsets_s]

    def send(self, now: float, rid: int) -> Request | None:
        if self._next >= len(self._queue):
            return None
        q = self._queue[self._next]
        if self._warm_left and self._next < len(self.plan.warmup):
            self._warm_ids.add(rid)
        self._next += 1
        return self.universe[q].resent(rid, now)

    def on_complete(self, request: Request, now: float) -> list[float]:
        if request.id not in self._warm_ids:
            return []
        self._warm_ids.discard(request.id)
        self._warm_left -= 1
        if self._warm_left:
            return []
        t0 = now + self.plan.start_gap_s
        self._queue = self._queue + list(self.plan.stream)
        return [t0 + float(t) for t in self.plan.offsets_s]


@dataclass(frozen=True)
class ClosedLoopPlan:
    """`conversations[c][k]`: universe index of conversation c's turn k; warm-up indices are sent
    first, alone, on a state of their own (multi-turn.py's warm-up copies conversation 0's first turn)."""

    conversations: tuple[tuple[int, ...], ...]
    concurrency: int
    poll_rate_per_s: float
    seed: int
    warmup: tuple[int, ...] = ()
    start_gap_s: float = 1.0

    kind = "closed_loop"

    def __post_init__(self) -> None:
        if not self.conversations or any(not c for c in self.conversations):
            raise ValueError("a closed loop needs conversations of at least one turn")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.poll_rate_per_s > 0:
            raise ValueError(f"poll_rate_per_s must be > 0 (inf: poll at every completion), got {self.poll_rate_per_s}")
        if not math.isfinite(self.start_gap_s) or self.start_gap_s < 0:
            raise ValueError(f"start_gap_s must be >= 0, got {self.start_gap_s}")

    @property
    def expected_requests(self) -> int:
        """Without duplicate draws; the real count is at least this."""
        return len(self.warmup) + sum(len(c) for c in self.conversations)

    def describe(self) -> dict:
        return {
            "client": self.kind,
            "warmup_requests": len(self.warmup),
            "conversations": len(self.conversations),
            "turns": sum(len(c) for c in self.conversations),
            "concurrency": self.concurrency,
            "poll_rate_per_s": self.poll_rate_per_s,
            "start_gap_s": self.start_gap_s,
        }

    def start(self, universe: Sequence[Request]) -> "ClosedLoop":
        return ClosedLoop(self, universe)


class ClosedLoop:
    def __init__(self, plan: ClosedLoopPlan, universe: Sequence[Request]):
        self.plan = plan
        self.universe = universe
        self.done_turns = [0] * len(plan.conversations)  # each conversation's state
        self._available = list(range(len(plan.conversations)))  # conversations with turns left, sorted
        self._sent_turn: dict[int, tuple[int, int]] = {}  # request id -> (conversation, turn), in flight
        self._warm_ids: set[int] = set()
        self._warm_left = len(plan.warmup)
        self._warm_queue = list(plan.warmup)
        self._draw = np.random.default_rng(plan.seed)  # conversation draws
        self._poll_rng = np.random.default_rng([plan.seed, 1])  # the poll clock
        self._poll_t = math.inf  # next poll time (set when the loop starts)
        self._carry = 0  # slots that found nothing to send, refilled at the next useful poll
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def expected_requests(self) -> int:
        return self.plan.expected_requests

    def start(self) -> list[float]:
        if self._warm_queue:
            return [0.0] * len(self._warm_queue)
        return self._begin(0.0)

    def _begin(self, t0: float) -> list[float]:
        self._poll_t = t0
        self._advance_poll(t0)
        return [t0] * self.plan.concurrency

    def _advance_poll(self, t: float) -> float:
        """First poll time >= t (the poll clock only moves forward)."""
        rate = self.plan.poll_rate_per_s
        if math.isinf(rate):
            self._poll_t = max(self._poll_t, t)
            return self._poll_t
        while self._poll_t < t:
            self._poll_t += float(self._poll_rng.exponential(1.0 / rate))
        return self._poll_t

    def send(self, now: float, rid: int) -> Request | None:
        if self._warm_queue:
            q = self._warm_queue.pop(0)
            self._warm_ids.add(rid)
            self._count(+1)
            return self.universe[q].resent(rid, now)
        if not self._available:
            self._carry += 1
            return None
        c = self._available[int(self._draw.integers(len(self._available)))]
        k = self.done_turns[c]
        self._sent_turn[rid] = (c, k)
        self._count(+1)
        return self.universe[self.plan.conversations[c][k]].resent(rid, now)

    def _count(self, d: int) -> None:
        self.in_flight += d
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def on_complete(self, request: Request, now: float) -> list[float]:
        self._count(-1)
        if request.id in self._warm_ids:
            self._warm_ids.discard(request.id)
            self._warm_left -= 1
            return [] if self._warm_left else self._begin(now + self.plan.start_gap_s)
        c, k = self._sent_turn.pop(request.id)
        was_open = self.done_turns[c] < len(self.plan.conversations[c])
        self.done_turns[c] = k + 1
        is_open = k + 1 < len(self.plan.conversations[c])
        if was_open != is_open:
            self._set_available(c, is_open)
        slots = 1 + self._carry
        self._carry = 0
        t = self._advance_poll(now)
        return [t] * slots

    def _set_available(self, c: int, on: bool) -> None:
        a = self._available
        j = bisect.bisect_left(a, c)
        if on:
            a.insert(j, c)
        else:
            del a[j]
