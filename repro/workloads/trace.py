"""A recorded request trace, replayed as it was: anyone's own trace, or one a live cell wrote.

Format: JSON Lines, one request per line (blank lines skipped), keys:
- `input_ids` (list of ints >= 0) or `text` (a string, tokenized with `workload.tokenizer`): the
  prompt; exactly one of the two;
- `arrival_s` (number >= 0): when it arrives, seconds from the trace's start;
- `output_len` (int >= 1): tokens it generates;
- `output_ids` (optional, `output_len` ints >= 0): the tokens it generates (the next turn of a
  conversation may hold them); absent: deterministic ids of the line number that continue no
  other prompt;
- `server` (optional, int >= 0): the worker it was served by; the fixed router
  (conf/router/fixed.yaml) sends it there;
- `group` (optional, int): a label for statistics (default: the line's index);
- `observed` (optional, object): what a live run measured (cached tokens, times): ignored here,
  read by repro.analysis.sim_vs_real.
Any other key is an error (a typo must not pass silently). Every line is checked before anything is
built: a bad file fails with its line numbers (at most 10 listed), never a partial workload.

`path: null` replays the packaged example (repro/workloads/data/trace/example.jsonl: 16 requests in
2 prefix groups, group g on server g). Requests are replayed in arrival order (ties in file order), the first one's arrival is kept as it
is (a live cell's trace starts near 0). Keys beyond the common ones: `speedup` (2 = twice as fast).
`num_queries` (null = all) keeps the first requests; `output_len` null = the trace's; `request_rate`
and `order` do not apply (the trace's arrivals and order are the point).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from repro.confutil import is_int
from repro.workloads import cache as _cache
from repro.workloads.base import DataSource, Workload, WorkloadError, WorkloadSpec, _Problems
from repro.workloads.mooncake import output_tokens
from repro.workloads.request import Request
from repro.workloads.tokenizer import make_tokenizer

PACKAGED_FILE = Path(__file__).resolve().parent / "data" / "trace" / "example.jsonl"
PACKAGED_LABEL = "repro/workloads/data/trace/example.jsonl"
FORMAT_ID = "repro request trace (JSONL: input_ids|text, arrival_s, output_len[, output_ids, server, group, observed])"
KEYS = ("input_ids", "text", "arrival_s", "output_len", "output_ids", "server", "group", "observed")
MAX_LISTED_ERRORS = 10
MAX_TOKEN_ID = 2**31 - 1  # int32 ids


def _ids_problem(name: str, ids: Any) -> str | None:
    if not isinstance(ids, list) or not all(is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in ids):
        return f"{name} must be a list of integers in [0, 2^31), got {str(ids)[:60]}"
    return None


def row_problem(obj: Any) -> str | None:
    """Why one parsed line is not a valid trace row (None: it is)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    unknown = sorted(set(obj) - set(KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}"
    if ("input_ids" in obj) == ("text" in obj):
        return "needs exactly one of input_ids and text"
    if "input_ids" in obj:
        why = _ids_problem("input_ids", obj["input_ids"])
        if why is not None:
            return why
        if not obj["input_ids"]:
            return "input_ids is empty"
    elif not isinstance(obj["text"], str) or not obj["text"]:
        return f"text must be a non-empty string, got {str(obj['text'])[:60]!r}"
    for key in ("arrival_s", "output_len"):
        if key not in obj:
            return f"missing key {key}"
    at = obj["arrival_s"]
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
        return f"arrival_s must be a number >= 0, got {at!r}"
    n = obj["output_len"]
    if not is_int(n) or n < 1:
        return f"output_len must be an integer >= 1, got {n!r}"
    if "output_ids" in obj:
        why = _ids_problem("output_ids", obj["output_ids"])
        if why is not None:
            return why
        if len(obj["output_ids"]) != n:
            return f"output_ids has {len(obj['output_ids'])} ids but output_len is {n}"
    if "server" in obj and (not is_int(obj["server"]) or obj["server"] < 0):
        return f"server must be an integer >= 0, got {obj['server']!r}"
    if "group" in obj and not is_int(obj["group"]):
        return f"group must be an integer, got {obj['group']!r}"
    if "observed" in obj and not isinstance(obj["observed"], dict):
        return "observed must be a JSON object"
    return None


def read_trace(path: Path) -> list[dict]:
    """The rows of a trace file in file order, every one checked; WorkloadError listing bad lines."""
    rows: list[dict] = []
    errors: list[str] = []
    n_bad = 0
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    problem: str | None = f"not valid JSON ({exc.__class__.__name__})"
                else:
                    problem = row_problem(obj)
                if problem is not None:
                    n_bad += 1
                    if len(errors) < MAX_LISTED_ERRORS:
                        errors.append(f"line {lineno}: {problem}")
                    continue
                obj["_line"] = lineno
                rows.append(obj)
    except OSError as exc:
        raise WorkloadError(f"workload 'trace': cannot read {path}: {exc}") from exc
    if n_bad:
        more = f" (and {n_bad - len(errors)} more)" if n_bad > len(errors) else ""
        raise WorkloadError(
            f"workload 'trace': {path} is not a valid request trace ({FORMAT_ID}): {n_bad} bad line(s){more}:\n  - "
            + "\n  - ".join(errors)
        )
    if not rows:
        raise WorkloadError(f"workload 'trace': {path} holds no requests")
    return rows


class TraceWorkload(WorkloadSpec):
    name = "trace"
    SOURCES = ("auto", "real")
    ORDERS = ("trace",)
    RATE_OPTIONAL = NUM_QUERIES_OPTIONAL = OUTPUT_LEN_OPTIONAL = True
    DEFAULTS = {"num_queries": None, "request_rate": None, "order": "trace", "output_len": None, "speedup": 1.0}

    def validate(self, p: _Problems) -> None:
        c = self.cfg
        p.float_(c, "speedup", lo=0.0, lo_open=True)
        if c.get("request_rate") is not None:
            p.add("request_rate does not apply: the trace's arrival_s set the arrivals (use speedup)")

    def resolve_data(self) -> DataSource:
        if self.cfg["path"] is None:  # the packaged example: 16 requests, 2 prefix groups, each on its server
            path, label = PACKAGED_FILE, PACKAGED_LABEL
        else:
            path, label = Path(self.cfg["path"]).expanduser(), str(self.cfg["path"])
        if not path.is_file():
            raise WorkloadError(f"workload 'trace': trace file not found: {path} ({FORMAT_ID})")
        return DataSource(
            kind="real",
            path=path,
            label=label,
            sha256=_cache.file_sha256(path),
            size_bytes=path.stat().st_size,
            dataset_id=FORMAT_ID,
        )

    def build(self, seed: int, use_cache: bool = True) -> Workload:
        c = self.cfg
        data = self.resolve_data()
        assert data.path is not None
        rows = read_trace(data.path)
        n_file = len(rows)
        order = sorted(range(n_file), key=lambda k: (float(rows[k]["arrival_s"]), k))  # stable: ties in file order
        over = 0
        lengths = {k: (c["output_len"] if c["output_len"] is not None else int(rows[k]["output_len"])) for k in order}
        texts = [rows[k]["text"] for k in order if "text" in rows[k]]
        encoded = iter(make_tokenizer(c["tokenizer"]).encode_batch(texts)) if texts else iter(())
        prompts: dict[int, np.ndarray] = {}
        for k in order:  # tokenized once, in order, before filtering (the filter needs the lengths)
            ids = rows[k]["input_ids"] if "input_ids" in rows[k] else next(encoded)
            prompts[k] = np.asarray(ids, dtype=np.int32)
        if c["max_context_len"] is not None:
            keep = [k for k in order if len(prompts[k]) + lengths[k] <= c["max_context_len"]]
            over = len(order) - len(keep)
            order = keep
        want = len(order) if c["num_queries"] is None else c["num_queries"]
        if want > len(order):
            raise WorkloadError(
                f"workload 'trace': num_queries={want} but the trace has {len(order)} requests"
                + (f" ({over} over max_context_len)" if over else "")
            )
        requests = []
        for rid, k in enumerate(order[:want]):
            row = rows[k]
            n_out = lengths[k]
            if "output_ids" in row and c["output_len"] is None:
                gen = np.asarray(row["output_ids"], dtype=np.int32)
            else:
                gen = output_tokens(int(row["_line"]), n_out)
            prompt = prompts[k]
            prompt.flags.writeable = False
            gen.flags.writeable = False
            requests.append(
                Request(
                    id=rid,
                    arrival_s=float(row["arrival_s"]) / c["speedup"],
                    prompt_tokens=prompt,
                    output_len=len(gen),
                    generated_tokens=gen,
                    group_id=int(row.get("group", k)),
                    conversation_id=k,
                    turn=0,
                    text=row.get("text"),
                    server=int(row["server"]) if "server" in row else None,
                )
            )
        prov = data.provenance()
        prov.update(
            {
                "workload": self.name,
                "rows_read": n_file,
                "filtered": {"over_max_context_len": over} if over else {},
                "tokenizer": make_tokenizer(c["tokenizer"]).describe() if texts else {"kind": "input_ids"},
                "with_server": sum(r.server is not None for r in requests),
                "sample_seed": int(seed),
                "num_requests": len(requests),
                "config": dict(c),
            }
        )
        return Workload(self.name, requests, prov)


def trace_rows(
    requests: Sequence[Request], records: Any, output_ids: Sequence[Sequence[int]] | None = None
) -> list[dict]:
    """Trace rows (this module's format) of a run: each request's prompt ids (and text), its
    recorded arrival, output length and ids, the worker that served it, and what was observed.
    `records` are the run's per-request records (RECORD_COLUMNS, in `requests` order); failed
    requests are left out (they have no reply to replay)."""
    out = []
    for i, r in enumerate(requests):
        rec = records.iloc[i]
        if bool(rec["failed"]):
            continue
        n_out = int(rec["output_tokens"])
        row: dict = {"input_ids": [int(x) for x in r.prompt_tokens], "arrival_s": float(rec["arrival_s"])}
        row["output_len"] = n_out
        if output_ids is not None and len(output_ids[i]) == n_out:
            row["output_ids"] = [int(x) for x in output_ids[i]]
        if int(rec["worker"]) >= 0:
            row["server"] = int(rec["worker"])
        row["group"] = int(r.group_id)
        row["observed"] = {
            "id": int(r.id),
            "cached_tokens": int(rec["cached_tokens"]),
            "prompt_tokens": int(rec["prompt_tokens"]),
            "first_token_s": float(rec["first_token_s"]),
            "finish_s": float(rec["finish_s"]),
            "queue_wait_s": None if math.isnan(float(rec["queue_wait_s"])) else float(rec["queue_wait_s"]),
        }
        out.append(row)
    return out


def request_rows(requests: Sequence[Request], servers: Sequence[int] | None = None) -> list[dict]:
    """Any workload's requests as trace rows (their own arrivals and output ids), each assigned
    `servers[i]` when given: a workload replayed through the fixed router."""
    out = []
    for i, r in enumerate(requests):
        row: dict = {
            "input_ids": [int(x) for x in r.prompt_tokens],
            "arrival_s": float(r.arrival_s),
            "output_len": int(r.output_len),
            "output_ids": [int(x) for x in r.generated_tokens],
            "group": int(r.group_id),
        }
        if servers is not None:
            row["server"] = int(servers[i])
        out.append(row)
    return out


def write_trace(path: str | Path, rows: Sequence[dict]) -> None:
    """Write trace rows as JSON Lines (atomically: a reader never sees half a trace)."""
    from repro.fileio import write_atomic

    text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
    write_atomic(str(path), text)


__all__ = [
    "FORMAT_ID",
    "KEYS",
    "TraceWorkload",
    "read_trace",
    "request_rows",
    "row_problem",
    "trace_rows",
    "write_trace",
]
