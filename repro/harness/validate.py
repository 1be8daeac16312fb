"""Check every cell of a sweep before any of them runs.

Three layers, cheapest first, all on the resolved config of each cell:
1. schema: the config re-merged into repro.harness.schema.ReproSchema (catches keys added
   with `+` and wrong types that slipped past composition);
2. values: ranges and choices the contract fixes (workers >= 1, rate > 0, 0 < mem_fraction
   <= 1, known backend, scheduler policy, ...);
3. deep (`deep=True`): the backend's own checks (`validate_cell`), then, for serving backends,
   the cell's parts built by the cell assembly exactly as a run builds them, minus the run
   (repro.backends.assembly.check_cell: the router, its keys checked against its `_target_`'s
   constructor; the step-cost model; the per-worker KV capacities; a cache with the eviction
   policy; the workload with the cell's own seed, whose `max_request_tokens` must fit one
   worker's cache: "cache smaller than one request"). Each distinct sub-config is built once
   per sweep (assembly.Memo). A component that cannot be imported is an error of the cells
   that use it.

All problems of all cells are gathered into one ConfigError, grouped by message.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from repro.backends import UnknownBackendError, assembly, backend_module_path
from repro.backends.assembly import SchedulerConfig
from repro.confutil import get_path, is_int, is_number

ORDERS = ("random", "round_robin", "trace")  # trace: trace workloads only (mooncake; its spec checks)
TRACKING_MODES = ("offline", "online", "disabled")
NON_SERVING_BACKENDS = frozenset({"theory"})  # cells that ignore cluster/workload/router


class ConfigError(ValueError):
    """One clear message for everything wrong with a sweep; raised before any cell runs."""


# Folders of the checkout no output may go into: files under repro/ count as package data in every
# cell's fingerprint (all results would turn stale), conf/ and tests/ are read by composition and pytest.
SOURCE_FOLDERS = ("repro", "conf", "tests")


def output_dir_error(path: str | Path, what: str) -> str | None:
    """Why `path` cannot hold outputs (None: it can): the repository's root or a source folder of it."""
    from repro.confutil import PROJECT_ROOT

    root = PROJECT_ROOT.resolve()
    target = Path(path).expanduser().resolve()  # relative: to the cwd (results_dir comes absolute)
    if target == root and (root / "conf").is_dir():
        return f"{what} {str(path)!r} is the repository's root: name a folder of its own (default: results)"
    for name in SOURCE_FOLDERS if (root / "conf").is_dir() else ("repro",):
        if target == root / name or (root / name) in target.parents:
            return f"{what} {str(path)!r} lies inside the repository's {name}/: put outputs elsewhere"
    return None


@functools.lru_cache(maxsize=1)
def _schema_node():
    """ReproSchema as a config node, made once per process (about a fifth of a cell's validation)."""
    from omegaconf import OmegaConf

    from repro.harness.schema import ReproSchema

    return OmegaConf.structured(ReproSchema)


# In a resolved config a top-level key's check depends on its value alone, and a sweep repeats the
# same few values (one router, workload, ... per system, the same cluster in most cells). A
# mapping that passed once is merged as {} from then on, which leaves the merge's first error (if
# any) where it was; a cell whose every key and value passed before is not merged at all.
_passed: set[str] = set()


def schema_errors(cfg: Mapping) -> list[str]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    light, fresh = dict(cfg), []
    for k, v in cfg.items():
        key = f"{k}={v!r}"  # repr: exact types and keys (3 is not 3.0, 1 is not "1")
        if key not in _passed:
            fresh.append(key)
        elif isinstance(v, Mapping):
            light[k] = {}
    if not fresh:
        return []
    try:
        OmegaConf.merge(_schema_node(), light)  # merge copies its first argument: the cached node stays as is
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        key = getattr(exc, "full_key", None)
        return [f"{key}: {msg}" if key and key not in msg else msg]
    if len(_passed) < 4096:  # bounded: a process runs a few sweeps
        _passed.update(fresh)
    return []


