"""SGLang's native `/generate` wire format (sglang 0.5.23), as the router, client and emulator speak it.

Facts taken from sglang 0.5.23 (`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`,
`srt/managers/tokenizer_manager.py`, `api/v1/api_types.py`):

- Request: a JSON object; `text` (str) and/or `input_ids` (list of int) — at least one; when both
  are sent SGLang runs `input_ids` and keeps `text` as the input text (the sglang-router routes on
  `text` when present, else on the ids written as decimal strings); `sampling_params`
  with `max_new_tokens` (SGLang's default 128), `ignore_eos`, `temperature`; `stream` (bool);
  `rid` (str). Unknown keys are ignored by SGLang without a word (its request type drops them);
  our router service refuses them with a 400 naming them (FORWARDED_KEYS below), so that a
  typo'd option never changes nothing silently. Hence our extension below rides in a known field.
- Non-streaming reply: one JSON object `{"text", "output_ids", "meta_info"}`.
- Streaming reply (`text/event-stream`): events `data: <json>\\n\\n`, each shaped like the
  non-streaming reply, then `data: [DONE]\\n\\n`. By default (no `--incremental-streaming-output`)
  `output_ids` and `meta_info.completion_tokens` are cumulative; with it, `output_ids` is the
  delta — `OutputTracker` handles both.
- `meta_info`: `id`, `finish_reason` (null until the last event, then e.g.
  `{"type": "length", "length": N}`), `prompt_tokens`, `completion_tokens`, `cached_tokens`
  (prefix tokens served from the radix cache), `queue_time` (only with the server's
  `--enable-metrics`: seconds from its scheduler's wait queue to its first forward), plus fields
  we do not read (with `--enable-metrics` also forward_entry_time, prefill_finished_time, ...).
- Errors: HTTP 4xx/5xx with `{"error": {"message": ...}}`, or, inside a stream, an event
  `data: {"error": {"message", "type", "code", ...}}` followed by `[DONE]`.

Our one extension: the token ids the workload recorded as the reply, as decimal ids joined by
commas under `custom_labels["repro_output_ids"]`. Only the emulated worker reads it (so it
produces exactly the tokens the simulator assumes). It rides in `custom_labels` (a map of
strings) because that is a field sglang-router 0.3.2 keeps when it re-serializes the request
body into its typed `GenerateRequest`: unknown top-level keys are dropped there. The emulated
worker, and our router service, add the header `X-Repro-Worker` (index of the worker that
served the request) to their replies; the real router passes a worker's headers through.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import numpy as np

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default
OUTPUT_IDS_KEY = "repro_output_ids"  # our extension, a key of custom_labels (emulated worker only)
WORKER_HEADER = "X-Repro-Worker"
DONE = "[DONE]"
# Largest SSE line the readers accept (bytes): a cumulative output_ids list of ~100k tokens.
MAX_LINE_BYTES = 1 << 21


class ProtocolError(ValueError):
    """A message that does not follow the /generate protocol (malformed request or response)."""


class WorkerReportedError(RuntimeError):
    """The server answered with an error object (HTTP error body or an error event in a stream)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class GenerateInput:
    """One parsed /generate request (single prompt; batches are refused)."""

    input_ids: np.ndarray | None  # int32, or None when only text was sent (input_ids win when both are)
    text: str | None  # prompt text when sent (routers that match on text use it)
    max_new_tokens: int
    stream: bool
    rid: str | None
    reference_output_ids: np.ndarray | None  # our extension, or None
    body: dict = field(repr=False, default_factory=dict)


def _int_list(value: Any, what: str) -> np.ndarray:
    """A JSON list of token ids -> int32 array (vectorised: prompts hold thousands of ids)."""
    if not isinstance(value, list):
        raise ProtocolError(f"{what} must be a list of token ids, got {type(value).__name__}")
    if not value:
        return np.zeros(0, dtype=np.int32)
    if isinstance(value[0], list):
        raise ProtocolError(f"{what}: batched requests (a list of lists) are not supported; send one prompt")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iu":
        bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, int)), None)
        if bad is None:  # all integers, one too big for int64 (numpy made an object array)
            big = next(v for v in value if not -(2**63) <= v < 2**64)
            shown = str(big) if len(str(big)) <= 24 else f"{str(big)[:20]}... ({len(str(big))} digits)"
            raise ProtocolError(f"{what} holds ids outside 0..2^31-1 (found {shown})")
        raise ProtocolError(f"{what} must hold integers, found {repr(bad)[:60]}")
    if arr.min() < 0 or arr.max() > 2**31 - 1:
        raise ProtocolError(f"{what} holds ids outside 0..2^31-1 (min {arr.min()}, max {arr.max()})")
    return arr.astype(np.int32)


