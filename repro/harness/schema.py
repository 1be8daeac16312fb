"""Structured-config schemas (Hydra ConfigStore) for the top-level run config.

conf/config.yaml starts its defaults list with `optional schema@_global_: repro`, so every
composition that has imported this module (repro.run, the harness, tests) merges the YAML
into these dataclasses: a misspelt key in an experiment file (`cluster.num_worker`) or a
value of the wrong type (`cluster.num_workers=four`) fails while composing, before any cell
runs. `optional` keeps plain compositions of conf/ (other modules' tests) working without
the harness.

Strict where the contract fixes the keys (top level, cluster, scheduler, tracking); open
mappings where each group option has its own keys (model, hardware, workload, router,
eviction, backend) — their values are checked by repro.harness.validate and by the
components themselves. Value ranges (rate > 0, workers >= 1, ...) are checked in validate,
which also re-merges the final config into this schema to catch keys added with `+`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

SCHEMA_GROUP = "schema"
SCHEMA_NAME = "repro"


@dataclass
class SchedulerSchema:
    schedule_policy: str = "lpm"  # SGLang: lpm | fcfs
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = 8192  # null or -1: no chunking
    lpm_max_queue: int = 128  # lpm falls back to fcfs above this queue length (SGLang's constant)
    in_batch_prefix_caching: bool = True  # SGLang's in-batch prefix deprioritisation (repro/sim/worker.py)
    lpm_rank_access: str = "match"  # match | peek: lpm ranking touches recency like SGLang's match_prefix
    exact_budgets: bool = True  # SGLang's admission arithmetic and persistent queue order
    chunk_insertion: str = "per_chunk"  # per_chunk | whole: a prompt enters the tree as far as it is prefilled


@dataclass
class ClusterSchema:
    num_workers: int = 4
    mem_fraction: float = 0.9
    kv_cache_tokens: Optional[Any] = None  # tokens per worker: one int for all, or a list (one per worker)
    scheduler: SchedulerSchema = field(default_factory=SchedulerSchema)


@dataclass
class TrackingSchema:
    mode: str = "offline"  # offline | online | disabled
    project: str = "repro"
    entity: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    stream: Any = "auto"  # auto (sglang streams live, other backends' runs come from their files) | true | false
    max_points: int = 320  # time-series points per cell: max_points/2 .. max_points (repro.sim.StateSampler)
    progress_interval_s: float = 2.0  # wall-clock throttle for live progress points
    init_timeout_s: float = 60.0  # online mode: give up on W&B (and keep going) after this


@dataclass
class ReproSchema:
    seed: int = 0
    exp_name: str = "adhoc"
    results_dir: str = "results"
    n_jobs: Optional[int] = None  # local processes for the in-process grid; null = usable CPUs
    keep_stale: bool = False  # finished cells made by other code/data count as done (figures say so)
    policy_name: Optional[str] = None
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    model: Dict[str, Any] = field(default_factory=dict)
    hardware: Dict[str, Any] = field(default_factory=dict)
    workload: Dict[str, Any] = field(default_factory=dict)
    router: Dict[str, Any] = field(default_factory=dict)
    eviction: Dict[str, Any] = field(default_factory=dict)
    backend: Dict[str, Any] = field(default_factory=dict)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)
    theory: Optional[Dict[str, Any]] = None  # backend=theory: the cell's parameters
    limited_kv_cache_tokens: Dict[str, Optional[int]] = field(default_factory=dict)  # per workload (conf/config.yaml)
    local: Dict[str, Any] = field(default_factory=dict)  # per-site values (conf/local/), referenced by interpolation


def register_schemas() -> None:
    """Idempotent: store the schema as option `repro` of group `schema`; `${repro_root:}` = the project."""
    from pathlib import Path

    from omegaconf import OmegaConf

    ConfigStore.instance().store(group=SCHEMA_GROUP, name=SCHEMA_NAME, node=ReproSchema)
    root = str(Path(__file__).resolve().parents[2])
    OmegaConf.register_new_resolver("repro_root", lambda: root, replace=True)


register_schemas()
