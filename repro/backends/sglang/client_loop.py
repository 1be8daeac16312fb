"""A client whose sends depend on completions (protocol=artifact), run in wall time.

    records, report = run_client_replay(plan, universe, "http://127.0.0.1:30000", ClientConfig())

`plan` is a workload's `Workload.client` (repro.workloads.clients: the authors' warm-up-then-
Poisson client of bench_serving.py / long.py, or multi-turn.py's closed loop) and `universe` the
requests it may send. The same client object the simulator asks is asked here, with the same
order of calls: its send slots (seconds since the start, x time_scale when emulating) are kept in
time order; whenever a request's final event arrives the client is told at once
(`on_complete(request, now)`) and may open slots; at each slot's time the client picks what to
send (`send(now, rid)`, rid = the next record id, so the warm-up is ids 0..k-1 as the artifact
metrics expect), or nothing (the slot is dropped). The loop ends when no slot is open and nothing
is in flight.

Differences from the simulator, all of wall time: `now` is the time the client sees a completion
(microseconds after its final event), and a slot is served when the loop gets to it (its lag is
in `report["send_lag_s"]`). A failed request counts as completed for the client (the loop would
otherwise wait on it forever; their clients record the error and go on); it is a failed row.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import Any, Callable, Sequence

import pandas as pd

from repro.backends.sglang import protocol
from repro.backends.sglang.client import ClientConfig, LiveWindow, _one, _Row, records_frame, replay_report


async def client_replay(
    plan: Any,
    universe: Sequence[Any],
    base_url: str,
    cfg: ClientConfig,
    progress: Callable[[float], None] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Run `plan.start(universe)` against `base_url`; (records in send order, report)."""
    import aiohttp

    if not universe:
        raise ValueError("client: the workload's client has no requests to send")
    client = plan.start(universe)
    scale = cfg.time_scale
    slots: collections.deque = collections.deque(float(t) for t in client.start())
    url = base_url.rstrip("/") + cfg.path
    protocol.raise_open_file_limit()
    sent: list[Any] = []
    rows: list[_Row] = []
    tasks: list[asyncio.Task] = []
    completed: asyncio.Queue[int] = asyncio.Queue()
    expected = max(1, int(client.expected_requests))
    report_every = max(1, expected // 100)
    live = LiveWindow(expected, getattr(progress, "log", None))
    dropped = in_flight = max_in_flight = 0
    finished = 0
    wall0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout, read_bufsize=protocol.MAX_LINE_BYTES
    ) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time() - (slots[0] / scale if slots else 0.0)  # the first slot is served now

        def now() -> float:
            return (loop.time() - t0) * scale

        def _done(i: int, task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:  # a bug in _one: a failed row
                exc = task.exception()
                rows[i].failed, rows[i].error_kind, rows[i].error = True, "client_error", f"{type(exc).__name__}: {exc}"
            completed.put_nowait(i)

        def _apply(i: int) -> None:
            nonlocal in_flight, finished
            in_flight -= 1
            finished += 1
            t = now()
            for s in client.on_complete(sent[i], t):  # in time order, never before `t`
                slots.append(max(float(s), slots[-1] if slots else float(s)))
            live.add(rows[i], loop.time())
            if progress is not None and (finished % report_every == 0):
                progress(min(1.0, finished / expected))

        while True:
            while not completed.empty():
                _apply(completed.get_nowait())
            if slots and slots[0] <= now():
                t = slots.popleft()
                req = client.send(t, len(sent))
                if req is None:
                    dropped += 1
                    continue
                row = _Row()
                sent.append(req)
                rows.append(row)
                task = asyncio.create_task(_one(session, url, req, cfg, t0, row))
                task.add_done_callback(functools.partial(_done, len(sent) - 1))
                tasks.append(task)
                in_flight += 1
                max_in_flight = max(max_in_flight, in_flight)
                continue
            if in_flight == 0 and not slots:
                break
            wait = (slots[0] - now()) / scale if slots else None
            try:
                _apply(await asyncio.wait_for(completed.get(), timeout=wait))
            except TimeoutError:
                pass
        await asyncio.gather(*tasks, return_exceptions=True)
    if progress is not None:
        progress(1.0)
    if not sent:
        raise RuntimeError("client: the workload's client sent nothing")
    records = records_frame(sent, rows)
    report = {
        **replay_report(sent, rows, wall0, scale),
        "client": {
            **plan.describe(),
            "sent": len(sent),
            "dropped_slots": dropped,
            "max_in_flight": max_in_flight,
            # the closed loop's duplicate draws: a conversation's turn sent again while (or after) it ran
            "duplicate_sends": _duplicates(sent[len(getattr(plan, "warmup", ())) :]),
        },
    }
    return records, report


def _duplicates(sent: Sequence[Any]) -> int:
    """Sends of a (conversation, turn) already sent; 0 for workloads without conversations."""
    turns = [(r.conversation_id, r.turn) for r in sent if getattr(r, "conversation_id", -1) is not None]
    turns = [t for t in turns if t[0] is not None and t[0] >= 0]
    return len(turns) - len(set(turns))


def run_client_replay(
    plan: Any,
    universe: Sequence[Any],
    base_url: str,
    cfg: ClientConfig,
    progress: Callable[[float], None] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Synchronous wrapper of `client_replay` (its own event loop)."""
    return asyncio.run(client_replay(plan, universe, base_url, cfg, progress))


__all__ = ["client_replay", "run_client_replay"]
