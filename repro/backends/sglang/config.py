"""The live backend's configuration as types: every default of `backend=sglang` lives here once.

* One dataclass per section of conf/backend/sglang.yaml (`ServerSection`, `Timeouts`,
  `RouterServiceSection`, `SglangRouterSection`, `ClientSection`, `EmulatorSection`) and
  `BackendConfig` for the whole `backend:` mapping. `BackendConfig.from_mapping` fills what a
  mapping leaves out and rejects unknown keys; `backend_config_errors` names them (validate_cell).
* The JSON configs of the processes a cell starts, whose defaults come from those sections:
  `RouterServiceConfig` (router.json's `service`) and `EmulatorConfig` (worker<i>.json).

conf/backend/sglang.yaml spells the same values out for readers (and the run signature);
tests/live/test_live_config.py holds the two equal, so they cannot drift apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from repro.confutil import is_positive


ROUTER_IMPLS = ("ours", "sglang_router")  # backend.router_impl
SGLANG_ROUTER_POLICIES = ("cache_aware", "random", "round_robin")  # what sglang-router 0.3.2 runs
# router.generation of a cache-aware router -> the sglang-router release router_impl=sglang_router launches
SGLANG_ROUTER_RELEASES = {"v0_3_2": "0.3.2", "le_0_1_4": "0.1.4"}
PLACEMENTS = ("auto", "local")  # backend.placement


# ---------------------------------------------------------------------------- backend sections
@dataclass
class ServerSection:
    """`backend.server`: the SGLang servers (python -m repro.backends.sglang.server <flags>)."""

    model_path: str | None = None  # None: model.local_dir (`generate`: written by tiny_model.py), else model.hf_id
    python: str | None = None  # interpreter with SGLang (e.g. .venv-sglang/bin/python); None: backend.python
    load_format: str = "auto"  # auto: model.load_format when the model sets one (tiny_llama: dummy)
    dtype: str = "auto"
    random_seed: int | None = None  # None: worker i gets the simulator's eviction seed of worker i
    # --enable-metrics: SGLang puts its scheduler's queue time on each reply (meta_info.queue_time),
    # which the client records as queue_wait_s (and the summary's wait shares and regime use)
    enable_metrics: bool = True
    extra_args: list = field(default_factory=list)
    env: dict = field(default_factory=dict)


@dataclass
class Timeouts:
    """`backend.timeouts`, wall seconds. connect_s bounds opening a TCP connection (client ->
    router, router -> worker); a connect timeout marks the worker down at once and aborts its open
    streams, so it must not be tight for a busy worker whose accept queue is full."""

    server_start_s: float = 1200.0
    router_start_s: float = 60.0
    request_s: float = 600.0
    connect_s: float = 10.0
    cell_s: float = 14400.0
    shutdown_grace_s: float = 20.0


@dataclass
class RouterServiceSection:
    """`backend.router_service` (router_impl: ours); the knobs' meaning: router_service/__init__.py."""

    max_retries: int = 2
    health_check_interval_s: float = 1.0  # a frozen worker: down ~3 s after its first missed deadline (~5.4 s)
    health_check_timeout_s: float = 2.0  # /health is the HTTP process's (no generation): never slow when alive
    health_failure_threshold: int = 2
    startup_health_timeout_s: float = 10.0
    load_poll_interval_s: float = 0.0
    view_tracker: bool = True
    stall_timeout_s: float = 60.0
    stall_exclude: bool = True  # new requests avoid a worker whose in-flight requests stopped moving
    stall_exclude_floor_s: float = 2.0  # its silence limit: at least this, else factor x its own history
    stall_exclude_factor: float = 4.0
    max_body_bytes: int = 4 << 20
    client_timeout_s: float = 30.0  # a client connection idle, or sending its request, this long is closed


@dataclass
class SglangRouterSection:
    """`backend.sglang_router` (router_impl: sglang_router, the real Rust router)."""

    python: str | None = None  # None: backend.python
    # sglang-router 0.1.4 (router.generation le_0_1_4) ships the same module in its own venv (make router-env)
    python_014: str = ".venv-router014/bin/python"
    extra_args: list = field(default_factory=list)


@dataclass
class ClientSection:
    """`backend.client`: the streaming benchmark client."""

    send_reference_output: Any = "auto"  # auto: true when emulating
    send_text: bool = True


@dataclass
class EmulatorSection:
    """`backend.emulator` (emulate: true only)."""

    startup_delay_s: float = 0.0
    fault: Any = None  # test hooks only (FAULTS below)
    faults: dict = field(default_factory=dict)  # per worker index: fault


SECTIONS: dict[str, type] = {
    "server": ServerSection,
    "timeouts": Timeouts,
    "router_service": RouterServiceSection,
    "sglang_router": SglangRouterSection,
    "client": ClientSection,
    "emulator": EmulatorSection,
}


