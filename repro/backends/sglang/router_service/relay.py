"""One attempt of a request on one worker: open it, then relay the reply to the client.

`open_attempt` sends the body and waits for the worker's first byte; anything that goes wrong
until then is an `AttemptFailed` (the service may retry elsewhere). `relay_json` / `relay_stream`
pass the reply on and tell the service how it ended: success, or an error the client sees (HTTP
502 / an SGLang-style error event; a stream silent for stall_timeout_s ends with a 504 event).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from repro.backends.sglang import protocol
from repro.backends.sglang.router_service.ledger import Flight, WorkerState


class ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class AttemptFailed(Exception):
    """A worker failed before the first byte reached the client: the request may be retried."""

    def __init__(self, message: str, hard: bool = False, retry: bool = True):
        super().__init__(message)
        self.hard = hard  # the worker is unreachable: mark it unhealthy at once
        self.retry = retry


async def open_attempt(session: Any, connect_timeout_s: float, f: Flight, w: WorkerState):
    """Send the request to w and wait for its first byte: ("stream", resp, lines, first line),
    ("json", whole body) or ("reply", status, text) for a 4xx; AttemptFailed otherwise."""
    import aiohttp

    url = f"{w.url}/generate"
    try:
        resp = await session.post(
            url,
            data=f.body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),
        )
    except (aiohttp.ClientConnectionError, OSError) as exc:
        raise AttemptFailed(f"cannot reach {url}: {type(exc).__name__}: {exc}", hard=True) from None
    except aiohttp.ClientError as exc:
        raise AttemptFailed(f"{url}: {type(exc).__name__}: {exc}") from None
    keep = False  # True: the caller owns resp (an open stream)
    try:
        if resp.status >= 500:
            text = await safe_text(resp)
            raise AttemptFailed(f"HTTP {resp.status} from {url}: {text}")
        if resp.status != 200:
            return "reply", resp.status, await safe_text(resp)
        if not f.stream:
            try:
                return "json", await resp.read()
            except (aiohttp.ClientError, OSError) as exc:
                raise AttemptFailed(
                    f"connection lost reading the reply: {type(exc).__name__}: {exc}", hard=True
                ) from None
        lines = protocol.iter_sse_lines(resp.content)
        try:
            first = await lines.__anext__()
        except StopAsyncIteration:
            raise AttemptFailed("stream closed before the first event") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise AttemptFailed(
                f"connection lost before the first event: {type(exc).__name__}: {exc}", hard=True
            ) from None
        except protocol.ProtocolError as exc:
            raise AttemptFailed(str(exc), retry=False) from None
        keep = True
        return "stream", resp, lines, first
    except BaseException:  # an error, or cancelled by abort() or the deadline: drop the connection
        resp.close()
        raise
    finally:
        if not keep:
            resp.release()  # no-op after close(); else the read body's connection is reused


def relay_json(svc: Any, f: Flight, w: WorkerState, raw: bytes):
    """A whole (non-streamed) reply: checked, accounted, passed on."""
    from aiohttp import web

    try:
        obj = json.loads(raw)
        new = f.tracker.add(obj)
        if not f.tracker.finished:
            raise protocol.ProtocolError("reply has no finish_reason")
    except (
        json.JSONDecodeError,
        UnicodeDecodeError,
        RecursionError,
        protocol.ProtocolError,
        protocol.WorkerReportedError,
    ) as exc:
        w.release(f)
        return svc._fail(f, 502, f"malformed reply from worker {w.worker_id}: {exc}", "malformed")
    f.first_token_wall = asyncio.get_running_loop().time()
    w.add_tokens(f, new)
    svc._finish_success(f, w)
    return web.Response(body=raw, content_type="application/json", headers={protocol.WORKER_HEADER: str(w.worker_id)})


async def relay_stream(svc: Any, f: Flight, w: WorkerState, lines, first: bytes, request):
    """The worker's event stream, event by event, to the client (whose response it prepares)."""
    import aiohttp
    from aiohttp import web

    cfg = svc.config
    loop = asyncio.get_running_loop()
    where = f"worker {w.worker_id}"
    out = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", protocol.WORKER_HEADER: str(w.worker_id)}
    )
    await out.prepare(request)
    f.response = out
    # Stall watchdog: one timer per stream, re-armed lazily (a read only stamps f.last_event).
    stall = cfg.stall_timeout_s
    f.last_event = loop.time()
    timer = None

    def _watch() -> None:
        nonlocal timer
        if loop.time() - f.last_event >= stall:
            f.abort(
                "stalled",
                f"worker {w.worker_id} sent nothing for {stall:g}s in the middle of the "
                f"stream (router_service.stall_timeout_s)",
            )
        else:
            timer = loop.call_at(f.last_event + stall, _watch)

    timer = loop.call_at(f.last_event + stall, _watch)
    done = False
    error: tuple[str, str] | None = None  # (kind, message) sent to the client as an error event
    line: bytes | None = first
    try:
        while line is not None:
            ev = protocol.parse_sse_line(line, where)
            if ev is protocol.DONE:
                done = True
                break
            if ev is not None:
                try:
                    new = f.tracker.add(ev)
                except protocol.WorkerReportedError as exc:
                    error = ("worker_error", str(exc))
                    break
                if new > 0 and math.isnan(f.first_token_wall):
                    f.first_token_wall = loop.time()
                w.add_tokens(f, new)
                await write_or_gone(out, line.rstrip(b"\r\n") + b"\n\n")
            try:
                line = await lines.__anext__()
                f.last_event = loop.time()
                w.progress()
            except StopAsyncIteration:
                line = None
    except ClientGone:
        error = ("client_gone", "client disconnected")
    except protocol.ProtocolError as exc:
        error = ("malformed", f"malformed response from worker {w.worker_id}: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        error = ("worker_failed", f"connection to worker {w.worker_id} lost mid-stream: {type(exc).__name__}: {exc}")
        if f.abort_reason is None:  # not our own close of the connection (abort)
            w.mark_failure(error[1], cfg.health_failure_threshold, hard=True)
    finally:
        timer.cancel()
    finished = error is None and done and f.tracker.finished
    if not finished and f.abort_reason is not None and (error is None or error[0] != "client_gone"):
        error = f.abort_reason
        if error[0] == "stalled":  # counts against the worker like a failed health check
            w.mark_failure(error[1], cfg.health_failure_threshold)
    if error is None and not finished:
        error = ("incomplete", f"stream from worker {w.worker_id} ended before the request finished")
    if error is None:
        svc._finish_success(f, w)
        await write_quietly(out, b"data: [DONE]\n\n", eof=True)
        try:  # read the worker's body to its end so that its connection is reused
            async for _ in lines:
                pass
        except Exception:
            pass
        return out
    w.release(f)
    svc._count_failure(f, error[0])
    if error[0] != "client_gone":
        code = 504 if error[0] == "stalled" else 502
        await write_quietly(out, protocol.finish_event_error(f"router: {error[1]}", code, error[0]), eof=True)
    return out


async def write_or_gone(out, data: bytes) -> None:
    try:
        await out.write(data)
    except (ConnectionError, OSError, RuntimeError) as exc:  # aiohttp: "Cannot write to closing transport"
        raise ClientGone(str(exc)) from None


async def write_quietly(out, data: bytes, eof: bool = False) -> None:
    try:
        await out.write(data)
        if eof:
            await out.write_eof()
    except (ConnectionError, OSError, RuntimeError):
        pass


async def safe_text(resp, limit: int = 500) -> str:
    try:
        text = await resp.text()
    except Exception as exc:  # the body itself may be broken
        return f"<unreadable body: {exc}>"
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["AttemptFailed", "ClientGone", "open_attempt", "relay_json", "relay_stream", "write_quietly"]
