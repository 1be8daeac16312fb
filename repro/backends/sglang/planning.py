"""Planning one cell: every command, port, environment and config file, before anything starts.

    plan = plan_cell(cfg, capacities, seeds, log_dir)     # no side effects (ports are picked free)

The commands: SGLang servers (`python -m repro.backends.sglang.server ...`, SGLang 0.5.23 flags)
or emulated workers, and our router service or the real sglang-router 0.3.2. Defaults of every
backend key: config.py. Running the plan: orchestrate.run_plan (processes.py starts and stops).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from repro.backends.sglang.config import (
    PLACEMENTS,
    ROUTER_IMPLS,
    SGLANG_ROUTER_POLICIES,
    BackendConfig,
    hardware_server,
    resolve_python,
)
from repro.backends.sglang.commands import (
    emulated_worker_command,
    router_service_command,
    sglang_router_command,
    sglang_router_ready_path,
    sglang_router_release,
    sglang_eviction_policy_config,
    sglang_server_command,
)
from repro.backends.sglang.errors import CellTimeoutError, OrchestrationError, ServerStartError
from repro.backends.sglang.ports import pick_free_ports
from repro.confutil import to_plain


# ---------------------------------------------------------------------------- planning
@dataclass
class ProcessSpec:
    name: str
    cmd: list[str]
    env: dict[str, str]  # added to the inherited environment
    log_path: str
    health_url: str
    config_path: str | None = None
    config: dict | None = None  # written to config_path before the start
    node: str | None = None  # None: this node; else started there by a node agent (node_agent.py)
    gpus: int = 0  # GPUs a remote server takes from its node's step (tensor_parallel)


@dataclass
class CellPlan:
    workers: list[ProcessSpec]
    router: ProcessSpec
    router_url: str
    worker_urls: list[str]
    log_dir: str
    emulate: bool
    router_impl: str
    time_scale: float
    timeouts: dict
    client: dict  # ClientConfig keys
    gpus: list[list[str]] = field(default_factory=list)
    nodes: list = field(default_factory=list)  # node_agent.Node of the job, this node first; [] = one node
    local_ports: list[int] = field(default_factory=list)  # this node's servers and router: agents avoid them

    def remote_nodes(self) -> dict[str, list[ProcessSpec]]:
        out: dict[str, list[ProcessSpec]] = {}
        for w in self.workers:
            if w.node is not None:
                out.setdefault(w.node, []).append(w)
        return out

    def bind_urls(self, urls: Mapping[str, str]) -> None:
        """Put the discovered addresses of remote servers (placeholder -> URL) into the plan."""
        self.worker_urls = [urls.get(u, u) for u in self.worker_urls]
        self.router.cmd = [urls.get(a, a) for a in self.router.cmd]
        if self.router.config is not None and "service" in self.router.config:
            self.router.config["service"]["worker_urls"] = list(self.worker_urls)

    def move_router(self, port: int, prometheus_port: int | None = None) -> None:
        """Give the router another port (and the real router another metrics port): its first one was
        taken before it could bind. Nobody has been told the router's URL yet: only the client uses it."""
        old = urlsplit(self.router_url).port
        self.router.cmd = _with_flag(self.router.cmd, "--port", port)
        if prometheus_port is not None and "--prometheus-port" in self.router.cmd:
            self.router.cmd = _with_flag(self.router.cmd, "--prometheus-port", prometheus_port)
        self.router_url = _with_port(self.router_url, port)
        self.router.health_url = _with_port(self.router.health_url, port)
        self.local_ports = [port if p == old else p for p in self.local_ports]

    def describe(self) -> dict:
        def proc(p: ProcessSpec) -> dict:
            return {
                "name": p.name,
                "cmd": shlex.join(p.cmd),
                "env": p.env,
                "log": p.log_path,
                "health_url": p.health_url,
                "config": p.config_path,
            }

        return {
            "emulate": self.emulate,
            "router_impl": self.router_impl,
            "time_scale": self.time_scale,
            "router_url": self.router_url,
            "worker_urls": self.worker_urls,
            "gpus": self.gpus,
            "timeouts": self.timeouts,
            "client": self.client,
            "nodes": [[n.name, n.addr] for n in self.nodes],
            "workers": [
                {**proc(p), "node": p.node or (self.nodes[0].name if self.nodes else None)} for p in self.workers
            ],
            "router": proc(self.router),
        }


