"""Benchmark client: replay a workload open-loop against a router, record what the simulator records.

    records, report = run_replay(requests, "http://127.0.0.1:30000", ClientConfig(time_scale=10))

Every request is sent at its workload arrival time (`arrival_s / time_scale` wall seconds after
the start; asyncio, open loop: a slow reply never delays the next send) as SGLang's streaming
`/generate` with the exact prompt token ids, `max_new_tokens = output_len` and `ignore_eos`
(sglang.bench_serving's fixed-length mode), plus the prompt text when the workload has it
(`send_text`): SGLang runs the ids, while text-matching routers (cache-aware, like the
simulator's `match_on: auto` and the real sglang-router) route on the text. With `send_reference_output` the workload's recorded
reply ids ride along (`custom_labels.repro_output_ids`, a field the real sglang-router forwards):
the emulated worker then generates exactly them, as the simulator assumes; SGLang ignores the key (a real model generates its own tokens, so in
multi-turn workloads the next turn's prompt — which holds the RECORDED reply — shares only the
previous prompt with what the server cached; this is a real difference from the simulator).

Under protocol=artifact (`send_ids` false) a request that has text goes as text alone, as the
authors' clients send it: the server tokenizes it (and reports the prompt length it got). A
workload with a client (`Workload.client`: the authors' warm-up and closed-loop clients) is run by
client_loop.py, which sends through the same `_one`.

Per request it records (RECORD_COLUMNS of repro.backends.base, so figures need no special case):
- arrival_s: when the request was actually sent; first_token_s: when the first event carrying
  an output token arrived; finish_s: when the final event arrived — all in seconds since the
  replay started, x time_scale (emulated seconds when the workers are emulated). The lag of
  the send behind the scheduled arrival is reported separately (`report["send_lag_s"]`).
- prompt_tokens / output_tokens / cached_tokens: the server's meta_info (prompt_tokens,
  completion_tokens, cached_tokens) of the final event.
- decode_s = finish_s - first_token_s. The client cannot see when a request leaves its worker's
  queue; the server reports it as meta_info.queue_time (SGLang with --enable-metrics, which our
  launch sets by default: backend.server.enable_metrics; the emulated worker under the same
  switch): queue_wait_s = that x time_scale and prefill_s = the rest of the TTFT (which then also
  holds the router / tokenizer hop before the scheduler's queue). Without it both are NaN.
- worker: the reply's `X-Repro-Worker` header (set by our router service and by the emulated
  worker; the real sglang-router passes the worker's header through), -1 when absent (real
  SGLang servers behind the real router).
- failed: True for an HTTP error, an error event, a malformed or truncated stream, a connection
  failure, or a request that did not finish within `request_timeout_s` (wall seconds from its
  send); such rows keep arrival_s (the send time) and have NaN first_token_s / finish_s, zero
  cached / output tokens and the workload's prompt length (the summary counts them in num_failed
  and leaves them out of every other number).
The reply ids ride in `records.attrs["output_ids"]` (not a record column): the backend writes the
cell's observed trace from them (`<cell>/logs/trace.jsonl`, repro/workloads/trace.py's format).
Nothing can hang: every request has that deadline, so the replay ends at the latest
`request_timeout_s` after the last send.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from repro.metrics import RECORD_COLUMNS
from repro.backends.sglang import protocol
from repro.backends.sglang.config import BackendConfig, ClientSection, Timeouts


@dataclass
class ClientConfig:
    time_scale: float = BackendConfig.time_scale  # emulated seconds per wall second
    request_timeout_s: float = Timeouts.request_s  # wall seconds from send to the final event
    connect_timeout_s: float = Timeouts.connect_s
    send_reference_output: bool = False  # send repro_output_ids (emulated workers; plan_cell resolves "auto")
    send_text: bool = ClientSection.send_text  # the prompt text too (when the workload has it): text-matching routers
    # False: a request with text goes as text alone, tokenized by the server as the authors' clients had it
    # (protocol=artifact; plan_cell decides); True: the exact ids, the text riding along
    send_ids: bool = True
    stream: bool = True
    path: str = "/generate"

    def __post_init__(self) -> None:
        for name in ("time_scale", "request_timeout_s", "connect_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"client: {name} must be a number > 0, got {v!r}")


@dataclass
class _Row:
    worker: int = -1
    arrival_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    queue_wait_s: float = math.nan
    failed: bool = True
    error_kind: str | None = None
    error: str | None = None
    lag_s: float = 0.0
    output_ids: list | None = None  # the reply's token ids (the observed trace: repro/workloads/trace.py)


async def _one(session, url: str, req: Any, cfg: ClientConfig, t0: float, row: _Row) -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    scale = cfg.time_scale
    body = protocol.generate_body(
        req.prompt_tokens,
        int(req.output_len),
        stream=cfg.stream,
        rid=f"repro-{req.id}",
        reference_output_ids=req.generated_tokens if cfg.send_reference_output else None,
        text=req.text if cfg.send_text or not cfg.send_ids else None,
    )
    if not cfg.send_ids and body.get("text"):
        del body["input_ids"]
    row.prompt_tokens = int(len(req.prompt_tokens))
    send = loop.time()
    row.lag_s = (send - t0) - float(req.arrival_s) / scale
    row.arrival_s = (send - t0) * scale
    tracker = protocol.OutputTracker(where=f"request {req.id}")
    first = math.nan
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            async with session.post(url, json=body) as resp:
                w = resp.headers.get(protocol.WORKER_HEADER)
                if w is not None and w.lstrip("-").isdigit():
                    row.worker = int(w)
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    row.error_kind, row.error = "http_status", f"HTTP {resp.status}: {text}"
                    return
                if not cfg.stream:
                    tracker.add(await resp.json(content_type=None))
                    first = finish = loop.time()
                else:
                    done = False
                    async for line in protocol.iter_sse_lines(resp.content):
                        if done:  # read to the end (keep-alive)
                            continue
                        ev = protocol.parse_sse_line(line, tracker.where)
                        if ev is protocol.DONE:
                            done = True
                            finish = loop.time()
                            continue
                        if ev is None:
                            continue
                        if tracker.add(ev) > 0 and math.isnan(first):
                            first = loop.time()
                    if not done:
                        raise protocol.ProtocolError(f"{tracker.where}: stream ended without [DONE]")
                if not tracker.finished:
                    raise protocol.ProtocolError(f"{tracker.where}: no event carried a finish_reason")
    except TimeoutError:
        row.error_kind, row.error = "timeout", f"no reply within {cfg.request_timeout_s:g}s"
        return
    except protocol.WorkerReportedError as exc:
        row.error_kind, row.error = "server_error", str(exc)
        return
    except protocol.ProtocolError as exc:
        row.error_kind, row.error = "malformed", str(exc)
        return
    except (aiohttp.ClientError, OSError) as exc:
        row.error_kind, row.error = "connection", f"{type(exc).__name__}: {exc}"
        return
    if math.isnan(first):
        first = finish
    row.first_token_s = (first - t0) * scale
    row.finish_s = (finish - t0) * scale
    row.prompt_tokens = int(tracker.prompt_tokens if tracker.prompt_tokens is not None else row.prompt_tokens)
    row.queue_wait_s = tracker.queue_time_s * scale
    row.cached_tokens = int(tracker.cached_tokens)
    row.output_tokens = int(tracker.completion_tokens)
    row.output_ids = list(tracker.output_ids)
    row.failed = False


class LiveWindow:
    """Sliding-window metrics of a live cell, streamed to W&B while it runs (`progress.log`):
    the keys of repro.tracking.series over the last `window_s` wall seconds, at most one point
    per `every_s`. Requests that failed count as completed but not in the latency windows."""

    def __init__(self, total: int, log: Callable[[dict], None] | None, window_s: float = 10.0, every_s: float = 2.0):
        self.total, self.log, self.window_s, self.every_s = total, log, window_s, every_s
        self.done = 0
        self._recent: collections.deque = collections.deque()  # (wall_s, latency_s, ttft_s, cached, prompt)
        self._last = -math.inf

    def add(self, row: _Row, now: float) -> None:
        if self.log is None:
            return
        self.done += 1
        if not row.failed:
            self._recent.append(
                (
                    now,
                    row.finish_s - row.arrival_s,
                    row.first_token_s - row.arrival_s,
                    row.cached_tokens,
                    row.prompt_tokens,
                )
            )
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()
        if now - self._last >= self.every_s or self.done == self.total:
            self._last = now
            self.log(self.point())

    def point(self) -> dict:
        out: dict = {"completed": self.done, "window/completed_rps": len(self._recent) / self.window_s}
        if self._recent:
            _, lat, ttft, cached, prompt = (np.asarray(c, dtype=float) for c in zip(*self._recent))
            out["window/hit_rate"] = float(cached.sum() / prompt.sum()) if prompt.sum() > 0 else math.nan
            for name, v in (("latency", lat), ("ttft", ttft)):
                p50, p95 = np.percentile(v, (50, 95))
                out[f"window/{name}_p50_s"], out[f"window/{name}_p95_s"] = float(p50), float(p95)
        return out


async def replay(
    requests: Sequence[Any], base_url: str, cfg: ClientConfig, progress: Callable[[float], None] | None = None
) -> tuple[pd.DataFrame, dict]:
    """Replay `requests` (sorted by arrival_s) against `base_url`; returns (records, report)."""
    import aiohttp

    if not requests:
        raise ValueError("client: no requests to replay")
    arrivals = np.array([float(r.arrival_s) for r in requests])
    if not np.all(np.isfinite(arrivals)) or np.any(np.diff(arrivals) < 0):
        raise ValueError("client: arrival_s must be finite and sorted")
    url = base_url.rstrip("/") + cfg.path
    protocol.raise_open_file_limit()
    rows = [_Row() for _ in requests]
    n = len(requests)
    finished = 0
    report_every = max(1, n // 100)
    timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s)
    wall0 = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout, read_bufsize=protocol.MAX_LINE_BYTES
    ) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time() - float(arrivals[0]) / cfg.time_scale  # the first request goes out now
        tasks = []
        tasks_index: dict[asyncio.Task, int] = {}

        live = LiveWindow(n, getattr(progress, "log", None))

        def _done(task: asyncio.Task) -> None:
            nonlocal finished
            finished += 1
            if progress is not None and (finished % report_every == 0 or finished == n):
                progress(finished / n)
            live.add(rows[tasks_index[task]], loop.time())

        for req, row in zip(requests, rows):
            delay = t0 + float(req.arrival_s) / cfg.time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_one(session, url, req, cfg, t0, row))
            tasks_index[task] = len(tasks)
            task.add_done_callback(_done)
            tasks.append(task)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for row, res in zip(rows, results):  # a bug in _one must still leave a failed row, not a crash
        if isinstance(res, BaseException):
            row.failed, row.error_kind, row.error = True, "client_error", f"{type(res).__name__}: {res}"
    records = records_frame(requests, rows)
    return records, replay_report(requests, rows, wall0, cfg.time_scale)


def replay_report(requests: Sequence[Any], rows: Sequence[_Row], wall0: float, time_scale: float) -> dict:
    """The replay's report: counts and examples of failures by kind, send lag, wall time (both the
    open-loop replay and the authors' clients, client_loop.py, give it)."""
    errors: dict[str, int] = {}
    examples: list[str] = []
    for req, row in zip(requests, rows):
        if row.failed:
            errors[row.error_kind or "unknown"] = errors.get(row.error_kind or "unknown", 0) + 1
            if len(examples) < 10:
                examples.append(f"request {req.id}: {row.error_kind}: {row.error}")
    lags = np.array([r.lag_s for r in rows])
    return {
        "num_requests": len(requests),
        "num_failed": int(sum(r.failed for r in rows)),
        "failures": errors,
        "failure_examples": examples,
        "send_lag_s": {"mean": float(lags.mean()), "p99": float(np.percentile(lags, 99)), "max": float(lags.max())},
        "wall_s": time.perf_counter() - wall0,
        "time_scale": time_scale,
    }


