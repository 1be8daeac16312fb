"""A small results tree in the real format (config.yaml, summary.json, timings.json per cell),
for every experiment the figures read — written by the tests, never by the simulator.

Numbers come from a toy performance model in which the paper's qualitative findings hold
(LBGR+RLT best, Cache-Aware+LRU the strongest baseline, the gap growing with the cache,
throughput capped by the offered load, latency growing with the decay interval, RLT beating
L-LRU on one worker), plus a little seed noise, so that every qualitative claim in
repro.figures.claims is "reproduced" on the untouched fixture and tests can flip single numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

SYSTEMS = {  # policy_name -> (router, eviction, latency factor, hit-rate bonus)
    "Random+LRU": ("random", "lru", 1.0, 0.00),
    "RoundRobin+LRU": ("round_robin", "lru", 0.9, 0.02),
    "CacheAware+LRU": ("cache_aware", "lru", 0.5, 0.20),
    "CacheAware+RLT": ("cache_aware", "rlt", 0.12, 0.30),
    "LBGR+LRU": ("lbgr", "lru", 0.07, 0.32),
    "LBGR+RLT": ("lbgr", "rlt", 0.04, 0.40),
}
# beside the six: today's cache-aware rule (smg 1.13.0) as its own system (regime_map's third panel)
SMG_SYSTEMS = {"CacheAware(smg)+LRU": ("cache_aware", "lru", 0.45, 0.22)}
# todays_baselines' other rows (issue 43): SGLang's own eviction policies and today's routers
TODAY_SYSTEMS = {
    "CacheAware+LFU": ("cache_aware", "lfu", 0.45, 0.22),
    "CacheAware+SLRU": ("cache_aware", "slru", 0.45, 0.23),
    "LBGR+LFU": ("lbgr", "lfu", 0.06, 0.41),
    "LBGR+SLRU": ("lbgr", "slru", 0.06, 0.42),
    "PrefixHash(smg)+LRU": ("prefix_hash", "lru", 0.5, 0.21),
    "LeastLoad(smg)+LRU": ("least_load", "lru", 0.9, 0.02),
    "LMetric+LRU": ("lmetric", "lru", 0.08, 0.30),
}
# gap_ladder: rung -> its cells' sides (conf/exp/gap_ladder.yaml's sweep)
LADDER_CELLS = {"r0": ("baseline", "ours"), "r1": ("baseline", "ours"), "r2": ("baseline", "ours"),
                "r3": ("baseline",), "r4": ("ours",), "r5": ("ours",), "r6": ("baseline", "ours")}
LADDER_SIDES = {"baseline": "CacheAware+LRU", "ours": "LBGR+RLT"}
WORKLOADS = ("gsp", "sharegpt", "ultrachat", "loogle")
OURS = ("CacheAware+RLT", "LBGR+LRU", "LBGR+RLT")

# A REPRODUCE.md with hand-written prose around the two generated blocks.
REPRODUCE_TEMPLATE = """# Reproduction status (test copy)

hand-written text before

<!-- BEGIN GENERATED: figures (python -m repro.figures; do not edit by hand) -->
<!-- END GENERATED: figures -->

hand-written text between

<!-- BEGIN GENERATED: headline (python -m repro.figures; do not edit by hand) -->
<!-- END GENERATED: headline -->

<!-- BEGIN GENERATED: claims (python -m repro.figures; do not edit by hand) -->
<!-- END GENERATED: claims -->