@dataclass
class BackendConfig:
    """The whole `backend:` mapping of a cell with backend=sglang."""

    name: str = "sglang"
    emulate: bool = False
    time_scale: float = 1.0  # emulate only: emulated seconds per wall second
    router_impl: str = "ours"
    host: str = "127.0.0.1"
    placement: str = "auto"
    gpus: list | None = None
    log_dir: str | None = None
    python: str | None = None
    server: ServerSection = field(default_factory=ServerSection)
    timeouts: Timeouts = field(default_factory=Timeouts)
    router_service: RouterServiceSection = field(default_factory=RouterServiceSection)
    sglang_router: SglangRouterSection = field(default_factory=SglangRouterSection)
    client: ClientSection = field(default_factory=ClientSection)
    emulator: EmulatorSection = field(default_factory=EmulatorSection)

    @classmethod
    def from_mapping(cls, backend: Mapping | None) -> "BackendConfig":
        """The typed config; keys left out get their defaults; ValueError names unknown keys."""
        errs = _key_errors(backend)
        if errs:
            raise ValueError("; ".join(errs))
        b = dict(backend or {})
        for name, section in SECTIONS.items():
            b[name] = section(**dict(b.get(name) or {}))
        return cls(**b)


BACKEND_KEYS = frozenset(f.name for f in fields(BackendConfig))
SECTION_KEYS = {name: frozenset(f.name for f in fields(section)) for name, section in SECTIONS.items()}


def _key_errors(b: Any) -> list[str]:
    if b is None:
        return []
    if not isinstance(b, Mapping):
        return [f"backend must be a mapping, got {type(b).__name__}"]
    errs = []
    unknown = sorted(set(b) - BACKEND_KEYS)
    if unknown:
        errs.append(f"backend: unknown keys {unknown} (known: {sorted(BACKEND_KEYS)})")
    for section, keys in SECTION_KEYS.items():
        sec = b.get(section)
        if sec is None:
            continue
        if not isinstance(sec, Mapping):
            errs.append(f"backend.{section} must be a mapping")
            continue
        bad = sorted(set(sec) - keys)
        if bad:
            errs.append(f"backend.{section}: unknown keys {bad} (known: {sorted(keys)})")
    return errs


def backend_config_errors(backend: Any) -> list[str]:
    """What is wrong with a cell's `backend:` mapping as to its shape: unknown keys, sections
    that are not mappings, timeouts that are not numbers > 0 (the value rules that involve the
    rest of the cell stay in backend.validate_cell)."""
    errs = _key_errors(backend)
    timeouts = backend.get("timeouts") if isinstance(backend, Mapping) else None
    if isinstance(timeouts, Mapping):
        for key in (f.name for f in fields(Timeouts)):
            v = timeouts.get(key)
            if v is not None and not is_positive(v):
                errs.append(f"backend.timeouts.{key} must be a number > 0, got {v!r}")
    return errs


HARDWARE_SERVER_KEYS = ("extra_args", "env", "uses_gpus")


def hardware_server(hardware: Mapping | None) -> dict:
    """The `server:` block of a hardware config: what servers on that hardware need (CPU flags and
    environment for hardware=cpu; nothing for GPUs). Keys: extra_args, env, uses_gpus (default true)."""
    block = dict((hardware or {}).get("server") or {})
    unknown = sorted(set(block) - set(HARDWARE_SERVER_KEYS))
    if unknown:
        raise ValueError(f"hardware.server: unknown keys {unknown} (known: {list(HARDWARE_SERVER_KEYS)})")
    return {
        "extra_args": list(block.get("extra_args") or []),
        "env": dict(block.get("env") or {}),
        "uses_gpus": bool(block.get("uses_gpus", True)),
    }


def resolve_python(path: str) -> str:
    """An interpreter path from the config: relative paths are taken from the project root."""
    import os
    from pathlib import Path

    from repro.confutil import PROJECT_ROOT

    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and os.sep in str(path):
        p = PROJECT_ROOT / p
    return str(p)