def parse_generate_request(body: Any) -> GenerateInput:
    """Validate a /generate JSON body; ProtocolError (-> HTTP 400) names the first problem."""
    if not isinstance(body, dict):
        raise ProtocolError(f"/generate body must be a JSON object, got {type(body).__name__}")
    text = body.get("text")
    ids = body.get("input_ids")
    if text is None and ids is None:
        raise ProtocolError("/generate needs 'text' or 'input_ids'")
    input_ids = None
    if ids is not None:
        input_ids = _int_list(ids, "input_ids")
        if len(input_ids) == 0:
            raise ProtocolError("input_ids is empty")
    if text is not None:
        if isinstance(text, list):
            raise ProtocolError("text: batched requests (a list of prompts) are not supported; send one prompt")
        if not isinstance(text, str) or not text:
            raise ProtocolError("text must be a non-empty string")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ProtocolError("sampling_params must be a JSON object")
    max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ProtocolError(f"sampling_params.max_new_tokens must be an integer >= 1, got {max_new!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ProtocolError(f"stream must be true or false, got {stream!r}")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"rid must be a string, got {rid!r}")
    reference = _reference_output_ids(body.get("custom_labels"))
    return GenerateInput(input_ids, text, int(max_new), stream, rid, reference, body)


class PromptIds:
    """Prompt token ids of a parsed request: its `input_ids`, else its `text` through the cell's
    tokenizer (workload.tokenizer; None = the default), made on first use. The router service
    (routing-only ids) and the emulated worker (what it runs) both tokenize with this, so a text
    request gets the same ids in both; text that encodes to no token is a ProtocolError (-> 400)."""

    def __init__(self, tokenizer: dict | None = None):
        self.tokenizer_cfg = tokenizer
        self._tokenizer = None

    def __call__(self, inp: GenerateInput) -> np.ndarray:
        if inp.input_ids is not None:
            return inp.input_ids
        if self._tokenizer is None:
            from repro.workloads.tokenizer import make_tokenizer

            self._tokenizer = make_tokenizer(self.tokenizer_cfg)
        ids = np.asarray(self._tokenizer.encode(inp.text), dtype=np.int32)
        if len(ids) == 0:
            raise ProtocolError(f"text {_short(inp.text, 60)!r} encodes to zero tokens: nothing to prefill")
        return ids


def _reference_output_ids(labels: Any) -> np.ndarray | None:
    if labels is None:
        return None
    if not isinstance(labels, dict):
        raise ProtocolError(f"custom_labels must be a JSON object, got {type(labels).__name__}")
    ref = labels.get(OUTPUT_IDS_KEY)
    if ref is None:
        return None
    where = f"custom_labels.{OUTPUT_IDS_KEY}"
    if not isinstance(ref, str) or not re.fullmatch(r"\d+(,\d+)*", ref):
        raise ProtocolError(f"{where} must be token ids joined by commas, got {str(ref)[:60]!r}")
    return _int_list([int(t) for t in ref.split(",")], where)


# What the router service forwards (sglang 0.5.23 `GenerateReqInput` / `SamplingParams` fields a
# text-only LLM request uses). Anything else is refused with a 400 naming it: a typo'd option would
# otherwise be ignored by SGLang without a word, and a junk field would ride along to every worker.
FORWARDED_KEYS = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "stream",
        "rid",
        "custom_labels",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "token_ids_logprob",
        "return_text_in_logprobs",
    }
)
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
        "custom_params",
    }
)


def check_known_keys(body: Any) -> None:
    """ProtocolError naming the keys of a /generate body outside FORWARDED_KEYS / SAMPLING_KEYS."""
    if not isinstance(body, dict):
        return  # parse_generate_request names that
    unknown = sorted(set(body) - FORWARDED_KEYS)
    if unknown:
        raise ProtocolError(f"unknown request fields {_names(unknown)} (accepted: {sorted(FORWARDED_KEYS)})")
    sp = body.get("sampling_params")
    if isinstance(sp, dict):
        unknown = sorted(set(sp) - SAMPLING_KEYS)
        if unknown:
            raise ProtocolError(f"unknown sampling_params {_names(unknown)} (accepted: {sorted(SAMPLING_KEYS)})")


def _names(keys: list[str], n: int = 5) -> str:
    shown = [k if len(k) <= 40 else k[:40] + "..." for k in keys[:n]]
    return str(shown) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def generate_body(
    input_ids: Sequence[int] | np.ndarray,
    max_new_tokens: int,
    *,
    stream: bool = True,
    rid: str | None = None,
    reference_output_ids: Sequence[int] | np.ndarray | None = None,
    text: str | None = None,
) -> dict:
    """The request the benchmark client sends: exact token ids, a fixed output length.

    `ignore_eos: true` makes SGLang generate exactly max_new_tokens (what sglang.bench_serving
    does for fixed output lengths); temperature 0 keeps real runs repeatable. `text`, when given,
    rides along for text-matching routers; the server still runs the exact `input_ids`.
    """
    body: dict[str, Any] = {
        "input_ids": [int(t) for t in np.asarray(input_ids).tolist()],
        "sampling_params": {"max_new_tokens": int(max_new_tokens), "ignore_eos": True, "temperature": 0.0},
        "stream": bool(stream),
    }
    if text is not None:
        body["text"] = text
    if rid is not None:
        body["rid"] = rid
    if reference_output_ids is not None:
        ids = np.asarray(reference_output_ids).tolist()
        body["custom_labels"] = {OUTPUT_IDS_KEY: ",".join(map(str, ids))}
    return body