def records_frame(requests: Sequence[Any], rows: Sequence[_Row]) -> pd.DataFrame:
    """One row per request in workload order, RECORD_COLUMNS, the simulator's dtypes."""
    nan = math.nan
    arrival = np.array([row.arrival_s for row in rows], dtype=np.float64)
    first = np.array([nan if row.failed else row.first_token_s for row in rows], dtype=np.float64)
    finish = np.array([nan if row.failed else row.finish_s for row in rows], dtype=np.float64)
    queue_wait = np.array([nan if row.failed else row.queue_wait_s for row in rows], dtype=np.float64)
    df = pd.DataFrame(
        {
            "id": np.array([r.id for r in requests], dtype=np.int64),
            "worker": np.array([row.worker for row in rows], dtype=np.int64),
            "arrival_s": arrival,
            "first_token_s": first,
            "finish_s": finish,
            "queue_wait_s": queue_wait,
            "prefill_s": first - arrival - queue_wait,  # NaN where the queue wait is unknown
            "decode_s": finish - first,
            "prompt_tokens": np.array([row.prompt_tokens for row in rows], dtype=np.int64),
            "cached_tokens": np.array([0 if row.failed else row.cached_tokens for row in rows], dtype=np.int64),
            "output_tokens": np.array([0 if row.failed else row.output_tokens for row in rows], dtype=np.int64),
            "group": np.array([r.group_id for r in requests], dtype=np.int64),
            "failed": np.array([row.failed for row in rows], dtype=bool),
        }
    )
    df = df[list(RECORD_COLUMNS)]
    df.attrs["output_ids"] = [row.output_ids or [] for row in rows]  # not a record column: the observed trace's
    return df


def run_replay(
    requests: Sequence[Any], base_url: str, cfg: ClientConfig, progress: Callable[[float], None] | None = None
) -> tuple[pd.DataFrame, dict]:
    """Synchronous wrapper of `replay` (its own event loop)."""
    return asyncio.run(replay(requests, base_url, cfg, progress))


__all__ = ["ClientConfig", "replay", "run_replay", "records_frame"]
