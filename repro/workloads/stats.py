"""`python -m repro.workloads.stats workload=<name> [overrides]` — what a workload looks like.

Prints the request count, prompt / output length percentiles, the distinct-token
working set (tokens an unbounded cache holds after every request: the size of the
radix tree of all full paths prompt + generated) and the hit-rate upper bound with an
infinite cache (each prompt's longest prefix shared with any earlier request's full
path, in arrival order, over all prompt tokens). Per-worker KV capacities well below
the working set put a run in the paper's "limited cache" regime.

Overrides use Hydra's syntax over conf/ (the same as the harness):
`workload=sharegpt workload.num_queries=512 workload.order=round_robin seed=1`.
Add `--json` to print one JSON object instead of the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from repro.confutil import CONF_DIR
from repro.workloads.base import Workload, build_workload
from repro.workloads.request import Request


class PrefixIndex:
    """Unbounded radix tree over token ids: longest-prefix match + insert.

    Used for the infinite-cache bound until `repro.kvcache.RadixCache` is available
    (stats uses that one when it imports). Edges are int32 arrays compared with numpy,
    so the Python work is per tree node, not per token.
    """

    __slots__ = ("root", "size")

    def __init__(self) -> None:
        self.root: dict = {}  # first token -> [edge array, children dict]
        self.size = 0  # tokens stored (distinct prefixes)

    @staticmethod
    def _common(edge: np.ndarray, seg: np.ndarray) -> int:
        """Tokens edge and seg share (their first token is equal: the child was found by it)."""
        from repro.kvcache.keys import as_key, common_prefix_len

        m = min(len(edge), len(seg))
        return common_prefix_len(as_key(seg[:m]), 0, as_key(edge[:m])) >> 2

    def match_prefix(self, tokens: np.ndarray) -> int:
        children, pos, n = self.root, 0, len(tokens)
        while pos < n:
            child = children.get(int(tokens[pos]))
            if child is None:
                return pos
            edge, grand = child
            k = self._common(edge, tokens[pos:])
            pos += k
            if k < len(edge):
                return pos
            children = grand
        return pos

    def insert(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=np.int32)
        children, pos, n = self.root, 0, len(tokens)
        while pos < n:
            key = int(tokens[pos])
            child = children.get(key)
            if child is None:
                children[key] = [tokens[pos:].copy(), {}]
                self.size += n - pos
                return
            edge, grand = child
            k = self._common(edge, tokens[pos:])
            if k < len(edge):  # split the edge at k
                lower = [edge[k:], grand]
                child[0], child[1] = edge[:k], {int(edge[k]): lower}
                grand = child[1]
            pos += k
            children = grand


def _radix_cache_or_none():
    """An unbounded `repro.kvcache.RadixCache` if that package provides one, else None."""
    try:
        from repro.kvcache import RadixCache, make_eviction  # type: ignore[attr-defined]
    except ImportError:
        return None
    return RadixCache(2**62, eviction=make_eviction({"name": "lru"}, 0), granularity="node")


def infinite_cache_bound(requests: Sequence[Request], use_radix_cache: bool = True) -> tuple[float, int]:
    """(hit-rate upper bound, distinct-token working set) over requests in arrival order."""
    cache = _radix_cache_or_none() if use_radix_cache else None
    hit = total = 0
    if cache is not None:
        for r in requests:
            hit += int(cache.peek_prefix(r.prompt_tokens))
            total += r.prompt_len
            cache.insert(r.full_tokens)
        return (hit / total if total else float("nan")), int(cache.total_size())
    index = PrefixIndex()
    for r in requests:
        hit += index.match_prefix(r.prompt_tokens)
        total += r.prompt_len
        index.insert(r.full_tokens)
    return (hit / total if total else float("nan")), index.size


def _pct(values: Iterable[int]) -> dict:
    v = np.asarray(list(values), dtype=np.float64)
    if not len(v):
        return {}
    q = np.percentile(v, [0, 50, 90, 99, 100])
    return {
        "min": int(q[0]),
        "p50": float(q[1]),
        "p90": float(q[2]),
        "p99": float(q[3]),
        "max": int(q[4]),
        "mean": float(v.mean()),
    }


def workload_stats(wl: Workload) -> dict:
    reqs = wl.requests
    bound, working_set = infinite_cache_bound(reqs)
    arrivals = np.array([r.arrival_s for r in reqs])
    p = wl.provenance
    return {
        "workload": wl.name,
        "num_requests": len(reqs),
        "num_groups": len({r.group_id for r in reqs}),
        "num_conversations": len({r.conversation_id for r in reqs}),
        "max_turn": max((r.turn for r in reqs), default=0),
        "prompt_tokens": _pct(r.prompt_len for r in reqs),
        "output_tokens": _pct(r.output_len for r in reqs),
        "total_prompt_tokens": int(sum(r.prompt_len for r in reqs)),
        "working_set_tokens": int(working_set),
        "hit_rate_upper_bound": float(bound),
        "max_request_tokens": wl.max_request_tokens,
        "duration_s": float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0,
        "source": p.get("source"),
        "synthetic": p.get("synthetic"),
        "data_file": p.get("data_file"),
        "data_sha256": p.get("data_sha256"),
        "tokenizer": p.get("tokenizer"),
        "malformed_rows": p.get("malformed_rows", 0),
        "file_truncated": p.get("file_truncated", False),
        "filtered": p.get("filtered", {}),
        "cache_hit": wl.cache_hit,
        "trace": p.get("trace"),
    }


def format_stats(s: dict) -> str:
    def row(name, d):
        if not d:
            return f"  {name:<16} -"
        return (
            f"  {name:<16} min {d['min']}  p50 {d['p50']:.0f}  p90 {d['p90']:.0f}  "
            f"p99 {d['p99']:.0f}  max {d['max']}  mean {d['mean']:.1f}"
        )

    label = "SYNTHETIC STAND-IN" if s["synthetic"] else s["source"]
    tok = s["tokenizer"] or {}
    lines = [
        f"workload {s['workload']}  ({label}; data {s['data_file'] or '-'}; tokenizer {tok.get('name')})",
        f"  requests         {s['num_requests']}  (groups {s['num_groups']}, conversations "
        f"{s['num_conversations']}, max turn index {s['max_turn']}; arrivals span {s['duration_s']:.1f} s)",
        row("prompt tokens", s["prompt_tokens"]),
        row("output tokens", s["output_tokens"]),
        f"  total prompt     {s['total_prompt_tokens']} tokens",
        f"  working set      {s['working_set_tokens']} distinct tokens (an unbounded cache's final size)",
        f"  hit-rate bound   {s['hit_rate_upper_bound']:.4f} (infinite cache, arrival order)",
        f"  longest request  {s['max_request_tokens']} tokens (prompt + output)",
    ]
    tr = s.get("trace")
    if tr:
        lines.append(
            f"  trace            {tr['requests']} requests over {tr['span_min']:.1f} min "
            f"({tr['req_per_s']:.2f} req/s); input mean {tr['mean_input']:.0f} max {tr['max_input']}; "
            f"output mean {tr['mean_output']:.0f}"
        )
        lines.append(
            f"  trace blocks     {tr['blocks']} hash blocks, {tr['distinct_blocks']} distinct "
            f"({100 * tr['block_reuse']:.1f} % of blocks are reuses)"
        )
    if s["malformed_rows"] or s["file_truncated"]:
        lines.append(
            f"  data issues      malformed rows skipped {s['malformed_rows']}; file truncated {s['file_truncated']}"
        )
    if s["filtered"]:
        lines.append("  filters          " + ", ".join(f"{k} {v}" for k, v in s["filtered"].items()))
    return "\n".join(lines)


def conf_dir() -> Path:
    """The repository's conf/ (next to the package), else ./conf."""
    return CONF_DIR if (CONF_DIR / "workload").is_dir() else Path.cwd() / "conf"


def compose_workload_config(overrides: Sequence[str]):
    """Compose `workload` (+ `seed`) from conf/ with Hydra, using the harness's override syntax."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="_workload_stats", node={"defaults": [{"workload": "gsp"}, "_self_"], "seed": 0})
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="_workload_stats", overrides=list(overrides))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    cfg = compose_workload_config(argv)
    wl = build_workload(cfg.workload, seed=int(cfg.seed))
    s = workload_stats(wl)
    print(json.dumps(s, indent=2, sort_keys=True) if as_json else format_stats(s))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
