"""Router service: an async HTTP proxy in front of N SGLang workers, routing with repro's own routers.

    python -m repro.backends.sglang.router_service --config router.json --host 127.0.0.1 --port 30000

Clients POST SGLang's `/generate` (streaming or not, `input_ids` or `text`; see
repro.backends.sglang.protocol) to the service; it asks the configured router — the very
`repro.routing` class the simulator uses (LBGR, cache-aware, random, ...; built with
`repro.backends.assembly.build_router`, as in the simulator) — for a worker, forwards the body unchanged,
streams the reply back event by event, and tells the router about the completion.

What the router sees (`LiveWorkerView`, the repro.routing.base.WorkerView contract), filled from
the service's own bookkeeping:
- in_flight: requests forwarded to the worker and not finished; waiting: those without their
  first token yet; running: those with it (first token = end of prefill, as in the simulator).
- waiting_prefill_tokens: sum over waiting requests of (prompt - tracked hit at dispatch).
- active_kv_tokens: prompt + tokens generated so far, over running requests.
- kv_capacity_tokens: the worker's `max_total_num_tokens` from `/server_info` (the real pool
  size) when it reports one, else the configured capacity.
- peek_prefix / kv_used_tokens: from a router-side approximate tracker per worker (a
  repro.kvcache RadixCache of the worker's capacity and eviction policy, updated like LBGR's
  approximate tracker: the prompt on dispatch, prompt + generated tokens on completion; it does
  not see the worker's locks). `view_tracker: false` drops it (peek_prefix -> 0). So routers that
  read `peek_prefix` (Dynamo, llm-d) get an approximate view here, an exact one in the simulator.
- With `load_poll_interval_s > 0`, waiting / running / kv_used_tokens come from the worker's own
  `/v1/loads` instead (the latest poll; stale by up to that interval).
- now_s given to the router = wall seconds since the service started x time_scale (emulated
  seconds when the workers are emulated, real seconds otherwise).

Completion callback: `on_request_complete(request, worker, latency_s, ttft_s, cached_tokens,
now_s)` with latency and TTFT measured from the moment the service received the request, in
now_s units, cached_tokens = the worker's `meta_info.cached_tokens`, and `request` carrying the
generated token ids the worker returned. It is called only when the request finished on the
worker the router chose. A request that was retried on another worker, or that failed, gives no
latency (the router never learns one that its choice did not produce) but
`on_request_abandoned(request, worker, now_s)` instead, so that the router releases what it
holds for it (cache-aware's in-flight count, LBGR's in-flight prompt); otherwise one failure
would skew that worker's load or cache estimate for the rest of the run. Failing workers are
kept away by the health state below, not by leaked router state.

Faults:
- Retry: a connection error, an HTTP 5xx or a dropped connection BEFORE the first byte of the
  reply was sent on to the client moves the request to another worker: the healthy worker with
  the fewest in-flight requests that has not been tried (ties: lowest id), at most `max_retries`
  times. A worker the router picks that is marked unhealthy is replaced the same way.
- After the first byte, a failure ends the stream with an SGLang-style error event
  (`data: {"error": ...}` then `data: [DONE]`); a malformed worker response does the same
  (HTTP 502 when not streaming). A 4xx from the worker is passed through (bad request: no retry).
- Per-request deadline `request_timeout_s` (wall seconds, from receipt): 504, or an error event.
- Health: every `health_check_interval_s` (default 1 s) GET /health on every worker, each given
  `health_check_timeout_s` (default 2 s; SGLang's /health is answered by its HTTP process without
  a generation, so an alive worker, however busy, answers in milliseconds); `health_failure_threshold`
  (2) consecutive failures mark it unhealthy, one success healthy again; a refused connection during
  a request marks it unhealthy at once. With zero healthy workers requests get 503 at once.
- Stall exclusion (stall.py, `stall_exclude`, default on): a worker whose in-flight requests made
  no progress (no reply byte) for longer than its limit, max(`stall_exclude_floor_s` 2 s,
  `stall_exclude_factor` 4 x (its longest silence in the last ~60 s + the waiting prefill at its
  fastest seen prefill rate)), while another healthy worker progresses, gets no new requests: the
  router's pick is replaced as for a worker marked down (/stats `stall.diverted`). It is not marked
  down, its in-flight requests go on, and its next byte brings it back. A frozen worker is excluded
  ~2 s after it froze instead of getting new requests until it is marked down (~5.4 s). Not
  diverting on a "suspect" health check: tried, single 2 s /health misses of alive emulated workers
  on the loaded 2-core machine overrode the router's choices often enough to move the fig2 GSP
  cell's live hit rate from 0.66 to 0.72; stall exclusion needs a silence several times the
  worker's own longest one, and excluded no worker in the live fig2 cells measured
  (docs/ARCHITECTURE.md, "Live router under faults").
- Marked unhealthy (e.g. a frozen worker: SIGSTOP, a hung GPU) = its requests stop waiting for it
  at once: those without a first byte go to another worker (as a retry), its open streams end with
  an error event. So a frozen worker costs its requests the detection time (about interval +
  threshold x (interval + timeout), ~6 s with the defaults), never `request_timeout_s`.
- Stall limit `stall_timeout_s` (default 60 s): an open stream whose worker then sends nothing for
  that long is ended with an error event (and counts as one failed health check). The wait for the
  FIRST event has no such limit: a queued request or a 126k-token prefill may take minutes on a busy
  worker and is healthy. Between two events of a healthy SGLang server there is one scheduler step:
  a decode step (~20-50 ms for 8B on an L40) or a chunked-prefill step (a few seconds at most), so
  60 s never ends a healthy stream, whether the answer has 4 tokens or 128, and ends a silent one
  in a minute instead of the ten of the request deadline.
- Bad input, answered before any work: a body over `max_body_bytes` (default 4 MiB; a 128k-token
  prompt as ids plus its text is ~1.6 MB) -> 413 without reading it; a Content-Type other than
  application/json (or none) -> 400; not JSON, nested too deeply or holding a lone surrogate
  (`"\\ud800"`) -> 400; fields outside protocol.FORWARDED_KEYS / SAMPLING_KEYS -> 400 naming them
  (SGLang would ignore them silently; only known fields are forwarded); ids that are not integers
  in 0..2^31-1 -> 400; `text` that encodes to zero tokens -> 400 (protocol.PromptIds, shared with
  the emulated worker); a prompt longer than every worker's KV cache -> 400, before forwarding. Bodies over 64 KiB are parsed and tokenized in a parser process (one,
  spawned on the first such body), not on the event loop: JSON decoding and the tokenizer's regex
  hold the GIL, so a thread would still stall small requests (~0.1 s for a 4 MB text prompt).
- Start-up: the service refuses to start (NoHealthyWorkersError, exit code 2 from the CLI) when
  none of the workers answers /health within `startup_health_timeout_s`.

Modules: ledger.py (per-worker bookkeeping, LiveWorkerView), health.py (health and capacity
discovery), stall.py (stall exclusion), parsing.py (bodies, parser process), relay.py (one attempt on one worker),
service.py (RouterService: handlers, retries, router callbacks), cli.py (the process).
"""

from repro.backends.sglang.config import RouterServiceConfig
from repro.backends.sglang.router_service.cli import build_router, main, service_from_file
from repro.backends.sglang.router_service.health import NoHealthyWorkersError
from repro.backends.sglang.router_service.ledger import LiveWorkerView, WorkerState
from repro.backends.sglang.router_service.parsing import INLINE_PARSE_BYTES
from repro.backends.sglang.router_service.service import RouterService

__all__ = [
    "INLINE_PARSE_BYTES",
    "LiveWorkerView",
    "NoHealthyWorkersError",
    "RouterService",
    "RouterServiceConfig",
    "WorkerState",
    "build_router",
    "service_from_file",
    "main",
]