# ---------------------------------------------------------------------------- process configs
@dataclass(kw_only=True)
class RouterServiceConfig(RouterServiceSection):
    """The router service process's config (router.json `service`): the `router_service:`
    section plus what the orchestration fills in from the cell."""

    worker_urls: list[str]
    kv_capacity_tokens: list[int] | None = None  # per worker; None: ask each worker's /server_info
    eviction_policy: str = "lru"  # what the workers run (approximate trackers mirror it)
    view_tracker_granularity: str = "node"
    seed: int = 0  # the router's seed (the simulator's SeedPlan.router)
    time_scale: float = BackendConfig.time_scale
    request_timeout_s: float = Timeouts.request_s
    connect_timeout_s: float = Timeouts.connect_s
    tokenizer: dict | None = None  # the cell's workload.tokenizer (for text requests); None = the default

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise ValueError("router service: worker_urls is empty")
        for u in self.worker_urls:
            if not isinstance(u, str) or not u.startswith(("http://", "https://")):
                raise ValueError(f"router service: worker url {u!r} must start with http:// or https://")
        if self.kv_capacity_tokens is not None and len(self.kv_capacity_tokens) != len(self.worker_urls):
            raise ValueError(
                f"router service: {len(self.kv_capacity_tokens)} capacities for {len(self.worker_urls)} workers"
            )
        for name in (
            "time_scale",
            "request_timeout_s",
            "connect_timeout_s",
            "health_check_interval_s",
            "health_check_timeout_s",
            "startup_health_timeout_s",
            "stall_timeout_s",
            "client_timeout_s",
            "stall_exclude_floor_s",
            "stall_exclude_factor",
        ):
            v = getattr(self, name)
            if not is_positive(v):
                raise ValueError(f"router service: {name} must be a number > 0, got {v!r}")
        if not isinstance(self.stall_exclude, bool):
            raise ValueError(f"router service: stall_exclude must be true or false, got {self.stall_exclude!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"router service: max_retries must be an integer >= 0, got {self.max_retries!r}")
        if not isinstance(self.health_failure_threshold, int) or self.health_failure_threshold < 1:
            raise ValueError(
                f"router service: health_failure_threshold must be an integer >= 1, got {self.health_failure_threshold!r}"
            )
        if (
            isinstance(self.max_body_bytes, bool)
            or not isinstance(self.max_body_bytes, int)
            or self.max_body_bytes < 1024
        ):
            raise ValueError(f"router service: max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}")
        if not isinstance(self.load_poll_interval_s, (int, float)) or self.load_poll_interval_s < 0:
            raise ValueError(f"router service: load_poll_interval_s must be >= 0, got {self.load_poll_interval_s!r}")


FAULTS = ("malformed", "http500", "hang", "never_healthy")  # emulated-worker test hooks


@dataclass
class EmulatorConfig:
    """Everything one emulated worker needs (worker<i>.json, written by the orchestration)."""

    worker_id: int
    kv_capacity_tokens: int
    eviction: dict  # conf/eviction/<name>.yaml content ({"name": "rlt", "granularity": "node"})
    seed: int  # the eviction policy's seed (the simulator's SeedPlan.workers[i])
    model: dict  # conf/model/<m>.yaml
    hardware: dict  # conf/hardware/<g>.yaml
    scheduler: dict = field(default_factory=dict)  # cluster.scheduler (repro.sim SchedulerConfig keys)
    time_scale: float = BackendConfig.time_scale
    startup_delay_s: float = EmulatorSection.startup_delay_s  # /health answers 503 this long (wall seconds)
    fault: Any = EmulatorSection.fault  # test hooks, see repro/backends/sglang/emulated_worker.py
    tokenizer: dict | None = None  # the cell's workload.tokenizer (for text requests); None = the default
    enable_metrics: bool = ServerSection.enable_metrics  # as SGLang's flag: meta_info.queue_time on replies

    def __post_init__(self) -> None:
        if (
            isinstance(self.kv_capacity_tokens, bool)
            or not isinstance(self.kv_capacity_tokens, int)
            or (self.kv_capacity_tokens < 1)
        ):
            raise ValueError(f"kv_capacity_tokens must be a positive integer, got {self.kv_capacity_tokens!r}")
        if not (isinstance(self.time_scale, (int, float)) and math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale must be a finite number > 0, got {self.time_scale!r}")
        if not isinstance(self.eviction, dict) or not self.eviction.get("name"):
            raise ValueError(f"eviction must be a mapping with a 'name', got {self.eviction!r}")
        f = self.fault
        if (
            f is not None
            and f not in FAULTS
            and not (isinstance(f, dict) and set(f) == {"exit_after_requests"} and int(f["exit_after_requests"]) >= 1)
        ):
            raise ValueError(f"fault must be null, one of {FAULTS} or {{exit_after_requests: N}}, got {f!r}")

    @classmethod
    def from_json(cls, path: str) -> "EmulatorConfig":
        with open(path) as fh:
            data = json.load(fh)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown emulated-worker keys {unknown}; known: {sorted(known)}")
        return cls(**data)


__all__ = [
    "BACKEND_KEYS",
    "PLACEMENTS",
    "ROUTER_IMPLS",
    "SGLANG_ROUTER_POLICIES",
    "SGLANG_ROUTER_RELEASES",
    "BackendConfig",
    "ClientSection",
    "EmulatorConfig",
    "EmulatorSection",
    "FAULTS",
    "RouterServiceConfig",
    "RouterServiceSection",
    "SECTION_KEYS",
    "SECTIONS",
    "ServerSection",
    "SglangRouterSection",
    "Timeouts",
    "backend_config_errors",
    "hardware_server",
    "resolve_python",
]
