"""One grid cell's parts, built from its composed config: the one place every backend and the
validation put a cell together.

    plan = plan_cell(cfg)           # from the config alone: workers, seeds, KV capacities, scheduler
    cell = assemble(cfg)            # + step-cost model, workload (requests checked), caches, router
    cell = assemble(cfg, components=False)   # plan + workload only (the live backend: its workers
                                             # and router service build their own from the same config)
    cell_provenance(cfg, cell)      # the provenance every serving backend records
    check_cell(cfg, memo)           # validation: every part built without running, all problems

The part builders are public so that a process which builds only one part builds it exactly
as a cell does: `build_router(cfg.router)` (the router service), `kv_capacities(cfg, m)`,
`SeedPlan.spawn(seed, m)`, `build_caches(cfg, capacities, seeds)`.

Seeds (SeedPlan): one run seed spawns the workload's, the router's and each worker's eviction
seed; a backend hands the simulator (or its live processes) these plain ints. Requests are
checked against the capacities here (validate_requests), before any simulation or process
starts; the simulator trusts what it is given.

One config form: plain mappings, resolved once where a config comes in (`plan_cell`, `assemble`
take an OmegaConf node too and resolve it there); the part builders and the component packages
get plain mappings.

Component packages are looked up when a part is built (importlib), not at import time: the
backends' tests replace builders on those modules, validation's tests replace whole modules.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from repro.confutil import to_plain
from repro.sim.worker import SchedulerConfig

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

# hydra.utils.instantiate's own keys in a `_target_` node (not constructor arguments)
_INSTANTIATE_KEYS = frozenset({"_target_", "_recursive_", "_convert_", "_partial_", "_args_"})


# --------------------------------------------------------------------------- seeds, checks
@dataclass(frozen=True)
class SeedPlan:
    """Per-component seeds spawned from one run seed, in a fixed order.

    ``np.random.SeedSequence(seed).spawn(2 + M)``: child 0 -> workload, 1 -> router,
    2 + i -> worker i's eviction policy. A child's seed depends only on (seed, its index),
    so the workload and router seeds do not change with the number of workers, and nothing
    depends on the launcher or the process.
    """

    seed: int
    workload: int
    router: int
    workers: tuple[int, ...]

    @classmethod
    def spawn(cls, seed: int, num_workers: int) -> "SeedPlan":
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        kids = np.random.SeedSequence(int(seed)).spawn(2 + num_workers)
        ints = [int(k.generate_state(1, dtype=np.uint64)[0]) for k in kids]
        return cls(int(seed), ints[0], ints[1], tuple(ints[2:]))

    def as_dict(self) -> dict:
        """The provenance form: {workload, router, workers: [...]}."""
        return {"workload": self.workload, "router": self.router, "workers": list(self.workers)}


def workload_seed(seed: int) -> int:
    """The seed a cell builds its workload with (independent of the number of workers)."""
    return SeedPlan.spawn(seed, 1).workload


def validate_requests(requests: Sequence["Request"], capacities: Sequence[int]) -> None:
    """Clear errors before any work: ordering, lengths, and requests that can never fit."""
    if not requests:
        raise ValueError("the workload has no requests")
    if min(capacities) < 1:
        raise ValueError(f"KV capacities must be >= 1 token, got {list(capacities)}")
    cap = min(capacities)
    prev = -math.inf
    seen: set = set()
    for r in requests:
        a = float(r.arrival_s)
        if not math.isfinite(a) or a < prev:
            raise ValueError(f"request {r.id}: arrival_s {a} is not finite or not sorted (previous {prev})")
        prev = a
        if r.id in seen:
            raise ValueError(f"duplicate request id {r.id}")
        seen.add(r.id)
        plen = r.prompt_len
        if plen < 1 or r.output_len < 1:
            raise ValueError(f"request {r.id}: prompt ({plen}) and output ({r.output_len}) need >= 1 token")
        if plen + r.output_len > cap:
            raise ValueError(
                f"request {r.id} needs {plen} prompt + {r.output_len} output = {plen + r.output_len} KV tokens, "
                f"more than a worker's whole KV cache ({cap} tokens): raise cluster.kv_cache_tokens / "
                f"mem_fraction or shorten the workload"
            )


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _module(name: str) -> Any:
    return importlib.import_module(name)


# --------------------------------------------------------------------------- part builders
def num_workers(cfg: Mapping) -> int:
    return positive_int(cfg["cluster"]["num_workers"], "cluster.num_workers")


def scheduler_config(cfg: Mapping) -> SchedulerConfig:
    """cluster.scheduler -> SchedulerConfig (missing keys: its defaults; unknown keys: an error)."""
    return SchedulerConfig.from_config(cfg["cluster"].get("scheduler"))


def kv_capacities(cfg: Mapping, num_workers: int) -> list[int]:
    """Per-worker KV capacity in tokens: cluster.kv_cache_tokens if set, else the memory formula."""
    explicit = cfg["cluster"].get("kv_cache_tokens")
    if explicit is not None:
        if isinstance(explicit, (list, tuple)):
            if len(explicit) != num_workers:
                raise ValueError(f"cluster.kv_cache_tokens lists {len(explicit)} capacities for {num_workers} workers")
            return [positive_int(v, "cluster.kv_cache_tokens[i]") for v in explicit]
        return [positive_int(explicit, "cluster.kv_cache_tokens")] * num_workers
    frac = cfg["cluster"].get("mem_fraction")
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
        raise ValueError(f"cluster.mem_fraction must be in (0, 1], got {frac!r}")
    cap = _module("repro.costmodel").kv_capacity_tokens(cfg["model"], cfg["hardware"], float(frac))
    return [positive_int(cap, "kv_capacity_tokens(model, hardware, mem_fraction)")] * num_workers


def build_cost_model(cfg: Mapping) -> Any:
    """The step-cost model of conf/model + conf/hardware (repro.costmodel.StepCostModel)."""
    return _module("repro.costmodel").StepCostModel.from_config(cfg["model"], cfg["hardware"])


def build_workload(cfg: Mapping, seeds: SeedPlan) -> Any:
    """The cell's workload (repro.workloads.build_workload, memoised per process and on disk)."""
    return _module("repro.workloads").build_workload(cfg["workload"], seeds.workload)