def value_errors(cfg: Mapping) -> list[str]:
    """Range and choice checks of the contract's keys (cheap, no imports of components)."""
    errs: list[str] = []

    def need(cond: bool, msg: str) -> None:
        if not cond:
            errs.append(msg)

    seed = cfg.get("seed")
    need(is_int(seed) and seed >= 0, f"seed must be an integer >= 0 (got {seed!r})")
    n_jobs = cfg.get("n_jobs")
    need(n_jobs is None or (is_int(n_jobs) and n_jobs >= 1), f"n_jobs must be null or >= 1 (got {n_jobs!r})")
    exp_name = cfg.get("exp_name")
    need(
        isinstance(exp_name, str) and exp_name and "/" not in exp_name and not exp_name.startswith("."),
        f"exp_name must be a plain folder name (got {exp_name!r})",
    )
    results_dir = cfg.get("results_dir")
    need(
        isinstance(results_dir, str) and results_dir.strip() != "",  # empty would mean the project root
        f"results_dir must name a folder (got {results_dir!r}; default: results)",
    )
    if isinstance(results_dir, str) and results_dir.strip():
        from repro.harness.sweep import absolute_results_dir

        bad_dir = output_dir_error(absolute_results_dir(results_dir), "results_dir")
        need(bad_dir is None, str(bad_dir))
    mode = get_path(cfg, "tracking.mode")
    need(mode in TRACKING_MODES, f"tracking.mode must be one of {', '.join(TRACKING_MODES)} (got {mode!r})")
    stream, points = get_path(cfg, "tracking.stream"), get_path(cfg, "tracking.max_points")
    need(stream in ("auto", True, False, None), f"tracking.stream must be auto, true or false (got {stream!r})")
    need(points is None or (is_int(points) and points >= 4), f"tracking.max_points must be >= 4 (got {points!r})")

    backend = get_path(cfg, "backend.name")
    try:
        backend_module_path(str(backend)) if backend is not None else None
        need(backend is not None, "backend.name is missing (choose backend=sim|sglang|theory)")
    except UnknownBackendError as exc:
        errs.append(str(exc))
    if backend in NON_SERVING_BACKENDS:
        return errs

    workers = get_path(cfg, "cluster.num_workers")
    need(is_int(workers) and workers >= 1, f"cluster.num_workers must be an integer >= 1 (got {workers!r})")
    frac = get_path(cfg, "cluster.mem_fraction")
    need(is_number(frac) and 0 < frac <= 1, f"cluster.mem_fraction must be in (0, 1] (got {frac!r})")
    kv = get_path(cfg, "cluster.kv_cache_tokens")
    if isinstance(kv, list):
        need(
            all(is_int(v) and v >= 1 for v in kv) and (not is_int(workers) or len(kv) == workers),
            f"cluster.kv_cache_tokens as a list needs one integer >= 1 per worker ({workers}) (got {kv!r})",
        )
    else:
        need(kv is None or (is_int(kv) and kv >= 1), f"cluster.kv_cache_tokens must be null or >= 1 (got {kv!r})")
    sched = get_path(cfg, "cluster.scheduler")
    if sched is not None and not isinstance(sched, Mapping):
        errs.append(f"cluster.scheduler must be a mapping (got {sched!r})")
    else:  # unknown keys are the schema's to report
        errs.extend(
            SchedulerConfig.problems(
                {k: v for k, v in (sched or {}).items() if k in SchedulerConfig.__dataclass_fields__}
            )
        )

    wl = cfg.get("workload")
    if not isinstance(wl, Mapping) or not wl:
        errs.append("workload is missing (choose workload=gsp|sharegpt|ultrachat|loogle)")
    else:
        rate = wl.get("request_rate")
        if rate is not None:
            need(is_number(rate) and rate > 0, f"workload.request_rate must be > 0 req/s (got {rate!r})")
        nq = wl.get("num_queries")
        if nq is not None:
            need(is_int(nq) and nq >= 1, f"workload.num_queries must be an integer >= 1 (got {nq!r})")
        out = wl.get("output_len")
        if out is not None:
            need(is_int(out) and out >= 1, f"workload.output_len must be an integer >= 1 (got {out!r})")
        order = wl.get("order")
        if order is not None:
            need(order in ORDERS, f"workload.order must be one of {', '.join(ORDERS)} (got {order!r})")

    router = cfg.get("router")
    need(
        isinstance(router, Mapping) and bool(router.get("_target_")),
        "router is missing or has no _target_ (choose policy=<router>_<eviction>: conf/router/ x conf/eviction/)",
    )
    if backend == "sim":  # the eviction registry's check; sglang's validate_cell asks for its workers itself
        errs.extend(assembly.eviction_errors(cfg.get("eviction"), "sim"))
    if not errs:  # figures group cells by policy_name: it must name what runs
        from hydra_plugins.repro_policies import policy_name_errors

        errs.extend(policy_name_errors(cfg))
    return errs


_Memo = assembly.Memo  # the harness's name for it (batch.py, validate_configs)

# A dry run leaves workload pools that are not in the disk cache unbuilt (pools_unbuilt): the
# artifact GSP pool takes minutes on first use. Those cells' request-size check then waits for
# the run; their workload config is still checked.
_dry = {"on": False, "skipped": []}


