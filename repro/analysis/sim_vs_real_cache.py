"""Checks (a) and (b) of the simulator against the real server: the cache alone, request by request,
and the caching inside a live cell with its own server assignments.

One real SGLang server at a time (plain radix cache, LRU, `--max-total-tokens B`), a trace that
forces eviction sent one request at a time (each after the previous reply), and the simulator's
worker (1 worker, LRU, node granularity, capacity B) replaying the same requests, with the
server's own output ids, far apart in time. No clock matters, so the target is exact: every
request gets the same cached tokens. Observe (`observe_sequential`, HTTP) -> replay
(`replay_sequential`) -> compare (`compare_cache`); `python -m repro.analysis.sim_vs_real cache`
runs all three (sim_vs_real.py).

(b): a live cell writes its observed trace (`<cell>/logs/trace.jsonl`: prompts, arrivals, the
server's output ids, the worker that served each request, its cached tokens); `replay_cell` replays
it with the cell's config, workload=trace and router=fixed, and compares request by request. A
difference is attributed to SGLang's overlap scheduler when the request arrived while a
same-prefix request on its server had not produced its first token (the simulator does not model
it: run the live cell with --disable-overlap-schedule for an exact target); any other is
"unexplained". `python -m repro.analysis.sim_vs_real cell <cell dir>`.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from repro.workloads.request import Request

DEFAULT_CAPACITIES = (1000, 1200, 1470)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def eviction_trace(
    num_requests: int = 36, num_prefixes: int = 6, seed: int = 40, question_len: int = 12, output_len: int = 4
) -> list[Request]:
    """Requests on more shared prefixes (160-340 tokens) than a small cache holds, the prefix of each
    drawn at random (seeded): recent prefixes hit, LRU evicts the others; each request its prefix +
    a fresh question. Output ids are placeholders until the server's are known."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(160, 341, num_prefixes)
    reqs = []
    for i in range(num_requests):
        p = int(rng.integers(0, num_prefixes))
        prompt = [1000 + 1000 * p + k for k in range(int(lengths[p]))] + [
            50000 + 20 * i + j for j in range(question_len)
        ]
        reqs.append(
            Request(i, float(i), np.asarray(prompt, np.int32), output_len, np.zeros(output_len, np.int32), p, i, 0)
        )
    return reqs


def _post(url: str, body: dict, timeout_s: float = 300.0) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with _OPENER.open(req, timeout=timeout_s) as resp:
        raw = resp.read()
    try:
        return json.loads(raw)
    except ValueError:  # /flush_cache answers plain text
        return {"text": raw.decode(errors="replace")}


def observe_sequential(url: str, requests: Sequence[Request]) -> tuple[list[int], list[list[int]]]:
    """Send each request alone (non-streaming /generate, exact ids, fixed length, temperature 0);
    the server's cached tokens and output ids per request."""
    from repro.backends.sglang.protocol import generate_body

    _post(url + "/flush_cache", {})
    cached, outputs = [], []
    for r in requests:
        out = _post(url + "/generate", generate_body(r.prompt_tokens, int(r.output_len), stream=False))
        cached.append(int(out["meta_info"]["cached_tokens"]))
        outputs.append([int(x) for x in out["output_ids"]][-int(r.output_len) :])
    return cached, outputs


class _ConstantCost:
    """Every step 1 ms: the requests are replayed far apart, so no time is compared."""

    def step_time_s(self, prefill_tokens, prefill_attn_work, decode_batch, decode_context_tokens) -> float:
        return 1e-3


def replay_sequential(
    requests: Sequence[Request], output_ids: Sequence[Sequence[int]], capacity: int, policy: str = "lru", seed: int = 0
) -> list[int]:
    """The simulator's worker on the requests one at a time (1000 s apart), each generating the
    given output ids; its cached tokens per request."""
    from repro.kvcache import make_cache
    from repro.routing import RoundRobinRouter
    from repro.sim.cluster import SimCluster
    from repro.sim.scheduler_config import SchedulerConfig

    spaced = [
        Request(i, 1000.0 * i, r.prompt_tokens, len(out), np.asarray(out, np.int32), r.group_id, i, 0)
        for i, (r, out) in enumerate(zip(requests, output_ids))
    ]
    cache = make_cache(capacity, {"name": policy, "granularity": "node"}, seed)
    sim = SimCluster(spaced, [cache], _ConstantCost(), RoundRobinRouter(), SchedulerConfig(), policy, seed)
    rec = sim.run().records.sort_values("id")
    return [int(x) for x in rec["cached_tokens"]]


@dataclass(frozen=True)
class CacheCheck:
    capacity: int
    real: tuple[int, ...]
    sim: tuple[int, ...]

    @property
    def differ(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.real, self.sim)) if a != b]


def compare_cache(checks: Sequence[CacheCheck]) -> pd.DataFrame:
    rows = []
    for c in checks:
        d = c.differ
        rows.append(
            {
                "KV tokens": c.capacity,
                "requests": len(c.real),
                "same cached tokens": len(c.real) - len(d),
                "exact": not d,
                "first differences (request: real/sim)": ", ".join(f"{i}: {c.real[i]}/{c.sim[i]}" for i in d[:5])
                or "-",
            }
        )
    return pd.DataFrame(rows)