def build_caches(cfg: Mapping, capacities: Sequence[int], seeds: SeedPlan) -> list:
    """One radix cache per worker, each with its own eviction seed."""
    make_cache = _module("repro.kvcache").make_cache
    eviction = cfg["eviction"]
    return [make_cache(cap, eviction, s) for cap, s in zip(capacities, seeds.workers)]


def eviction_errors(eviction_cfg: Mapping | None, backend: str = "sim") -> list[str]:
    """What is wrong with a conf/eviction node for `backend` ("sim": our RadixCache, emulated SGLang
    workers included; "sglang": the real server), from the eviction registry's own check."""
    if not isinstance(eviction_cfg, Mapping) or not (eviction_cfg.get("name") or eviction_cfg.get("_target_")):
        return [
            "eviction is missing or has no name (choose eviction=<name> from conf/eviction/, or policy=<router>_<eviction>)"
        ]
    return _module("repro.kvcache").check_eviction_config(to_plain(eviction_cfg), backend)


def router_errors(router_cfg: Mapping | None) -> list[str]:
    """What is wrong with a conf/router node before building it: no `_target_`, a target that
    cannot be imported, keys its constructor does not take. Messages name no router (callers do)."""
    if not isinstance(router_cfg, Mapping) or not router_cfg.get("_target_"):
        return [
            "router is missing or has no _target_ (choose router=<name> from conf/router/, or policy=<router>_<eviction>)"
        ]
    from hydra.utils import get_object

    target = str(router_cfg["_target_"])
    try:
        obj = get_object(target)
    except Exception as exc:
        return [f"cannot import its _target_ {target!r}: {type(exc).__name__}: {exc}"]
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: instantiate judges
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(router_cfg) - _INSTANTIATE_KEYS - takes)
    if unknown:
        return [f"unknown keys {unknown}: {getattr(obj, '__name__', target)} takes {sorted(takes)}"]
    return []


def build_router(router_cfg: Mapping) -> Any:
    """The router of a conf/router/<name>.yaml node (hydra.utils.instantiate of its `_target_`),
    its keys checked against the target's constructor first: the one place routers are built."""
    import hydra.utils

    errs = router_errors(router_cfg)
    if errs:
        target = router_cfg.get("_target_") if isinstance(router_cfg, Mapping) else None
        raise ValueError(f"router ({target}): " + "; ".join(errs))
    return hydra.utils.instantiate(router_cfg)


# --------------------------------------------------------------------------- a whole cell
@dataclass(frozen=True)
class CellPlan:
    """What a cell is, decided from its config alone (no component built)."""

    num_workers: int
    seeds: SeedPlan
    capacities: tuple[int, ...]  # KV tokens per worker
    scheduler: SchedulerConfig
    eviction_name: str


@dataclass
class Cell:
    """A cell's parts. Without components (assemble(..., components=False)) the cost model,
    caches and router are None: whoever serves the requests builds them."""

    plan: CellPlan
    workload: Any
    cost_model: Any = None
    caches: list = field(default_factory=list)
    router: Any = None

    @property
    def requests(self) -> list:
        return self.workload.requests


def plan_cell(cfg: Mapping) -> CellPlan:
    """Everything checkable from the config alone, in order; ValueError on the first problem."""
    cfg = to_plain(cfg)
    m = num_workers(cfg)
    scheduler = scheduler_config(cfg)
    seeds = SeedPlan.spawn(cfg["seed"], m)
    eviction_name = (cfg.get("eviction") or {}).get("name")
    if not eviction_name:
        raise ValueError("eviction.name is not set")
    return CellPlan(m, seeds, tuple(kv_capacities(cfg, m)), scheduler, str(eviction_name))


