"""The scheduler knobs of one simulated worker (`cluster.scheduler`): SGLang's server-arg names and defaults.

What each knob and SGLang-exact switch does: docs/ALGORITHMS.md §7 and the strategy modules
(schedule_policy, prefill_adder, chunked_prefill).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

SCHEDULE_POLICIES = ("lpm", "fcfs")
LPM_RANK_ACCESS = ("peek", "match")
CHUNK_INSERTION = ("whole", "per_chunk")
PREFILL_ADDERS = ("sglang_0_5_23", "sglang_0_4_6")
EVICT_REQUESTS = ("shortfall", "whole")
# SGLang 0.5.23 schedule_policy.IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD (env defaults)
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32
NO_CHUNK_LIMIT = sys.maxsize
# SGLang 0.4.6 global_config.py (env defaults): new_token_ratio starts at 0.7 x conservativeness, falls
# by (init - init x 0.14) / 600 per decode step to init x 0.14, back to init when the scheduler idles
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600.0
CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096  # schedule_policy.py: outputs are estimated at most this long


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler knobs of one worker (SGLang server-arg names and defaults): `cluster.scheduler`.

    The one place these defaults live: the config schema (repro.harness.schema) is derived from
    this class, and conf/config.yaml does not repeat them.
    """

    schedule_policy: str = "lpm"  # lpm (longest cached prefix first) | fcfs
    # null: from the KV pool as SGLang 0.4.6 sets it (tp_worker.py, model_runner.py; `running_limit`)
    max_running_requests: Optional[int] = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = 8192  # null / <= 0 (SGLang: -1): chunked prefill disabled
    lpm_max_queue: int = 128  # SGLang: lpm falls back to fcfs above this queue length
    # SGLang-exact switches (docs/ALGORITHMS.md; checked against SGLang's own scheduling code in
    # tests/sglang/test_sched_parity.py):
    in_batch_prefix_caching: bool = True  # (a) SGLang's in-batch prefix deprioritisation in lpm
    lpm_rank_access: str = "match"  # (d) lpm ranking accesses (stamps) every queued prefix; "peek": not
    exact_budgets: bool = True  # SGLang's admission arithmetic (prefill_adder.SglangPrefillAdder)
    # (c) "per_chunk": a prompt enters the tree as far as it is computed, after each prefill step
    # (SGLang's cache_unfinished_req); "whole": the whole prompt when its batch is formed
    chunk_insertion: str = "per_chunk"
    # Which SGLang's admission arithmetic `exact_budgets` follows (prefill_adder.py): sglang_0_5_23 |
    # sglang_0_4_6 (the authors' servers; needs chunk_insertion: per_chunk)
    prefill_adder: str = "sglang_0_5_23"
    # How much a batch that does not fit in the free KV asks the tree to evict: "shortfall" (0.5.23's
    # evict_to_free_tokens) | "whole" (the whole allocation: 0.4.6's alloc_token_slots)
    evict_request: str = "shortfall"
    schedule_conservativeness: float = 1.0  # sglang_0_4_6: scales new_token_ratio (SGLang's server arg)
    context_len: int = 131072  # the model's context length: max_running_requests: null sizes SGLang's request pool

    def __post_init__(self) -> None:
        problems = self.problems(self.__dict__)
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def problems(cls, values: Mapping[str, Any]) -> list[str]:
        """Every problem of a `cluster.scheduler` mapping (missing keys default), one message each."""
        errs: list[str] = []
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            errs.append(f"unknown cluster.scheduler keys {unknown}; known: {sorted(known)}")
        v = {f: values.get(f, cls.__dataclass_fields__[f].default) for f in known}

        def is_int(x: Any) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        def choice(name: str, allowed: Sequence[str]) -> None:
            if v[name] not in allowed:
                errs.append(f"cluster.scheduler.{name} must be one of {', '.join(allowed)} (got {v[name]!r})")

        choice("schedule_policy", SCHEDULE_POLICIES)
        for name in ("max_prefill_tokens", "lpm_max_queue"):
            if not is_int(v[name]) or v[name] < 1:
                errs.append(f"cluster.scheduler.{name} must be an integer >= 1 (got {v[name]!r})")
        c = v["chunked_prefill_size"]
        if not (c is None or is_int(c)):  # like SGLang, <= 0 (e.g. -1) turns chunking off
            errs.append(
                f"cluster.scheduler.chunked_prefill_size must be an integer, or null / <= 0 for no chunking (got {c!r})"
            )
        for name in ("in_batch_prefix_caching", "exact_budgets"):
            if not isinstance(v[name], bool):
                errs.append(f"cluster.scheduler.{name} must be true or false (got {v[name]!r})")
        choice("lpm_rank_access", LPM_RANK_ACCESS)
        choice("chunk_insertion", CHUNK_INSERTION)
        choice("prefill_adder", PREFILL_ADDERS)
        choice("evict_request", EVICT_REQUESTS)
        m = v["max_running_requests"]
        if m is not None and (not is_int(m) or m < 1):
            errs.append(f"cluster.scheduler.max_running_requests must be an integer >= 1 or null (got {m!r})")
        if not is_int(v["context_len"]) or v["context_len"] < 1:
            errs.append(f"cluster.scheduler.context_len must be an integer >= 1 (got {v['context_len']!r})")
        sc = v["schedule_conservativeness"]
        if isinstance(sc, bool) or not isinstance(sc, (int, float)) or not sc >= 0:
            errs.append(f"cluster.scheduler.schedule_conservativeness must be a number >= 0 (got {sc!r})")
        if v["prefill_adder"] == "sglang_0_4_6" and (
            v["exact_budgets"] is not True or v["chunk_insertion"] != "per_chunk"
        ):
            errs.append(
                "cluster.scheduler.prefill_adder: sglang_0_4_6 needs exact_budgets: true and chunk_insertion: per_chunk"
            )
        if v["chunk_insertion"] == "per_chunk" and v["exact_budgets"] is False:
            errs.append("cluster.scheduler.chunk_insertion: per_chunk needs cluster.scheduler.exact_budgets: true")
        return errs

    @property
    def chunk_limit(self) -> int:
        c = self.chunked_prefill_size
        return NO_CHUNK_LIMIT if c is None or c <= 0 else int(c)

    def running_limit(self, kv_pool_tokens: int) -> int:
        """max_running_requests of a worker with this KV pool; null: SGLang 0.4.6's rule, the smaller of
        pool // 2 (tp_worker.py) and its request pool, clamp(pool / context_len x 512, 2048, 4096) + 1
        (model_runner.py init_memory_pool)."""
        if self.max_running_requests is not None:
            return int(self.max_running_requests)
        reqs = min(max(int(kv_pool_tokens / self.context_len * 512), 2048), 4096)
        return max(1, min(kv_pool_tokens // 2, reqs + 1))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "SchedulerConfig":
        """From `cluster.scheduler` (a mapping); unknown keys are an error, missing ones default."""
        cfg = dict(cfg or {})
        problems = cls.problems(cfg)
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**cfg)