# --------------------------------------------------------------------------- responses
def _nonneg_int(meta: dict, key: str, where: str) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ProtocolError(f"{where}: meta_info.{key} must be an integer >= 0, got {v!r}")
    return v


@dataclass
class OutputTracker:
    """Folds the events of one response into its totals; raises ProtocolError on malformed ones."""

    where: str = "response"
    output_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    finish_reason: Any = None
    finished: bool = False
    events: int = 0
    # SGLang's scheduler queue time (meta_info.queue_time, seconds in its wait queue until its first
    # forward): sent only by servers started with --enable-metrics, else NaN
    queue_time_s: float = math.nan

    def add(self, obj: Any) -> int:
        """Fold one event (a parsed JSON value); returns the number of new output tokens."""
        self.events += 1
        if not isinstance(obj, dict):
            raise ProtocolError(f"{self.where}: expected a JSON object, got {type(obj).__name__}")
        err = obj.get("error")
        if err is not None:
            msg = err.get("message") if isinstance(err, dict) else err
            code = err.get("code") if isinstance(err, dict) else None
            raise WorkerReportedError(f"{self.where}: server error: {msg}", code if isinstance(code, int) else None)
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            raise ProtocolError(f"{self.where}: event without a meta_info object: {_short(obj)}")
        completion = _nonneg_int(meta, "completion_tokens", self.where)
        prompt = _nonneg_int(meta, "prompt_tokens", self.where)
        cached = _nonneg_int(meta, "cached_tokens", self.where)
        if completion < self.completion_tokens:
            raise ProtocolError(
                f"{self.where}: completion_tokens went backwards ({self.completion_tokens} -> {completion})"
            )
        ids = obj.get("output_ids")
        if ids is not None:
            if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
                raise ProtocolError(f"{self.where}: output_ids must be a list of integers")
            if len(ids) == completion:  # cumulative (SGLang's default)
                self.output_ids = list(ids)
            else:  # incremental streaming: a delta
                self.output_ids.extend(ids)
        new = completion - self.completion_tokens
        self.completion_tokens = completion
        self.prompt_tokens = prompt
        self.cached_tokens = cached
        q = meta.get("queue_time")
        if isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q) and q >= 0:
            self.queue_time_s = float(q)
        fr = meta.get("finish_reason")
        if fr is not None:
            self.finish_reason = fr
            self.finished = True
        return new


def _short(obj: Any, n: int = 200) -> str:
    s = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    return s if len(s) <= n else s[:n] + "..."


def parse_sse_line(line: bytes, where: str = "stream") -> Any:
    """One line of an event stream: returns the parsed JSON, DONE, or None (blank / comment).

    ProtocolError for anything that is not `data: <json>` / `data: [DONE]`.
    """
    s = line.strip()
    if not s or s.startswith(b":"):
        return None
    if not s.startswith(b"data:"):
        raise ProtocolError(f"{where}: malformed event line {_short(s.decode('utf-8', 'replace'))!r}")
    payload = s[5:].strip()
    if payload == b"[DONE]":
        return DONE
    try:
        return json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(
            f"{where}: event is not JSON ({exc}): {_short(payload.decode('utf-8', 'replace'))!r}"
        ) from None


async def iter_sse_lines(content: Any) -> AsyncIterator[bytes]:
    """Raw non-empty lines of an aiohttp StreamReader (each a whole `data: ...` line).

    Callers read on after `[DONE]` until this ends: a body read to its end lets aiohttp reuse
    the keep-alive connection (one left half-read is closed).
    """
    while True:
        line = await content.readline()
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            raise ProtocolError(f"event line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
        if line.strip():
            yield line


def finish_event_error(message: str, code: int = 502, kind: str = "bad_gateway") -> bytes:
    """An SSE error event + [DONE], as SGLang ends a failed stream."""
    obj = {"error": {"message": message, "type": kind, "code": code, "retryable": False}}
    return b"data: " + json.dumps(obj).encode() + b"\n\ndata: [DONE]\n\n"


def error_body(message: str, kind: str = "invalid_request_error", code: int = 400) -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


def scaled(wall_s: float, time_scale: float) -> float:
    """Wall seconds -> emulated seconds (x time_scale); NaN stays NaN."""
    return wall_s * time_scale if not math.isnan(wall_s) else math.nan


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (each in-flight request
    holds a socket per hop; Slurm nodes often default to 1024). Returns the new soft limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return int(target)
        return int(soft)
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: keep the limit
        return -1


async def serve_app(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_timeout: float = 1.0,
    keepalive_timeout: float | None = None,
):
    """Serve an aiohttp `app` on host:port (0 = a free port); returns (runner, bound port).
    keepalive_timeout: a connection that holds no complete request this long (idle, or its
    headers half-sent) is closed (None: aiohttp's default, about an hour).

    Stop it with `await runner.cleanup()`."""
    from aiohttp import web

    extra = {} if keepalive_timeout is None else {"keepalive_timeout": keepalive_timeout}
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout, **extra)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]