@contextlib.contextmanager
def pools_unbuilt(out=None):
    """Inside: deep checks build no workload pool that is not cached; on leaving, say which."""
    _dry.update(on=True, skipped=[])
    try:
        yield
    finally:
        skipped = list(dict.fromkeys(_dry["skipped"]))
        _dry.update(on=False, skipped=[])
        if skipped:
            print(
                f"dry run: {len(skipped)} workload pool(s) not in the cache and not built: {', '.join(skipped)} "
                "(the first run builds and caches them, then checks every request fits a worker's cache)",
                file=out or sys.stderr,
            )


def _pool_state(workload: Mapping, seed: int) -> tuple[str, bool]:
    """(what the pool is called, whether the disk cache holds it) for a workload node and seed."""
    from repro.workloads import cache as wl_cache
    from repro.workloads.base import resolve_spec
    from repro.workloads.tokenizer import make_tokenizer

    spec = resolve_spec(workload)
    data_seed = spec.data_seed(seed)
    key = spec.pool_key(data_seed, make_tokenizer(spec.cfg["tokenizer"]), spec.resolve_data())
    label = f"{spec.name}{' (artifact)' if spec.is_artifact else ''} seed {data_seed}"
    return label, wl_cache.pool_path(spec.name, key).is_file()


class _PoolMemo(_Memo):
    """assembly.Memo that says when a check is about to build a workload pool (minutes for the
    artifact GSP) and, in a dry run, builds none that is not cached."""

    def get(self, kind, key_obj, build):
        if kind == "workload" and (kind, json.dumps(key_obj, sort_keys=True, default=str)) not in self._seen:
            try:
                label, cached = _pool_state(*key_obj)
            except Exception:  # a bad workload config: the build reports it
                label, cached = "", True
            if not cached and _dry["on"]:
                _dry["skipped"].append(label)
                return "ok", 0
            if not cached:
                print(f"building workload pool {label} (not in the cache; cached for later runs)", file=sys.stderr)
        return super().get(kind, key_obj, build)


def workload_seed(seed: int) -> int:
    """The seed the backends build the workload with, so that validation checks the very requests
    a cell will serve and leaves them in the workload disk cache for it."""
    return assembly.workload_seed(seed)


def deep_errors(cfg: Mapping, memo: _Memo | None = None) -> list[str]:
    """The backend's own checks, then the cell's parts built without running (module docstring)."""
    memo = memo or _PoolMemo()
    errs: list[str] = []
    backend = get_path(cfg, "backend.name")

    try:
        from repro.backends import get_backend

        be = get_backend(str(backend))
    except Exception as exc:
        return [str(exc)]
    if be.validate_cell is not None:
        status, value = memo.get("backend", [backend, cfg], lambda: list(be.validate_cell(cfg)))
        if status == "error":
            errs.append(f"backend {backend}: validate_cell failed: {value}")
        elif status == "ok":
            errs.extend(value)
    if backend in NON_SERVING_BACKENDS:
        return errs
    return errs + assembly.check_cell(cfg, memo)


def cell_errors(cfg: Mapping, *, deep: bool = True, memo: _Memo | None = None) -> list[str]:
    errs = schema_errors(cfg) + value_errors(cfg)
    if not errs and deep:
        errs = deep_errors(cfg, memo)
    return errs


def format_errors(problems: Mapping[str, Sequence[str]], n_cells: int, n_bad: int, limit: int = 20) -> str:
    """`problems`: message -> labels of the cells it affects."""
    lines = [f"invalid configuration: {n_bad} of {n_cells} cell(s); nothing was run."]
    for i, (msg, labels) in enumerate(problems.items()):
        if i == limit:
            lines.append(f"  ... and {len(problems) - limit} more problem(s)")
            break
        lines.append("  - " + msg.strip().replace("\n", "\n    "))
        shown = ", ".join(labels[:3])
        more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
        lines.append(f"      in cell {shown}{more}")
    return "\n".join(lines)


def validate_configs(labelled: Iterable[tuple[str, Mapping]], *, deep: bool = True) -> None:
    """Check (label, resolved config) pairs; raise one ConfigError listing every problem."""
    memo = _PoolMemo()
    problems: dict[str, list[str]] = {}
    n = bad = 0
    for label, cfg in labelled:
        n += 1
        errs = cell_errors(cfg, deep=deep, memo=memo)
        if errs:
            bad += 1
        for msg in dict.fromkeys(errs):
            problems.setdefault(msg, []).append(label)
    if problems:
        raise ConfigError(format_errors(problems, n, bad))
