"""The command lines of a cell's processes: SGLang servers (SGLang 0.5.23 flags), the real
sglang-router (0.3.2, or 0.1.4 for router.generation le_0_1_4), our emulated worker and our router
service. planning.plan_cell puts them into a plan.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from repro.backends.sglang.config import SGLANG_ROUTER_POLICIES, SGLANG_ROUTER_RELEASES
from repro.backends.sglang.errors import OrchestrationError


# Our eviction configs whose parameters are SGLang's own strategy keywords (passed through as
# --radix-eviction-policy-config); rlt's seed is set by the server from --random-seed instead.
SGLANG_STRATEGY_PARAMS = {"slru": ("protected_threshold",)}


def sglang_eviction_policy_config(eviction: Mapping[str, Any]) -> dict | None:
    """The --radix-eviction-policy-config of conf/eviction/<name>.yaml (None: SGLang's defaults)."""
    keys = SGLANG_STRATEGY_PARAMS.get(str(eviction.get("name")), ())
    out = {k: eviction[k] for k in keys if k in eviction}
    return out or None


def sglang_server_command(
    python: str,
    model_path: str,
    host: str,
    port: int,
    eviction_policy: str,
    scheduler: Mapping[str, Any],
    *,
    kv_cache_tokens: int | None,
    mem_fraction: float | None,
    tensor_parallel: int = 1,
    random_seed: int | None = None,
    load_format: str | None = None,
    dtype: str | None = None,
    enable_metrics: bool = False,
    extra_args: Sequence[str] = (),
    eviction_policy_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """`python -m repro.backends.sglang.server ...` with SGLang 0.5.23 server flags.

    KV budget: `--max-total-tokens` when the cell sets an explicit per-worker token budget
    (cluster.kv_cache_tokens), else `--mem-fraction-static` (SGLang's fraction of GPU memory for
    weights + KV pool: the same formula the simulator uses for its capacity).
    """
    cmd = [
        python,
        "-m",
        "repro.backends.sglang.server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--radix-eviction-policy",
        str(eviction_policy),
    ]
    if eviction_policy_config:  # SGLang's strategy keywords (slru's protected_threshold), as JSON
        cmd += ["--radix-eviction-policy-config", json.dumps(dict(eviction_policy_config), sort_keys=True)]
    if kv_cache_tokens is not None:
        cmd += ["--max-total-tokens", str(int(kv_cache_tokens))]
    if mem_fraction is not None:
        cmd += ["--mem-fraction-static", f"{float(mem_fraction):g}"]
    sched = dict(scheduler or {})
    if "schedule_policy" in sched:
        cmd += ["--schedule-policy", str(sched["schedule_policy"])]
    if sched.get("max_running_requests") is not None:  # None: the server sizes it from its pool
        cmd += ["--max-running-requests", str(int(sched["max_running_requests"]))]
    if "max_prefill_tokens" in sched:
        cmd += ["--max-prefill-tokens", str(int(sched["max_prefill_tokens"]))]
    if "chunked_prefill_size" in sched:
        c = sched["chunked_prefill_size"]
        cmd += ["--chunked-prefill-size", str(-1 if c is None or int(c) <= 0 else int(c))]
    if float(sched.get("schedule_conservativeness", 1.0)) != 1.0:  # 1.0: both versions' default
        cmd += ["--schedule-conservativeness", f"{float(sched['schedule_conservativeness']):g}"]
    if tensor_parallel > 1:
        cmd += ["--tp-size", str(int(tensor_parallel))]
    if random_seed is not None:
        cmd += ["--random-seed", str(int(random_seed))]
    if load_format and load_format != "auto":
        cmd += ["--load-format", str(load_format)]
    if dtype and dtype != "auto":
        cmd += ["--dtype", str(dtype)]
    if enable_metrics:  # meta_info.queue_time on every reply (protocol.py)
        cmd.append("--enable-metrics")
    return cmd + [str(a) for a in extra_args]


def server_preset_gaps(scheduler: Mapping[str, Any]) -> list[str]:
    """What a scheduler config (cluster.scheduler) asks of the servers that SGLang 0.5.23 has no flag
    for: the SGLang 0.4.6 preset's behaviours (conf/exp/shared/sglang_0_4_6.yaml) a live cell runs
    0.5.23's way instead. Empty for 0.5.23's own defaults. docs/ALGORITHMS.md §7 has each rule."""
    sched = dict(scheduler or {})
    gaps = []
    if sched.get("prefill_adder") == "sglang_0_4_6":
        gaps.append(
            "prefill_adder sglang_0_4_6: the servers admit with 0.5.23's PrefillAdder (outputs reserved in full, "
            "not x new_token_ratio; its own stop rules)"
        )
    if sched.get("evict_request") == "whole":
        gaps.append(
            "evict_request whole: 0.5.23 asks the radix tree for the shortfall, not a batch's whole allocation "
            "(RLT is asked for fewer tokens at once)"
        )
    if "max_running_requests" in sched and sched["max_running_requests"] is None:
        gaps.append(
            "max_running_requests null: no flag, so 0.5.23 sizes it from its own pool, not 0.4.6's "
            "min(pool // 2, request pool)"
        )
    return gaps


def sglang_router_release(router_cfg: Mapping[str, Any]) -> str:
    """The sglang-router release a router config runs as: "0.1.4" for a cache-aware router of
    generation le_0_1_4 (whatever its name, e.g. cache_aware_014), else "0.3.2" (a generation
    without a release is refused by validation, backend.py)."""
    return SGLANG_ROUTER_RELEASES.get(str(router_cfg.get("generation")), SGLANG_ROUTER_RELEASES["v0_3_2"])


def sglang_router_ready_path(router_cfg: Mapping[str, Any]) -> str:
    """0.3.2 answers /health before any worker is registered, so /readiness; 0.1.4 has no
    /readiness and binds only once every worker is healthy, so /health (forwarded to a worker)."""
    return "/health" if sglang_router_release(router_cfg) == "0.1.4" else "/readiness"


def _launch_router(python: str, host: str, port: int, worker_urls: Sequence[str]) -> list[str]:
    """The real sglang-router's launch, up to its `--policy` flag (0.1.4 and 0.3.2 alike)."""
    return [
        python,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
    ]


def sglang_router_014_command(
    python: str,
    host: str,
    port: int,
    worker_urls: Sequence[str],
    router_cfg: Mapping[str, Any],
    *,
    worker_startup_timeout_s: float,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m sglang_router.launch_router ...` with sglang-router 0.1.4's flags (its launcher has
    no request timeout, Prometheus or log-level flag; `--eviction-interval`, not `-secs`). The PyPI
    wheel routes every request on the empty key (docs/ALGORITHMS.md §3), which only
    `match_on: none` describes: any other routing key is refused rather than run unlike its config."""
    if router_cfg.get("match_on", "auto") != "none":
        raise OrchestrationError(
            f"router.match_on={router_cfg.get('match_on', 'auto')!r}: the sglang-router 0.1.4 wheel routes every "
            "request on the empty key (it compares the route name without its leading slash); set "
            "router.match_on=none to run it, or router_impl=ours for 0.1.4's rule on the request text"
        )
    return [
        *_launch_router(python, host, port, worker_urls),
        "cache_aware",
        "--cache-threshold",
        f"{float(router_cfg.get('cache_threshold', 0.5)):g}",
        "--balance-abs-threshold",
        str(int(router_cfg.get("balance_abs_threshold", 32))),
        "--balance-rel-threshold",
        f"{float(router_cfg.get('balance_rel_threshold', 1.0001)):g}",
        "--eviction-interval",
        str(int(router_cfg.get("eviction_interval_secs", 60))),
        "--max-tree-size",
        str(int(router_cfg.get("max_tree_size", 2**24))),
        "--worker-startup-timeout-secs",
        str(int(math.ceil(worker_startup_timeout_s))),
        "--worker-startup-check-interval",  # its default, 10 s, would delay the start by up to 10 s
        "1",
        *[str(a) for a in extra_args],
    ]


def sglang_router_command(
    python: str,
    host: str,
    port: int,
    worker_urls: Sequence[str],
    router_cfg: Mapping[str, Any],
    *,
    request_timeout_s: float,
    worker_startup_timeout_s: float,
    prometheus_port: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m sglang_router.launch_router ...` (sglang-router 0.3.2 flags) for the cell's router.

    cache_aware passes our config's thresholds (same names and defaults as the Rust router);
    match_on / worker_order / generation have no Rust counterpart (the real router matches the
    request text, or the ids as decimal strings, and its load ties follow its registry order).
    Its Prometheus endpoint (default 0.0.0.0:29000, where a second router on the node would
    collide and panic) goes to `prometheus_port` on `host`. A router of generation le_0_1_4 gets
    sglang-router 0.1.4's command instead (`sglang_router_014_command`; `python` must be its venv's).
    """
    if sglang_router_release(router_cfg) == "0.1.4":
        return sglang_router_014_command(
            python,
            host,
            port,
            worker_urls,
            router_cfg,
            worker_startup_timeout_s=worker_startup_timeout_s,
            extra_args=extra_args,
        )
    name = str(router_cfg.get("name"))
    if name not in SGLANG_ROUTER_POLICIES:
        raise OrchestrationError(
            f"router_impl=sglang_router supports routers {SGLANG_ROUTER_POLICIES}, not {name!r} (use router_impl=ours)"
        )
    cmd = [
        *_launch_router(python, host, port, worker_urls),
        name,
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(prometheus_port),
    ]
    if name == "cache_aware":
        cmd += [
            "--cache-threshold",
            f"{float(router_cfg.get('cache_threshold', 0.3)):g}",
            "--balance-abs-threshold",
            str(int(router_cfg.get("balance_abs_threshold", 64))),
            "--balance-rel-threshold",
            f"{float(router_cfg.get('balance_rel_threshold', 1.5)):g}",
            "--eviction-interval-secs",
            str(int(router_cfg.get("eviction_interval_secs", 60))),
            "--max-tree-size",
            str(int(router_cfg.get("max_tree_size", 2**26))),
        ]
    cmd += [
        "--request-timeout-secs",
        str(int(math.ceil(request_timeout_s))),
        "--worker-startup-timeout-secs",
        str(int(math.ceil(worker_startup_timeout_s))),
    ]
    return cmd + [str(a) for a in extra_args]


def emulated_worker_command(python: str, host: str, port: int, config_path: str) -> list[str]:
    return _service_command(python, "repro.backends.sglang.emulated_worker", host, port, config_path)


def router_service_command(python: str, host: str, port: int, config_path: str) -> list[str]:
    return _service_command(python, "repro.backends.sglang.router_service", host, port, config_path)


def _service_command(python: str, module: str, host: str, port: int, config_path: str) -> list[str]:
    """One of our own processes: `python -m module --config F --host H --port P`."""
    return [python, "-m", module, "--config", config_path, "--host", host, "--port", str(port)]
