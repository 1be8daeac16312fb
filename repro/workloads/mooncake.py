"""Mooncake-format traces (FAST'25 conversation trace by default): timing, lengths, prefix-block hashes.

Format (one JSON object per line, optionally gzipped; Mooncake's `FAST25-release/traces/` and the
Dynamo KV-router benchmarks use it): `timestamp` (ms from the trace start), `input_length`,
`output_length` and `hash_ids`, the prefix-block hashes of `block_size` tokens (512 in these
traces). Equal leading hash ids = a shared KV prefix. Other keys are ignored. Every row is checked
before anything is built: a file that does not follow the format fails with the offending line
numbers (at most 10 listed), never a partial workload.

The default file ships in the package (`repro/workloads/data/mooncake/`, Apache-2.0, provenance in
its README); `path:` takes any file of this format (other Mooncake traces, Dynamo-style ones).

Token ids (the trace has no text, so no tokenizer runs; `tokenizer` is ignored): hash id h becomes
one deterministic run of `block_size` ids, the same everywhere h appears: with
p = (A * h + C) mod V^2 (a bijection of [0, V^2), V = 128000 ids below Llama-3's specials), the
block's first two ids are divmod(p, V), so distinct hash ids at the same position differ by the
second token at the latest (the first differs with probability 1 - 1/V), and the rest are
splitmix64(p * block_size + j) mod V. The last block is cut to `input_length`. Generated tokens
are splitmix64 ids of (row, j): they never continue a later prompt (the trace's next turns come
with their own hash ids). Ids are computed per request, never stored per block.

Keys beyond the common ones: `block_size`, `arrivals: trace` (timestamps / `speedup`, first kept
request at 0) or `poisson` (the paper's model, rate `request_rate`, null = the kept prefix's mean
rate x speedup), `speedup` (2 = replay twice as fast). Common keys: `num_queries` (null = the whole
trace) keeps the first requests in timestamp order; `output_len` null = the trace's output lengths,
an integer = that length for every request; `max_context_len` drops requests whose input + output
exceed it (counted); `order`: trace (default), random (a shuffle, with poisson arrivals only) or
round_robin over groups (group = the first hash id after the prefix all requests share; poisson only). Each request is its own
conversation (the trace has no session ids).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from repro.confutil import is_int
from repro.workloads import cache as _cache
from repro.workloads.arrivals import component_rng, order_random, order_round_robin, poisson_arrivals
from repro.workloads.base import DataSource, Workload, WorkloadError, WorkloadSpec, _Problems
from repro.workloads.request import Request

DATASET_ID = "kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl"
PACKAGED_FILE = Path(__file__).resolve().parent / "data" / "mooncake" / "conversation_trace.jsonl.gz"
PACKAGED_LABEL = "repro/workloads/data/mooncake/conversation_trace.jsonl.gz"
TOKEN_SCHEME = "mooncake-hash-blocks-v1"
ID_RANGE = 128_000  # token ids in [0, ID_RANGE): Llama-3's regular vocabulary, no special tokens
MAX_HASH_ID = 2**32  # hash ids below this map injectively (A * h fits in uint64)
_MOD = ID_RANGE * ID_RANGE
_A, _C = 0x9E3779B1, 0x7F4A7C15  # odd, not a multiple of 5: invertible mod 2^k * 5^m
MAX_LISTED_ERRORS = 10


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def block_tokens(hash_ids, block_size: int) -> np.ndarray:
    """(len(hash_ids), block_size) int32 token ids of these blocks (module docstring)."""
    h = np.asarray(hash_ids, dtype=np.uint64)
    p = (h * np.uint64(_A) + np.uint64(_C)) % np.uint64(_MOD)
    out = np.empty((len(h), block_size), dtype=np.uint64)
    out[:, 0] = p // np.uint64(ID_RANGE)
    if block_size > 1:
        out[:, 1] = p % np.uint64(ID_RANGE)
    if block_size > 2:
        j = np.arange(2, block_size, dtype=np.uint64)
        out[:, 2:] = _splitmix64(p[:, None] * np.uint64(block_size) + j[None, :]) % np.uint64(ID_RANGE)
    return out.astype(np.int32)


def prompt_tokens(hash_ids, input_length: int, block_size: int) -> np.ndarray:
    return block_tokens(hash_ids, block_size).reshape(-1)[:input_length]


def output_tokens(row: int, n: int) -> np.ndarray:
    base = np.uint64(row) << np.uint64(24)
    x = _splitmix64(_splitmix64(base + np.arange(n, dtype=np.uint64)))
    return (x % np.uint64(ID_RANGE)).astype(np.int32)


def _open(path: Path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _row_problem(obj, block_size: int) -> str | None:
    if not isinstance(obj, dict):
        return "not a JSON object"
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        return f"missing key(s) {', '.join(missing)}"
    ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        return f"timestamp must be a number >= 0 (ms), got {ts!r}"
    if not is_int(n_in) or n_in < 1:
        return f"input_length must be an integer >= 1, got {n_in!r}"
    if not is_int(n_out) or n_out < 1:
        return f"output_length must be an integer >= 1, got {n_out!r}"
    if not isinstance(ids, list) or not all(is_int(h) and 0 <= h < MAX_HASH_ID for h in ids):
        return f"hash_ids must be a list of integers in [0, 2^32), got {str(ids)[:60]}"
    want = -(-n_in // block_size)
    if len(ids) != want:
        return (
            f"{len(ids)} hash_ids for input_length {n_in}: expected ceil({n_in} / block_size {block_size}) "
            f"= {want} (is workload.block_size right for this trace?)"
        )
    return None


def read_trace(path: Path, block_size: int) -> dict:
    """Validated columns of a trace file, in file order; WorkloadError listing bad lines."""
    ts, n_in, n_out, ids = [], [], [], []
    errors: list[str] = []
    n_bad = 0
    try:
        with _open(path) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    problem = f"not valid JSON ({exc.__class__.__name__})"
                else:
                    problem = _row_problem(obj, block_size)
                if problem is not None:
                    n_bad += 1
                    if len(errors) < MAX_LISTED_ERRORS:
                        errors.append(f"line {lineno}: {problem}")
                    continue
                ts.append(float(obj["timestamp"]))
                n_in.append(obj["input_length"])
                n_out.append(obj["output_length"])
                ids.append(obj["hash_ids"])
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise WorkloadError(f"workload 'mooncake': cannot read {path}: {exc}") from exc
    if n_bad:
        more = f" (and {n_bad - len(errors)} more)" if n_bad > len(errors) else ""
        raise WorkloadError(
            f"workload 'mooncake': {path} does not follow the Mooncake trace format "
            f"({{timestamp, input_length, output_length, hash_ids}} per line): {n_bad} bad line(s){more}:\n  - "
            + "\n  - ".join(errors)
        )
    if not ts:
        raise WorkloadError(f"workload 'mooncake': {path} holds no requests")
    return {
        "timestamp_ms": np.asarray(ts),
        "input_length": np.asarray(n_in, dtype=np.int64),
        "output_length": np.asarray(n_out, dtype=np.int64),
        "hash_ids": ids,
    }


def trace_stats(timestamp_ms: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, hash_ids: list) -> dict:
    """The trace-level numbers its README reports, over the kept requests."""
    blocks = sum(len(h) for h in hash_ids)
    distinct = len({x for h in hash_ids for x in h})
    span_s = float(timestamp_ms.max() - timestamp_ms.min()) / 1000.0 if len(timestamp_ms) else 0.0
    return {
        "requests": int(len(n_in)),
        "span_min": span_s / 60.0,
        "req_per_s": (len(n_in) / span_s) if span_s > 0 else float("inf"),
        "mean_input": float(n_in.mean()),
        "max_input": int(n_in.max()),
        "mean_output": float(n_out.mean()),
        "blocks": int(blocks),
        "distinct_blocks": int(distinct),
        "block_reuse": 1.0 - distinct / blocks if blocks else 0.0,
    }


def _groups(hash_ids: list) -> np.ndarray:
    """Group = the first hash id after the prefix every request shares (the FAST'25 trace: all
    start with block 0, a common system prompt), compact ids in order of first appearance."""
    common = min(len(h) for h in hash_ids)
    first = hash_ids[0]
    for h in hash_ids:
        k = 0
        while k < common and h[k] == first[k]:
            k += 1
        common = k
        if common == 0:
            break
    seen: dict = {}
    return np.array(
        [seen.setdefault(h[common] if len(h) > common else None, len(seen)) for h in hash_ids], dtype=np.int64
    )


class MooncakeWorkload(WorkloadSpec):
    name = "mooncake"
    SOURCES = ("auto", "real")
    ORDERS = ("trace", "random", "round_robin")
    RATE_OPTIONAL = True
    NUM_QUERIES_OPTIONAL = True
    OUTPUT_LEN_OPTIONAL = True
    DEFAULTS = {
        "num_queries": None,
        "request_rate": None,
        "order": "trace",
        "output_len": None,
        "block_size": 512,
        "arrivals": "trace",
        "speedup": 1.0,
    }

    def validate(self, p: _Problems) -> None:
        c = self.cfg
        p.int_(c, "block_size", 1)
        p.float_(c, "speedup", lo=0.0, lo_open=True)
        p.choice(c, "arrivals", ("trace", "poisson"))
        if c.get("arrivals") == "trace":
            if c.get("request_rate") is not None:
                p.add(
                    "request_rate applies to arrivals=poisson; with arrivals=trace the timestamps set the rate "
                    "(use speedup to replay faster or slower)"
                )
            if c.get("order") not in (None, "trace"):
                p.add(f"order={c.get('order')} needs arrivals=poisson (trace timestamps belong to the trace order)")

    def resolve_data(self) -> DataSource:
        if self.cfg["path"] is None:
            path, label = PACKAGED_FILE, PACKAGED_LABEL
        else:
            path, label = Path(self.cfg["path"]).expanduser(), str(self.cfg["path"])
        if not path.is_file():
            raise WorkloadError(f"workload 'mooncake': trace file not found: {path} (format: {DATASET_ID})")
        return DataSource(
            kind="real",
            path=path,
            label=label,
            sha256=_cache.file_sha256(path),
            size_bytes=path.stat().st_size,
            dataset_id=DATASET_ID if self.cfg["path"] is None else "Mooncake-format trace",
        )

    def build(self, seed: int, use_cache: bool = True) -> Workload:
        # No pool cache: ids come from hash ids arithmetically (faster than reading a cache file).
        c = self.cfg
        data = self.resolve_data()
        bs = c["block_size"]
        t = read_trace(data.path, bs)
        n_file = len(t["input_length"])
        rows = np.argsort(t["timestamp_ms"], kind="stable")  # replay in timestamp order
        out_len = t["output_length"] if c["output_len"] is None else np.full(n_file, c["output_len"], np.int64)
        over = 0
        if c["max_context_len"] is not None:
            fits = (t["input_length"] + out_len)[rows] <= c["max_context_len"]
            over = int((~fits).sum())
            rows = rows[fits]
        want = len(rows) if c["num_queries"] is None else c["num_queries"]
        if want > len(rows):
            raise WorkloadError(
                f"workload 'mooncake': num_queries={want} but the trace has {len(rows)} requests"
                + (f" ({over} over max_context_len)" if over else "")
            )
        rows = rows[:want]
        hash_ids = [t["hash_ids"][r] for r in rows.tolist()]
        group = _groups(hash_ids)
        if c["order"] == "random":
            order = order_random(np.arange(want), component_rng(seed, "order"))
        elif c["order"] == "round_robin":
            order = order_round_robin(group)
        else:
            order = np.arange(want)
        ts = t["timestamp_ms"][rows]
        if c["arrivals"] == "trace":
            arrivals = (ts - ts[0]) / 1000.0 / c["speedup"]
        else:
            rate = c["request_rate"]
            if rate is None:
                span = (ts[-1] - ts[0]) / 1000.0
                rate = (want - 1) / span * c["speedup"] if span > 0 else math.inf
            arrivals = poisson_arrivals(want, rate, component_rng(seed, "arrivals"))
        requests = []
        for rid, (k, at) in enumerate(zip(order.tolist(), arrivals.tolist())):
            r = int(rows[k])
            prompt = prompt_tokens(hash_ids[k], int(t["input_length"][r]), bs)
            prompt.flags.writeable = False
            gen = output_tokens(r, int(out_len[r]))
            gen.flags.writeable = False
            requests.append(
                Request(
                    id=rid,
                    arrival_s=float(at),
                    prompt_tokens=prompt,
                    output_len=len(gen),
                    generated_tokens=gen,
                    group_id=int(group[k]),
                    conversation_id=r,
                    turn=0,
                )
            )
        prov = data.provenance()
        prov.update(
            {
                "workload": self.name,
                "rows_read": n_file,
                "malformed_rows": 0,
                "filtered": {"over_max_context_len": over} if over else {},
                "tokenizer": {"kind": "hash_blocks", "name": TOKEN_SCHEME, "block_size": bs},
                "trace": trace_stats(ts, t["input_length"][rows], out_len[rows], hash_ids),
                "sample_seed": int(seed),
                "order": c["order"],
                "arrivals": c["arrivals"],
                "request_rate": c["request_rate"],
                "num_requests": len(requests),
                "config": dict(c),
            }
        )
        return Workload(self.name, requests, prov)