def cache_table_markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def run_cache_check(
    python: str,
    capacities: Sequence[int],
    log_dir: Path,
    requests: Sequence[Request] | None = None,
    start_timeout_s: float = 900.0,
) -> list[CacheCheck]:
    """Observe on one real server per capacity (one at a time: ~2.7 GB each), replay, return the checks."""
    import yaml

    from repro.backends.sglang.config import hardware_server
    from repro.backends.sglang.planning import ProcessSpec, free_ports, sglang_server_command
    from repro.backends.sglang.processes import ManagedProcess, wait_healthy
    from repro.backends.sglang.tiny_model import ensure_model_dir
    from repro.confutil import CONF_DIR

    model = yaml.safe_load((CONF_DIR / "model" / "tiny_llama.yaml").read_text())
    hw = hardware_server(yaml.safe_load((CONF_DIR / "hardware" / "cpu.yaml").read_text()))
    requests = list(requests) if requests is not None else eviction_trace()
    checks = []
    for cap in capacities:
        (port,) = free_ports(1)
        cmd = sglang_server_command(
            python,
            str(ensure_model_dir(model)),
            "127.0.0.1",
            port,
            "lru",
            {},
            kv_cache_tokens=int(cap),
            mem_fraction=None,
            random_seed=0,
            load_format=model["load_format"],
            extra_args=list(hw["extra_args"]),
        )
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false", **{k: str(v) for k, v in hw["env"].items()}}
        proc = ManagedProcess(
            ProcessSpec(
                f"server_kv{cap}", cmd, env, str(log_dir / f"server_kv{cap}.log"), f"http://127.0.0.1:{port}/health"
            )
        )
        try:
            proc.start()
            wait_healthy([proc], start_timeout_s)
            real, outputs = observe_sequential(f"http://127.0.0.1:{port}", requests)
        finally:
            proc.stop(20.0)
        checks.append(CacheCheck(int(cap), tuple(real), tuple(replay_sequential(requests, outputs, int(cap)))))
    return checks


# ---------------------------------------------------------------------------- (b) caching in a live cell
@dataclass(frozen=True)
class CellCheck:
    """A live cell's observed cached tokens vs the simulator's replay of its trace (router=fixed)."""

    real: tuple[int, ...]
    sim: tuple[int, ...]
    why: tuple[str, ...]  # per differing request: the mechanism it is attributed to

    @property
    def differ(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.real, self.sim)) if a != b]


OVERLAP = "overlapped a same-prefix request still in prefill (SGLang's overlap scheduler: run with --disable-overlap-schedule)"
UNEXPLAINED = "unexplained"


def replay_cell(trace_path: str | Path, cfg: dict) -> CellCheck:
    """Replay a live cell's trace (`<cell>/logs/trace.jsonl`) through the simulator with the cell's
    own config (`cfg`: its config.yaml) but workload=trace and router=fixed; compare each
    request's cached tokens with what the server reported."""
    import copy

    from repro.backends.assembly import assemble
    from repro.sim.cluster import SimCluster
    from repro.workloads.trace import read_trace

    cfg = copy.deepcopy(cfg)
    cfg["workload"] = {"_target_": "repro.workloads.trace.TraceWorkload", "name": "trace", "path": str(trace_path)}
    cfg["router"] = {"_target_": "repro.routing.FixedRouter", "name": "fixed"}
    cell = assemble(cfg)
    plan = cell.plan
    sim = SimCluster(
        cell.requests, cell.caches, cell.cost_model, cell.router, plan.scheduler, plan.eviction_name, plan.seeds.router
    )
    rec = sim.run().records.set_index("id")
    rows = read_trace(Path(trace_path))
    real, simd, why = [], [], []
    for r in cell.requests:  # arrival order; conversation_id = the row's index in the file
        obs = rows[r.conversation_id]["observed"]
        real.append(int(obs["cached_tokens"]))
        simd.append(int(rec.loc[r.id, "cached_tokens"]))
    for i, r in enumerate(cell.requests):
        if real[i] == simd[i]:
            continue
        busy = any(
            q.group_id == r.group_id
            and q.server == r.server
            and q.arrival_s <= r.arrival_s
            and rows[q.conversation_id]["observed"]["first_token_s"] > r.arrival_s
            for q in cell.requests[:i]
        )
        why.append(OVERLAP if busy else UNEXPLAINED)
    return CellCheck(tuple(real), tuple(simd), tuple(why))


def compare_cell(check: CellCheck) -> pd.DataFrame:
    d = check.differ
    counts = {w: check.why.count(w) for w in dict.fromkeys(check.why)}
    return pd.DataFrame(
        [
            {
                "requests": len(check.real),
                "same cached tokens": len(check.real) - len(d),
                "exact or attributed": UNEXPLAINED not in check.why,
                "differences (request: real/sim)": ", ".join(f"{i}: {check.real[i]}/{check.sim[i]}" for i in d[:5])
                or "-",
                "attributed to": "; ".join(f"{n} x {w}" for w, n in counts.items()) or "-",
            }
        ]
    )


__all__ = [
    "CacheCheck",
    "CellCheck",
    "DEFAULT_CAPACITIES",
    "cache_table_markdown",
    "compare_cache",
    "compare_cell",
    "eviction_trace",
    "observe_sequential",
    "replay_cell",
    "replay_sequential",
    "run_cache_check",
]