hand-written text after
"""

def out_file(name: str, ending: str) -> str:
    """The file the fixture's (protocol=text) cells of `name` render to: plain for an experiment
    whose default protocol is text, `<name>.text<ending>` for fig2_main / tab2_ablation (artifact)."""
    from repro.figures.protocols import output_name

    return output_name(name, "text", ending)


def system_spec(system: str) -> tuple:
    return SYSTEMS[system] if system in SYSTEMS else SMG_SYSTEMS.get(system) or TODAY_SYSTEMS[system]


def grid(exp: str, small: bool = False) -> list[dict]:
    """The cells of one experiment: dicts of system, seed and the overridden knobs.

    small: fewer benchmarks, seeds and sweep points (first and last), for fast render tests.
    """
    six = list(SYSTEMS)
    cells = []
    workloads = WORKLOADS[:2] if small else WORKLOADS

    def sweep(values):
        return (values[0], values[-1]) if small else values

    def add(systems, seeds=(0,), **over):
        for s in systems:
            for seed in (seeds[:2] if small else seeds):
                cells.append({"system": s, "seed": seed, **over})

    if exp == "fig2_main":
        for wl in workloads:
            add(six, seeds=(0, 1, 2), workload=wl)
    elif exp == "fig3_models":
        for m in ("llama31_70b", "mixtral_8x7b"):
            add(six, workload="sharegpt", model=m, hardware="h200")
    elif exp in ("fig8_llama70b_benchmarks", "fig9_mixtral_benchmarks"):
        m = "llama31_70b" if exp.startswith("fig8") else "mixtral_8x7b"
        for wl in ("gsp", "ultrachat", "loogle")[: 2 if small else 3]:
            add(six, workload=wl, model=m, hardware="h200")
    elif exp == "fig2_router_rules":  # the cache-aware rows under the other rules (the rest: fig2_main)
        for wl in workloads:
            for gen in ("le_0_2_3", "smg_1_13"):
                add(["CacheAware+LRU", "CacheAware+RLT"], seeds=(0, 1, 2), workload=wl, generation=gen)
    elif exp == "regime_map":
        for r in sweep((4.0, 16.0, 32.0)):
            for kv in sweep((8192, 32768, 262144)):
                add(["CacheAware+LRU", "CacheAware+RLT", "LBGR+RLT", "CacheAware(smg)+LRU"], seeds=(0, 1),
                    request_rate=r, kv_cache_tokens=kv)
    elif exp == "load_ladder":
        for wl in workloads[:2]:
            for r in sweep((4.0, 16.0, 32.0, 64.0)):
                add(six, workload=wl, request_rate=r)
    elif exp == "gap_ladder":  # one cell per (rung, system); a system a rung leaves unchanged has none
        for rung, sides in LADDER_CELLS.items():
            for side in sides:
                add([LADDER_SIDES[side]], seeds=(0, 1, 2),
                    ladder={"rung": rung, "factor": f"factor {rung}", "side": side})
    elif exp == "fig2_speed":
        for s in sweep((0.5, 1.0, 2.0)):
            add(["CacheAware+LRU", "LBGR+RLT"], seeds=(0, 1, 2), speed_factor=s)
    elif exp == "fig4_order":
        add(six, workload="loogle", order="round_robin")
    elif exp == "fig5_request_rate":
        for r in sweep((4.0, 12.0, 20.0)):
            add(six, request_rate=r)
    elif exp == "fig6_workers":
        for w in ((2, 6) if small else (2, 4, 6, 8, 10)):
            add(six, num_workers=w)
    elif exp == "fig7_cache_size":
        for f in sweep((0.5, 0.7, 0.9)):
            add(six, mem_fraction=f)
    elif exp == "tab2_ablation":
        add(["CacheAware+LRU", *OURS], seeds=(0, 1, 2))
    elif exp == "fig10_prefix_ratio":
        for r in sweep((0.5, 0.75, 0.9)):
            add(six, shared_prefix_ratio=r)
    elif exp == "fig11_num_queries":
        for n in sweep((256, 512, 1024)):
            add(six, num_queries=n)
    elif exp == "fig12_output_len":
        for n in sweep((4, 32, 128)):
            add(six, output_len=n)
    elif exp == "fig13_batch_size":
        for b in sweep((16, 64, 256)):
            add(six, max_running_requests=b)
    elif exp == "tab3_single_worker":
        for wl in ("gsp", "sharegpt"):
            add(["CacheAware+LRU", "CacheAware+RLT"], workload=wl, num_workers=1)
    elif exp == "fig14_decay_interval":
        for dt in sweep((0.01, 0.1, 1.0, 10.0)):
            add(["LBGR+LRU", "LBGR+RLT"], decay_interval_s=dt)
        add(["CacheAware+LRU"])
    elif exp == "todays_baselines":
        for wl in workloads:
            add([*six, *SMG_SYSTEMS, *TODAY_SYSTEMS], seeds=(0, 1, 2), workload=wl)
    elif exp == "mooncake_replay":
        add(six, workload="mooncake", num_workers=8, hardware="h100")
    else:
        raise KeyError(exp)
    return cells


PERF_EXPS = (
    "fig2_main", "fig3_models", "fig4_order", "fig5_request_rate", "fig6_workers", "fig7_cache_size",
    "tab2_ablation", "fig10_prefix_ratio", "fig11_num_queries", "fig12_output_len", "fig13_batch_size",
    "tab3_single_worker", "fig14_decay_interval", "fig8_llama70b_benchmarks", "fig9_mixtral_benchmarks",
    "fig2_router_rules", "regime_map", "load_ladder", "mooncake_replay", "todays_baselines", "gap_ladder",
    "fig2_speed",
)


def config(exp: str, c: dict) -> dict:
    router, eviction, _, _ = system_spec(c["system"])
    r = {"_target_": f"repro.routing.{router}", "name": router}
    if router == "cache_aware":  # sglang-router 0.3.2's rule unless the cell or the system says otherwise
        r["generation"] = c.get("generation", "smg_1_13" if c["system"] in SMG_SYSTEMS else "v0_3_2")
    if router == "lbgr":
        r.update(decay_interval_s=c.get("decay_interval_s", 0.1), decay_factor=0.9, tracker="approximate")
    wl = c.get("workload", "gsp")
    return {
        "backend": {"name": "sim"},
        "cluster": {
            "kv_cache_tokens": c.get("kv_cache_tokens"),
            "mem_fraction": c.get("mem_fraction", 0.9),
            "num_workers": c.get("num_workers", 4),
            "scheduler": {"max_running_requests": c.get("max_running_requests", 256), "schedule_policy": "lpm"},
        },
        "eviction": {"name": eviction, "granularity": "node"},
        "exp_name": exp,
        "hardware": {"name": c.get("hardware", "l40"), **({"speed_factor": c["speed_factor"]} if "speed_factor" in c else {})},
        "model": {
            "name": c.get("model", "llama31_8b"),
            "weight_dtype": "fp8" if c.get("model") == "llama31_70b" else "bf16",
            "tensor_parallel": 1,
        },
        "policy_name": c["system"],
        **({"ladder": c["ladder"]} if "ladder" in c else {}),
        "results_dir": "results",
        "router": r,
        "seed": c["seed"],
        "tracking": {"mode": "offline"},
        "workload": {
            "name": wl,
            "num_queries": c.get("num_queries", 1024),
            "order": c.get("order", "random"),
            "output_len": c.get("output_len", 4),
            "request_rate": c.get("request_rate", 12.0),
            "shared_prefix_ratio": c.get("shared_prefix_ratio"),
        },
    }


def metrics(c: dict) -> dict:
    """The toy performance model (see the module docstring)."""
    system = c["system"]
    _, eviction, q, bonus = system_spec(system)
    ours = system in OURS
    rng = np.random.default_rng([c["seed"], sum(map(ord, system)), int(1000 * c.get("request_rate", 12.0))])
    noise = 1.0 + 0.02 * rng.standard_normal()
    frac = c.get("mem_fraction", 0.9)
    base = 2.0 * c.get("request_rate", 12.0) / 12.0 * (1 + c.get("output_len", 4) / 64)
    if ours:  # the gap widens as the cache grows
        q = q * (1.9 - frac)
    if system.startswith("LBGR"):
        q = q * (1 + 0.3 * np.log10(c.get("decay_interval_s", 0.1) / 0.01))
    workers = c.get("num_workers", 4)
    if workers == 1 and eviction == "rlt":
        q = 0.3
    lat50 = base * q * noise
    hit = min(0.95, 0.35 + bonus) * (1 - 0.01 * rng.random())
    capacity = 3.0 * workers * (1 - q / 3)  # >= 12 req/s for every system from 6 workers on
    rate = c.get("request_rate", 12.0)
    thr = min(rate, capacity) * (0.999 + 0.001 * rng.random()) if capacity < rate else rate * (1 - 0.002 * rng.random())
    n = c.get("num_queries", 1024)
    return {
        "hit_rate": hit,
        "latency_p50_s": lat50,
        "latency_p95_s": lat50 * 4,
        "makespan_s": n / thr,
        "num_failed": 0,
        "num_requests": n,
        "throughput_rps": thr,
        "throughput_tok_s": thr * 2000,
        "ttft_p50_s": lat50 * 0.8,
        "ttft_p95_s": lat50 * 3.5,
        # the load regime of the toy model: past its capacity overloaded, within 10 % of it backlogged
        "regime": "overloaded" if capacity < rate else ("backlogged" if rate >= 0.9 * capacity else "stable"),
    }


def provenance(exp: str, c: dict, cfg: dict) -> dict:
    wl = cfg["workload"]["name"]
    wprov = {
        "workload": wl,
        "source": "generated" if wl == "gsp" else ("real" if wl == "sharegpt" else "synthetic"),
        "synthetic": wl in ("ultrachat", "loogle"),
        "tokenizer": {"kind": "builtin", "name": "builtin-words-v1", "vocab_size": 65536},
    }
    if wl == "sharegpt":
        wprov.update(file_truncated=True, rows_read=17672, malformed_rows=1)  # the cut record is malformed
    return {
        "backend": "sim",
        "gpu": cfg["hardware"]["name"],
        "kv_capacity_tokens": [int(200_000 * cfg["cluster"]["mem_fraction"])] * cfg["cluster"]["num_workers"],
        "model": cfg["model"]["name"],
        "policy_name": cfg["policy_name"],
        "seed": c["seed"],
        "versions": {"repro": "0.1.0"},
        "workload": wprov,
    }


def timings(c: dict) -> dict:
    router, eviction, _, _ = system_spec(c["system"])
    n = c.get("num_queries", 1024)
    route_ms = {"random": 0.002, "round_robin": 0.001, "cache_aware": 0.05, "lbgr": 0.4, "prefix_hash": 0.003, "least_load": 0.004, "lmetric": 0.06}[router]
    evict_ms = {"lru": 0.02, "rlt": 0.3, "lfu": 0.03, "slru": 0.03}[eviction]
    return {  # the harness's layout: the backend's timings at the top level, its own under "harness"
        "completion_callback": {"calls": n, "total_s": n * 0.1 * route_ms / 1e3},
        "eviction": {"calls": n // 2, "evicted_tokens": n * 100, "total_s": n * evict_ms / 1e3},
        "routing": {"decisions": n, "total_s": n * route_ms / 1e3},
        "harness": {"backend_wall_s": 0.5 + n / 1024},
    }


def write_cell(root: Path, exp: str, sig: str, cfg: dict, summary: dict, tim: dict) -> Path:
    d = root / exp / sig
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=True))
    (d / "timings.json").write_text(json.dumps(tim, sort_keys=True, indent=2))
    (d / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=2))
    return d


def write_requests(d: Path, c: dict, n: int = 60) -> None:
    """requests.parquet for the figures that read per-request rows (mooncake_replay's time row)."""
    import pandas as pd

    m = metrics(c)
    arrival = np.linspace(0.0, 600.0, n)
    ttft = np.full(n, m["ttft_p50_s"]) * (1 + 0.5 * np.sin(arrival / 60))
    pd.DataFrame({"arrival_s": arrival, "first_token_s": arrival + ttft,
                  "finish_s": arrival + ttft + m["latency_p50_s"], "failed": np.zeros(n, dtype=bool)}
                 ).to_parquet(d / "requests.parquet")


def make_results(root: str | Path, exps=PERF_EXPS, theory: bool = True, small: bool = False) -> Path:
    root = Path(root)
    for exp in exps:
        for i, c in enumerate(grid(exp, small)):
            cfg = config(exp, c)
            summary = metrics(c) | {"provenance": provenance(exp, c, cfg)}
            d = write_cell(root, exp, f"{exp[:4]}{i:04d}", cfg, summary, timings(c))
            if exp == "mooncake_replay":
                write_requests(d, c)
    if theory:
        make_theory(root)
    return root


def make_theory(root: Path) -> None:
    """Cells as `python -m repro.theory.competitive_ratio` writes them (flat params as config.yaml,
    cpu_s / wall_s timings), Theorem 4 construction: L-LRU = x, RLT ~ H_x, OPT = 1."""
    i = 0
    for x in (4, 16, 64):
        h = float(sum(1.0 / k for k in range(1, x + 1)))
        for policy, mpp in (("lru", float(x)), ("rlt", h * 1.05), ("opt", 1.0)):
            params = {"b_minus_l_plus_1": x, "beta": 1, "construction": "thm4", "granularity": "token",
                      "min_path_len": 8, "num_phases": 20, "num_seeds": 8 if policy == "rlt" else 1,
                      "policy": policy, "seed": x}
            summary = {
                "construction": "thm4", "policy": policy, "granularity": "token", "x": x, "lru_bound": x,
                "harmonic": h, "opt_bound": 1, "misses_per_phase": mpp, "ci95_low": mpp - 0.1,
                "ci95_high": mpp + 0.1, "num_runs": 8 if policy == "rlt" else 1, "phases_measured": 20,
                "capacity_tokens": x + 7, "min_path_len": 8, "beta": 1, "params": params,
                "provenance": {"code": "repro.theory.competitive_ratio", "model": "single worker, replayer"},
            }
            write_cell(root, "thm_competitive_ratio", f"thm{i:04d}", params, summary, {"cpu_s": 0.1, "wall_s": 0.12})
            i += 1


def matching_cells(root: str | Path, exp: str, **match) -> list[Path]:
    """The cell folders of results/<exp>/ whose config matches every `match` field (dotted names
    with '__' for '.'; e.g. policy_name="LBGR+RLT", workload__name="gsp")."""
    found = []
    for d in sorted((Path(root) / exp).iterdir()):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        ok = True
        for k, v in match.items():
            node = cfg
            for part in k.split("__"):
                node = node.get(part) if isinstance(node, dict) else None
            ok &= node == v
        if ok:
            found.append(d)
    return found


def set_metric(root: str | Path, exp: str, system: str, metric: str, factor: float, **match) -> int:
    """Multiply `metric` of every cell of `system` in results/<exp>/ (optionally matching config
    fields, as `matching_cells`) by `factor`; returns how many cells changed."""
    cells = matching_cells(root, exp, policy_name=system, **match)
    for d in cells:
        s = json.loads((d / "summary.json").read_text())
        s[metric] = s[metric] * factor
        (d / "summary.json").write_text(json.dumps(s, sort_keys=True, indent=2))
    return len(cells)
