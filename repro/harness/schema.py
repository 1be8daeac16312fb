"""Structured-config schemas (Hydra ConfigStore) for the top-level run config.

conf/config.yaml starts its defaults list with `optional schema@_global_: repro`, so every
composition that has imported this module (repro.run, the harness, tests) merges the YAML
into these dataclasses: a misspelt key in an experiment file (`cluster.num_worker`) or a
value of the wrong type (`cluster.num_workers=four`) fails while composing, before any cell
runs. `optional` keeps plain compositions of conf/ (other modules' tests) working without
the harness.

Strict where the contract fixes the keys (top level, cluster, scheduler, tracking); the
scheduler's fields and defaults are those of repro.sim.SchedulerConfig (defined once there). Open
mappings where each group option has its own keys (model, hardware, workload, router,
eviction, backend) — their values are checked by repro.harness.validate and by the
components themselves. Value ranges (rate > 0, workers >= 1, ...) are checked in validate,
which also re-merges the final config into this schema to catch keys added with `+`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from repro.backends.assembly import SchedulerConfig

SCHEMA_GROUP = "schema"
SCHEMA_NAME = "repro"


def _schema_of(cls: type, name: str) -> type:
    """A mutable structured-config twin of the frozen dataclass `cls`: same fields, types and
    defaults (so the defaults live once, in `cls`), without its checks (validate runs them)."""
    hints = typing.get_type_hints(cls)
    return make_dataclass(name, [(f.name, hints[f.name], field(default=f.default)) for f in fields(cls)])


# cluster.scheduler: the fields and defaults of repro.sim.SchedulerConfig (the one source)
SchedulerSchema = _schema_of(SchedulerConfig, "SchedulerSchema")


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
    reuse_twins: bool = True  # a cell finished in another experiment's folder is copied (repro.harness.cell)
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
    protocol: Dict[str, Any] = field(default_factory=dict)  # conf/protocol/ (text | artifact)
    ladder: Optional[Dict[str, Any]] = None  # conf/ladder/: gap_ladder's rung labels (not in the signature)
    limited_kv_cache_tokens: Dict[str, Optional[int]] = field(default_factory=dict)  # per workload (conf/config.yaml)
    local: Dict[str, Any] = field(default_factory=dict)  # per-site values (conf/local/), referenced by interpolation


def paper_systems(*extra: str, _root_: Any = None) -> str:
    """`${systems:a,b}`: the paper's six systems (conf/exp/shared/six_systems.yaml, the one list),
    each as the cell's protocol implements it (`protocol.systems`), followed by the policy options
    `extra`, as one sweep value (docs/EXTENDING.md)."""
    import re

    import yaml

    from repro.confutil import CONF_DIR

    six = str(yaml.safe_load((CONF_DIR / "exp" / "shared" / "six_systems.yaml").read_text())["policy"])
    systems = _root_.get("protocol", {}).get("systems") if _root_ is not None else None
    names = [
        str(systems[m.group(1)]) if systems and m.group(1) in systems else m.group(1)
        for m in re.finditer(r"\$\{protocol\.systems\.(\w+)\}", six)
    ]
    names += [str(e).strip() for e in extra]
    return ",".join(dict.fromkeys(n for n in names if n))


def register_schemas() -> None:
    """Idempotent: store the schema as option `repro` of group `schema`; `${repro_root:}` = the
    project; `${systems:...}` = the paper's six systems plus others (paper_systems)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    ConfigStore.instance().store(group=SCHEMA_GROUP, name=SCHEMA_NAME, node=ReproSchema)
    root = str(Path(__file__).resolve().parents[2])
    OmegaConf.register_new_resolver("repro_root", lambda: root, replace=True)
    OmegaConf.register_new_resolver("systems", paper_systems, replace=True)


register_schemas()