def assemble(cfg: Mapping, *, components: bool = True, wrap_router: Callable[[Any], Any] | None = None) -> Cell:
    """Build the cell `cfg` (a composed config): plan, step-cost model, workload (its requests
    checked against the capacities before anything else is built from it), caches, router.

    `wrap_router(router)` may return a wrapper the cell routes through instead (diagnostics
    record every decision this way).
    """
    cfg = to_plain(cfg)
    plan = plan_cell(cfg)
    cost_model = build_cost_model(cfg) if components else None
    workload = build_workload(cfg, plan.seeds)
    validate_requests(workload.requests, plan.capacities)
    cell = Cell(plan, workload, cost_model)
    if components:
        cell.caches = build_caches(cfg, plan.capacities, plan.seeds)
        router = build_router(cfg["router"])
        cell.router = wrap_router(router) if wrap_router is not None else router
    return cell


def cell_provenance(cfg: Mapping, cell: Cell) -> dict:
    """The provenance keys every serving backend records (it adds its own around them)."""
    plan = cell.plan
    return {
        "model": cfg["model"].get("name"),
        "gpu": cfg["hardware"].get("name"),
        "workload": to_plain(getattr(cell.workload, "provenance", {})),
        "seed": plan.seeds.seed,
        "seeds": plan.seeds.as_dict(),
        "num_workers": plan.num_workers,
        "kv_capacity_tokens": list(plan.capacities),
        "scheduler": asdict(plan.scheduler),
        "router": cfg.get("router"),
        "eviction": cfg.get("eviction"),
    }


def versions() -> dict:
    """Library versions every backend records."""
    import repro
    from repro.results.fingerprint import PYTHON_VERSION

    return {"repro": repro.__version__, "python": PYTHON_VERSION, "numpy": np.__version__}


# --------------------------------------------------------------------------- validation
class Memo:
    """Build each distinct part once across the cells of a sweep: (kind, sub-config) -> outcome."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], Any] = {}

    def get(self, kind: str, key_obj: Any, build: Callable[[], Any]) -> tuple[str, Any]:
        """("ok", value) or ("error", "ExcType: message"); `build` runs once per distinct key."""
        key = (kind, json.dumps(key_obj, sort_keys=True, default=str))
        if key not in self._seen:
            try:
                self._seen[key] = ("ok", build())
            except Exception as exc:  # reported as the cell's error
                self._seen[key] = ("error", f"{type(exc).__name__}: {exc}")
        return self._seen[key]


def check_cell(cfg: Mapping, memo: Memo | None = None) -> list[str]:
    """Build a serving cell's parts as `assemble` does, without running them; every problem.

    `cfg`: a plain resolved config whose values already passed the cheap checks (harness
    validate). Each distinct part (router, cost model, capacities, eviction, workload) is
    built once per `memo`; the workload is built with the cell's own seed, so the requests
    checked are the ones it will serve (and the workload caches keep them for it).
    """
    memo = memo or Memo()
    errs: list[str] = []
    router = cfg["router"]

    def router_check() -> list[str]:
        found = router_errors(router)
        if not found:
            build_router(router)
        return found

    status, value = memo.get("router", router, router_check)
    for problem in [value] if status == "error" else value:
        errs.append(f"router ({router.get('_target_')}): cannot be built: {problem}")

    model, hardware = cfg.get("model") or {}, cfg.get("hardware") or {}
    status, value = memo.get("costmodel", [model, hardware], lambda: build_cost_model(cfg))
    if status == "error":
        errs.append(f"model/hardware: cannot build the step-cost model: {value}")

    cluster = cfg["cluster"]
    kv, frac, m = cluster.get("kv_cache_tokens"), cluster.get("mem_fraction"), cluster.get("num_workers")
    status, caps = memo.get("capacity", [model, hardware, frac, kv, m], lambda: kv_capacities(cfg, m))
    cap = None
    if status == "error":
        errs.append(f"KV capacity (model {model.get('name')}, {hardware.get('name')}, mem_fraction {frac}): {caps}")
    else:
        cap = min(caps)  # the smallest worker's cache: every request must fit each worker

    seeds = SeedPlan.spawn(cfg["seed"], 1)
    eviction = cfg["eviction"]
    status, value = memo.get("eviction", eviction, lambda: build_caches(cfg, [max(int(cap or 0), 1024)], seeds))
    if status == "error":
        errs.append(f"eviction {dict(eviction)}: {value}")

    workload = cfg["workload"]
    status, longest = memo.get(
        "workload", [workload, seeds.workload], lambda: int(build_workload(cfg, seeds).max_request_tokens)
    )
    if status == "error":
        errs.append(f"workload {workload.get('name')}: {longest}")
    elif cap is not None and longest > cap:
        errs.append(
            f"cache smaller than one request: a worker holds {cap} KV tokens but the longest request of "
            f"workload {workload.get('name')} needs {longest} (prompt + output); raise "
            f"cluster.kv_cache_tokens / cluster.mem_fraction or shorten the workload"
        )
    return errs


__all__ = [
    "Cell",
    "CellPlan",
    "Memo",
    "SeedPlan",
    "assemble",
    "build_caches",
    "build_cost_model",
    "build_router",
    "build_workload",
    "cell_provenance",
    "check_cell",
    "kv_capacities",
    "num_workers",
    "plan_cell",
    "positive_int",
    "router_errors",
    "scheduler_config",
    "validate_requests",
    "versions",
    "workload_seed",
]
