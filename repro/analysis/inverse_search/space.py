"""The search space: Optuna parameters -> the Hydra overrides of a trial's cells.

Within the paper's stated ranges: workers 1-10, request rate 4-20 req/s, output tokens 4-128,
memory fraction 50-90 %, the four benchmarks. Beyond them (the paper does not state them): an
explicit per-worker KV budget instead of the memory formula, GSP's group count and system-prompt
length range, LBGR's decay (gamma, Delta t), the cache-aware router's generation, and the GPU's
speed (`hardware.speed_factor`, 0.5-2x the datasheet scaling: the paper does not say how fast its
L40s ran, and our L40 step costs are the H200 fit scaled by the datasheet). Every value is
drawn on a grid that prints exactly (rates in 0.5 req/s, fractions in %, budgets in KiTokens), so a
setting met twice is one cell (its signature), skipped when fresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from repro.analysis.inverse_search.claims import Target

WORKERS = (1, 10)
RATE_HALVES = (8, 40)  # 4-20 req/s in 0.5 steps
OUTPUT_LEN = (4, 128)  # log scale
MEM_FRACTION_PCT = (50, 90, 5)
# Explicit per-worker budgets in units of 1024 tokens (log scale), per benchmark: from below the
# limited budgets of conf/config.yaml up to beyond the memory formula; the lower ends stay above each
# benchmark's longest request (ShareGPT and UltraChat cap a conversation at 16k tokens, LooGLE's
# documents reach ~36k), so no drawn budget is an invalid cell.
KV_KTOKENS = {"gsp": (8, 256), "sharegpt": (16, 256), "ultrachat": (16, 256), "loogle": (40, 512)}
GSP_GROUPS = (4, 256)  # log scale; prompts per group = ceil(num_queries / groups)
GSP_SYS_LO = (128, 4096)  # shortest system prompt (tokens, log scale)
GSP_SYS_SPAN_PCT = (100, 400, 25)  # longest = shortest x this / 100, at most GSP_SYS_MAX
GSP_SYS_MAX = 6144  # twice SGLang's 3072: a GSP request (+ 128 question, <= 128 output) fits 8k
GAMMA_PCT = (10, 99)
DECAY_INTERVAL_S = (0.01, 10.0)  # log scale, 3 significant digits
GENERATIONS = ("le_0_2_3", "v0_3_2", "smg_1_13")
SPEED_PCT = (50, 200, 5)  # hardware.speed_factor in %


@dataclass(frozen=True)
class Setting:
    """A trial's overrides: `common` for every cell, `per_system[policy]` for that system's cells."""

    common: tuple[str, ...]
    per_system: dict[str, tuple[str, ...]]

    def overrides(self, policy: str, seed: int) -> list[str]:
        return [*self.common, f"policy={policy}", *self.per_system[policy], f"seed={seed}"]


def router_of(policy: str) -> str:
    from hydra_plugins.repro_policies import policies

    return str(policies()[policy]["defaults"][0]["/router"])


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def suggest(trial: Any, target: Target, num_queries: int) -> Setting:
    """Draw one setting (define-by-run: a benchmark's own knobs only when it is drawn)."""
    wl = trial.suggest_categorical("workload", list(target.benchmarks))
    common = [
        f"workload={wl}",
        f"workload.num_queries={num_queries}",
        f"cluster.num_workers={trial.suggest_int('num_workers', *WORKERS)}",
        f"workload.request_rate={trial.suggest_int('request_rate_x2', *RATE_HALVES) / 2}",
        f"workload.output_len={trial.suggest_int('output_len', *OUTPUT_LEN, log=True)}",
        f"hardware.speed_factor={trial.suggest_int('speed_pct', SPEED_PCT[0], SPEED_PCT[1], step=SPEED_PCT[2]) / 100}",
    ]
    if trial.suggest_categorical("kv_mode", ["budget", "memory"]) == "budget":
        common.append(
            f"cluster.kv_cache_tokens={1024 * trial.suggest_int(f'kv_ktokens_{wl}', *KV_KTOKENS[wl], log=True)}"
        )
    else:
        lo, hi, step = MEM_FRACTION_PCT
        common += [
            "cluster.kv_cache_tokens=null",
            f"cluster.mem_fraction={trial.suggest_int('mem_fraction_pct', lo, hi, step=step) / 100}",
        ]
    if wl == "gsp":
        groups = trial.suggest_int("gsp_groups", *GSP_GROUPS, log=True)
        lo_tok = trial.suggest_int("gsp_sys_lo", *GSP_SYS_LO, log=True)
        span = trial.suggest_int("gsp_sys_span_pct", GSP_SYS_SPAN_PCT[0], GSP_SYS_SPAN_PCT[1], step=GSP_SYS_SPAN_PCT[2])
        common += [
            f"workload.num_groups={groups}",
            f"workload.prompts_per_group={math.ceil(num_queries / groups)}",
            f"workload.system_prompt_len_range=[{lo_tok},{min(round(lo_tok * span / 100), GSP_SYS_MAX)}]",
        ]
    common += list(target.fixed)
    per_system: dict[str, tuple[str, ...]] = {}
    for policy in (target.base, target.ours):
        router = router_of(policy)
        if router == "lbgr":
            per_system[policy] = (
                f"router.decay_factor={trial.suggest_int('lbgr_gamma_pct', *GAMMA_PCT) / 100}",
                f"router.decay_interval_s={_sig3(trial.suggest_float('lbgr_decay_interval_s', *DECAY_INTERVAL_S, log=True))}",
            )
        elif router == "cache_aware":
            per_system[policy] = (f"router.generation={trial.suggest_categorical('ca_generation', list(GENERATIONS))}",)
        else:
            per_system[policy] = ()
    return Setting(tuple(common), per_system)


def default_params(cfgs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of the setting the composed cell configs `cfgs` (policy -> its config, all
    at the paper's defaults) describe: enqueued as each study's first trial, so that every study
    starts from the cells of Figure 2 / 4 / Table 2 (the same signatures: a fresh twin in those
    experiments' folders is copied, not rerun)."""
    first = next(iter(cfgs.values()))
    wl, cl = first["workload"], first["cluster"]
    p: dict[str, Any] = {
        "workload": wl["name"],
        "num_workers": cl["num_workers"],
        "request_rate_x2": round(2 * float(wl["request_rate"])),
        "output_len": wl["output_len"],
        "speed_pct": round(100 * float(first["hardware"].get("speed_factor", 1.0))),
    }
    if cl.get("kv_cache_tokens") is not None:
        p.update({"kv_mode": "budget", f"kv_ktokens_{wl['name']}": int(cl["kv_cache_tokens"]) // 1024})
    else:
        p.update(kv_mode="memory", mem_fraction_pct=round(100 * float(cl["mem_fraction"])))
    if wl["name"] == "gsp":
        lo, hi = wl["system_prompt_len_range"]
        p.update(gsp_groups=wl["num_groups"], gsp_sys_lo=lo, gsp_sys_span_pct=round(100 * hi / lo))
    for cfg in cfgs.values():
        router = cfg["router"]
        if router["name"] == "lbgr":
            p.update(
                lbgr_gamma_pct=round(100 * router["decay_factor"]), lbgr_decay_interval_s=router["decay_interval_s"]
            )
        elif router["name"] == "cache_aware":
            p["ca_generation"] = router["generation"]
    return p