def _with_flag(cmd: Sequence[str], flag: str, value: Any) -> list[str]:
    out = list(cmd)
    out[out.index(flag) + 1] = str(value)
    return out


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports free on host, from below the ephemeral range (ports.py says why)."""
    return pick_free_ports(n, host)


def assign_gpus(num_workers: int, tensor_parallel: int, gpus: Sequence[Any] | None) -> list[list[str]]:
    """GPU ids per worker: `gpus` if given, else CUDA_VISIBLE_DEVICES of the job, else 0..M*tp-1."""
    if gpus is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        pool = (
            [g.strip() for g in env.split(",") if g.strip()]
            if env
            else [str(i) for i in range(num_workers * tensor_parallel)]
        )
    else:
        pool = [str(g) for g in gpus]
    need = num_workers * tensor_parallel
    if len(pool) < need:
        raise OrchestrationError(
            f"the cell needs {num_workers} workers x tensor_parallel {tensor_parallel} = {need} GPUs, "
            f"but only {len(pool)} are available ({','.join(pool) or 'none'}; set backend.gpus or "
            f"CUDA_VISIBLE_DEVICES)"
        )
    return [pool[i * tensor_parallel : (i + 1) * tensor_parallel] for i in range(num_workers)]


def plan_cell(
    cfg: Any, capacities: Sequence[int], seeds: Any, log_dir: str | os.PathLike, ports: Sequence[int] | None = None
) -> CellPlan:
    """Every command, port, environment and config file of one cell (nothing started yet).

    `cfg` is the composed cell config (DictConfig or mapping), `capacities` the per-worker KV
    budgets (repro.backends.assembly.kv_capacities), `seeds` the cell's repro.backends.assembly.SeedPlan.
    `ports`: M + 1 ports (workers, then router); default: free ports now.
    """
    cfg = to_plain(cfg)
    try:
        b = BackendConfig.from_mapping(cfg["backend"])
    except ValueError as exc:
        raise OrchestrationError(str(exc)) from None
    m = int(cfg["cluster"]["num_workers"])
    host = str(b.host or BackendConfig.host)
    emulate = bool(b.emulate)
    time_scale = float(b.time_scale) if emulate else 1.0
    if b.router_impl not in ROUTER_IMPLS:
        raise OrchestrationError(f"backend.router_impl must be one of {ROUTER_IMPLS}, got {b.router_impl!r}")
    python = str(b.python or sys.executable)
    timeouts = {k: float(v) for k, v in asdict(b.timeouts).items()}
    log_dir = str(Path(log_dir).resolve())
    from repro.backends.sglang.node_agent import PORT_PLACEHOLDER, PlacementError, job_nodes, split_workers

    if b.placement not in PLACEMENTS:
        raise OrchestrationError(f"backend.placement must be auto or local, got {b.placement!r}")
    try:
        nodes = (job_nodes() or []) if b.placement == "auto" else []
    except PlacementError as exc:
        raise OrchestrationError(
            f"cannot place the cell on the nodes of Slurm job {os.environ.get('SLURM_JOB_ID')}: "
            f"{exc} (backend.placement=local keeps every server on this node)"
        ) from None
    node_of = split_workers(m, nodes) if nodes else [0] * m
    ports = list(ports) if ports is not None else free_ports(m + 1, host)
    if len(ports) != m + 1:
        raise OrchestrationError(f"need {m + 1} ports, got {len(ports)}")
    # a remote server's URL is a placeholder until its node agent reports the port it got
    worker_urls = [f"http://{host}:{p}" if node_of[i] == 0 else f"{{url:worker{i}}}" for i, p in enumerate(ports[:m])]

    def where(i: int) -> tuple[str, str | int, str | None]:  # (bind host, port, remote node name)
        if node_of[i] == 0:
            return host, ports[i], None
        return nodes[node_of[i]].addr, PORT_PLACEHOLDER, nodes[node_of[i]].name

    router_port = ports[m]
    tokenizer = dict((cfg.get("workload") or {}).get("tokenizer") or {}) or None  # text requests: as the workload
    gpus: list[list[str]] = []
    if emulate:
        workers = _emulated_workers(
            cfg, b, capacities, seeds, log_dir, worker_urls, where, python, time_scale, tokenizer
        )
    else:
        n_local = node_of.count(0)
        tp = int(cfg["model"].get("tensor_parallel", 1) or 1)
        hw_server = hardware_server(cfg.get("hardware"))
        gpus = (assign_gpus(n_local, tp, b.gpus) if hw_server["uses_gpus"] else [[] for _ in range(n_local)]) + [
            [] for _ in range(m - n_local)
        ]
        workers = _sglang_servers(cfg, b, hw_server, capacities, seeds, log_dir, worker_urls, where, python, gpus)

    router_url = f"http://{host}:{router_port}"
    if b.router_impl == "ours":
        path = os.path.join(log_dir, "router.json")
        service = {
            "worker_urls": worker_urls,
            "kv_capacity_tokens": [int(c) for c in capacities],
            "eviction_policy": str(cfg["eviction"]["name"]),
            "view_tracker_granularity": str(cfg["eviction"].get("granularity", "node")),
            "seed": int(seeds.router),
            "time_scale": time_scale,
            "request_timeout_s": timeouts["request_s"],
            "connect_timeout_s": timeouts["connect_s"],
            "tokenizer": tokenizer,
            **asdict(b.router_service),
        }
        config = {"router": cfg["router"], "model": cfg["model"], "hardware": cfg["hardware"], "service": service}
        router = ProcessSpec(
            "router",
            router_service_command(python, host, router_port, path),
            {},
            os.path.join(log_dir, "router.log"),
            f"{router_url}/health",
            path,
            config,
        )
    else:
        sr = b.sglang_router
        prometheus_port = next(p for p in free_ports(m + 2, host) if p not in ports)
        if sglang_router_release(cfg["router"]) == "0.1.4":
            router_python = resolve_python(sr.python_014)
        else:
            router_python = resolve_python(sr.python) if sr.python else python
        cmd = sglang_router_command(
            router_python,
            host,
            router_port,
            worker_urls,
            cfg["router"],
            request_timeout_s=timeouts["request_s"],
            worker_startup_timeout_s=timeouts["router_start_s"],
            prometheus_port=prometheus_port,
            extra_args=list(sr.extra_args or []),
        )
        # 0.3.2: /readiness, not /health (it answers /health before any worker is registered); 0.1.4: /health
        ready = f"{router_url}{sglang_router_ready_path(cfg['router'])}"
        router = ProcessSpec("sglang_router", cmd, {}, os.path.join(log_dir, "router.log"), ready)

    send_ref = b.client.send_reference_output
    client_cfg = {
        "time_scale": time_scale,
        "request_timeout_s": timeouts["request_s"],
        "connect_timeout_s": timeouts["connect_s"],
        "send_reference_output": emulate if send_ref == "auto" else bool(send_ref),
        "send_text": bool(b.client.send_text),
    }
    if str((cfg.get("protocol") or {}).get("name", "text")) == "artifact":
        client_cfg["send_ids"] = False  # their clients send the prompt as text (bench_serving, long.py, multi-turn.py)
    local_ports = [ports[i] for i in range(m) if node_of[i] == 0] + [router_port]
    return CellPlan(
        workers,
        router,
        router_url,
        worker_urls,
        log_dir,
        emulate,
        b.router_impl,
        time_scale,
        timeouts,
        client_cfg,
        gpus,
        nodes,
        local_ports,
    )


def _local_model_path(model: Mapping) -> str | None:
    from repro.backends.sglang.tiny_model import ModelDirError, model_path

    try:
        return model_path(model)
    except ModelDirError as exc:
        raise OrchestrationError(f"model {model.get('name')!r}: {exc}") from None


def _emulated_workers(
    cfg: dict,
    b: BackendConfig,
    capacities,
    seeds,
    log_dir: str,
    worker_urls: list[str],
    where,
    python: str,
    time_scale: float,
    tokenizer: dict | None,
) -> list[ProcessSpec]:
    """One emulated worker per index, each with its worker<i>.json (EmulatorConfig keys)."""
    emu = b.emulator
    faults = {int(k): v for k, v in (emu.faults or {}).items()}
    workers = []
    for i in range(len(worker_urls)):
        path = os.path.join(log_dir, f"worker{i}.json")
        config = {
            "worker_id": i,
            "kv_capacity_tokens": int(capacities[i]),
            "eviction": dict(cfg["eviction"]),
            "seed": int(seeds.workers[i]),
            "model": cfg["model"],
            "hardware": cfg["hardware"],
            "scheduler": dict(cfg["cluster"].get("scheduler") or {}),
            "time_scale": time_scale,
            "startup_delay_s": float(emu.startup_delay_s or 0.0),
            "fault": faults.get(i, emu.fault),
            "tokenizer": tokenizer,
            "enable_metrics": bool(b.server.enable_metrics),  # the server flag the emulator stands in for
        }
        h, port, node = where(i)
        workers.append(
            ProcessSpec(
                f"worker{i}",
                emulated_worker_command(python, h, port, path),
                {},
                os.path.join(log_dir, f"worker{i}.log"),
                f"{worker_urls[i]}/health",
                path,
                config,
                node=node,
            )
        )
    return workers


def _sglang_servers(
    cfg: dict,
    b: BackendConfig,
    hw_server: dict,
    capacities,
    seeds,
    log_dir: str,
    worker_urls: list[str],
    where,
    python: str,
    gpus: list[list[str]],
) -> list[ProcessSpec]:
    """One SGLang server per index (GPU ids of this node's servers: `gpus`)."""
    srv = b.server
    cluster = cfg["cluster"]
    model = cfg["model"]
    tp = int(model.get("tensor_parallel", 1) or 1)
    model_path = srv.model_path or _local_model_path(model) or model.get("hf_id")
    if not model_path:
        raise OrchestrationError(
            "backend.server.model_path is not set and the model config has neither local_dir nor hf_id"
        )
    load_format = srv.load_format if srv.load_format not in (None, "auto") else model.get("load_format", "auto")
    server_python = resolve_python(srv.python) if srv.python else python
    explicit = cluster.get("kv_cache_tokens")
    workers = []
    for i in range(len(worker_urls)):
        h, port, node = where(i)
        cmd = sglang_server_command(
            server_python,
            model_path,
            h,
            port,
            cfg["eviction"]["name"],
            dict(cluster.get("scheduler") or {}),
            kv_cache_tokens=int(capacities[i]) if explicit is not None else None,
            mem_fraction=None if explicit is not None else float(cluster["mem_fraction"]),
            tensor_parallel=tp,
            # The server seeds RLT with --random-seed: worker i gets the simulator's eviction
            # seed of worker i (SeedPlan.workers[i], folded into SGLang's int range).
            random_seed=int(seeds.workers[i]) % (2**31 - 1) if srv.random_seed is None else int(srv.random_seed),
            load_format=load_format,
            dtype=srv.dtype,
            enable_metrics=bool(srv.enable_metrics),
            extra_args=[str(a) for a in hw_server["extra_args"]] + list(srv.extra_args or []),
            eviction_policy_config=sglang_eviction_policy_config(cfg["eviction"]),
        )
        # /health answers from the server's state instead of running a 1-token generation
        # (which would put a probe path into the radix cache the experiment measures).
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
        env.update({str(k): str(v) for k, v in hw_server["env"].items()})
        env.update({str(k): str(v) for k, v in (srv.env or {}).items()})
        if node is None and hw_server["uses_gpus"]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i])  # remote: the node agent splits its step's GPUs
        workers.append(
            ProcessSpec(
                f"server{i}",
                cmd,
                env,
                os.path.join(log_dir, f"server{i}.log"),
                f"{worker_urls[i]}/health",
                node=node,
                gpus=tp if node and hw_server["uses_gpus"] else 0,
            )
        )
    return workers


__all__ = [
    "CellPlan",
    "CellTimeoutError",
    "OrchestrationError",
    "ProcessSpec",
    "ROUTER_IMPLS",
    "SGLANG_ROUTER_POLICIES",
    "ServerStartError",
    "assign_gpus",
    "emulated_worker_command",
    "free_ports",
    "plan_cell",
    "router_service_command",
    "sglang_router_command",
    "sglang_server_command",
]
