"""Node orchestration for one grid cell: M servers, a router, the client, then a clean teardown.

    plan = plan_cell(cfg, capacities, seeds, log_dir)     # commands, ports, configs (no side effects)
    result = run_plan(plan, requests, progress)           # start, wait, replay, tear down

On a Slurm GPU node (`emulate: false`) each worker is one SGLang server
(`python -m repro.backends.sglang.server --radix-eviction-policy <lru|rlt> ...`: SGLang with the
RLT patch applied) on its own GPU(s) via CUDA_VISIBLE_DEVICES; with `emulate: true` each worker
is an emulated SGLang worker (repro.backends.sglang.emulated_worker) — that is how CI runs this
whole path without a GPU. The router is our router service (`router_impl: ours`, the cell's
cfg.router) or the real Rust `sglang-router` (`router_impl: sglang_router`, cache_aware / random
/ round_robin only). Every process binds 127.0.0.1 on a free port; in a Slurm job of several
nodes (`backend.placement: auto`) the servers of the other nodes are started there by one srun
step per node and bind that node's address (node_agent.py; launchers/README.md says what that
exposes), while router, client and results stay on this node.

Guarantees:
- Bounded in time: servers must answer /health within timeouts.server_start_s (the router within
  timeouts.router_start_s), each request has timeouts.request_s, the whole cell timeouts.cell_s.
- A server that exits or never becomes healthy raises ServerStartError naming it, its command
  and the last lines of its log.
- Teardown always runs (also on errors, Ctrl-C and SIGTERM, which Slurm sends at a job's time
  limit): every process was started in its own process group (session) and the whole group gets
  SIGTERM, then SIGKILL after timeouts.shutdown_grace_s.
- Logs stay in the cell folder (`<cell>/logs/`): one log per process, the exact commands and
  environment (`plan.json`), the worker / router config files, the client's report and the
  router's and workers' final statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repro.confutil import to_plain
from repro.results import atomic_write_json

ROUTER_IMPLS = ("ours", "sglang_router")
SGLANG_ROUTER_POLICIES = ("cache_aware", "random", "round_robin")
HEALTH_PROBE_TIMEOUT_S = 5.0


class OrchestrationError(RuntimeError):
    """The cell could not be run on this node (start-up, time limit, configuration)."""


class ServerStartError(OrchestrationError):
    """A server or the router exited or never became healthy."""


class CellTimeoutError(OrchestrationError):
    """The cell ran past timeouts.cell_s."""


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

    def describe(self) -> dict:
        def proc(p: ProcessSpec) -> dict:
            return {"name": p.name, "cmd": shlex.join(p.cmd), "env": p.env, "log": p.log_path,
                    "health_url": p.health_url, "config": p.config_path}

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
            "workers": [{**proc(p), "node": p.node or (self.nodes[0].name if self.nodes else None)}
                        for p in self.workers],
            "router": proc(self.router),
        }


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports on host (held open together while picking, so all differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def assign_gpus(num_workers: int, tensor_parallel: int, gpus: Sequence[Any] | None) -> list[list[str]]:
    """GPU ids per worker: `gpus` if given, else CUDA_VISIBLE_DEVICES of the job, else 0..M*tp-1."""
    if gpus is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        pool = [g.strip() for g in env.split(",") if g.strip()] if env else [str(i) for i in range(num_workers * tensor_parallel)]
    else:
        pool = [str(g) for g in gpus]
    need = num_workers * tensor_parallel
    if len(pool) < need:
        raise OrchestrationError(
            f"the cell needs {num_workers} workers x tensor_parallel {tensor_parallel} = {need} GPUs, "
            f"but only {len(pool)} are available ({','.join(pool) or 'none'}; set backend.gpus or "
            f"CUDA_VISIBLE_DEVICES)"
        )
    return [pool[i * tensor_parallel:(i + 1) * tensor_parallel] for i in range(num_workers)]


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
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m repro.backends.sglang.server ...` with SGLang 0.5.23 server flags.

    KV budget: `--max-total-tokens` when the cell sets an explicit per-worker token budget
    (cluster.kv_cache_tokens), else `--mem-fraction-static` (SGLang's fraction of GPU memory for
    weights + KV pool: the same formula the simulator uses for its capacity).
    """
    cmd = [python, "-m", "repro.backends.sglang.server",
           "--model-path", str(model_path), "--host", host, "--port", str(port),
           "--radix-eviction-policy", str(eviction_policy)]
    if kv_cache_tokens is not None:
        cmd += ["--max-total-tokens", str(int(kv_cache_tokens))]
    if mem_fraction is not None:
        cmd += ["--mem-fraction-static", f"{float(mem_fraction):g}"]
    sched = dict(scheduler or {})
    if "schedule_policy" in sched:
        cmd += ["--schedule-policy", str(sched["schedule_policy"])]
    if "max_running_requests" in sched:
        cmd += ["--max-running-requests", str(int(sched["max_running_requests"]))]
    if "max_prefill_tokens" in sched:
        cmd += ["--max-prefill-tokens", str(int(sched["max_prefill_tokens"]))]
    if "chunked_prefill_size" in sched:
        c = sched["chunked_prefill_size"]
        cmd += ["--chunked-prefill-size", str(-1 if c is None or int(c) <= 0 else int(c))]
    if tensor_parallel > 1:
        cmd += ["--tp-size", str(int(tensor_parallel))]
    if random_seed is not None:
        cmd += ["--random-seed", str(int(random_seed))]
    if load_format and load_format != "auto":
        cmd += ["--load-format", str(load_format)]
    if dtype and dtype != "auto":
        cmd += ["--dtype", str(dtype)]
    return cmd + [str(a) for a in extra_args]


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
    match_on / low_match / worker_order have no Rust counterpart (the real router matches the
    request text, or the ids as decimal strings, and its load ties follow its registry order).
    Its Prometheus endpoint (default 0.0.0.0:29000, where a second router on the node would
    collide and panic) goes to `prometheus_port` on `host`.
    """
    name = str(router_cfg.get("name"))
    if name not in SGLANG_ROUTER_POLICIES:
        raise OrchestrationError(
            f"router_impl=sglang_router supports routers {SGLANG_ROUTER_POLICIES}, not {name!r} "
            f"(use router_impl=ours)"
        )
    cmd = [python, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", name,
           "--prometheus-host", host, "--prometheus-port", str(prometheus_port)]
    if name == "cache_aware":
        cmd += [
            "--cache-threshold", f"{float(router_cfg.get('cache_threshold', 0.3)):g}",
            "--balance-abs-threshold", str(int(router_cfg.get("balance_abs_threshold", 64))),
            "--balance-rel-threshold", f"{float(router_cfg.get('balance_rel_threshold', 1.5)):g}",
            "--eviction-interval-secs", str(int(router_cfg.get("eviction_interval_secs", 60))),
            "--max-tree-size", str(int(router_cfg.get("max_tree_size", 2**26))),
        ]
    cmd += ["--request-timeout-secs", str(int(math.ceil(request_timeout_s))),
            "--worker-startup-timeout-secs", str(int(math.ceil(worker_startup_timeout_s)))]
    return cmd + [str(a) for a in extra_args]


def emulated_worker_command(python: str, host: str, port: int, config_path: str) -> list[str]:
    return [python, "-m", "repro.backends.sglang.emulated_worker", "--config", config_path,
            "--host", host, "--port", str(port)]


def router_service_command(python: str, host: str, port: int, config_path: str) -> list[str]:
    return [python, "-m", "repro.backends.sglang.router_service", "--config", config_path,
            "--host", host, "--port", str(port)]


def plan_cell(cfg: Any, capacities: Sequence[int], seeds: Any, log_dir: str | os.PathLike,
              ports: Sequence[int] | None = None) -> CellPlan:
    """Every command, port, environment and config file of one cell (nothing started yet).

    `cfg` is the composed cell config (DictConfig or mapping), `capacities` the per-worker KV
    budgets (repro.backends.sim.kv_capacities), `seeds` the cell's repro.sim.SeedPlan.
    `ports`: M + 1 ports (workers, then router); default: free ports now.
    """
    cfg = to_plain(cfg)
    b = cfg["backend"]
    cluster = cfg["cluster"]
    m = int(cluster["num_workers"])
    host = str(b.get("host") or "127.0.0.1")
    emulate = bool(b.get("emulate", False))
    time_scale = float(b.get("time_scale", 1.0)) if emulate else 1.0
    router_impl = str(b.get("router_impl", "ours"))
    if router_impl not in ROUTER_IMPLS:
        raise OrchestrationError(f"backend.router_impl must be one of {ROUTER_IMPLS}, got {router_impl!r}")
    python = str(b.get("python") or sys.executable)
    timeouts = dict(b.get("timeouts") or {})
    log_dir = str(Path(log_dir).resolve())
    from repro.backends.sglang.node_agent import PORT_PLACEHOLDER, PlacementError, job_nodes, split_workers

    placement = str(b.get("placement", "auto"))
    if placement not in ("auto", "local"):
        raise OrchestrationError(f"backend.placement must be auto or local, got {placement!r}")
    try:
        nodes = (job_nodes() or []) if placement == "auto" else []
    except PlacementError as exc:
        raise OrchestrationError(f"cannot place the cell on the nodes of Slurm job {os.environ.get('SLURM_JOB_ID')}: "
                                 f"{exc} (backend.placement=local keeps every server on this node)") from None
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
    eviction = dict(cfg["eviction"])
    scheduler = dict(cluster.get("scheduler") or {})
    model = cfg["model"]
    hardware = cfg["hardware"]
    tp = int(model.get("tensor_parallel", 1) or 1)
    tokenizer = dict((cfg.get("workload") or {}).get("tokenizer") or {}) or None  # text requests: as the workload

    workers: list[ProcessSpec] = []
    gpus: list[list[str]] = []
    emu = dict(b.get("emulator") or {})
    faults = {int(k): v for k, v in (emu.get("faults") or {}).items()}
    if emulate:
        for i in range(m):
            path = os.path.join(log_dir, f"worker{i}.json")
            config = {
                "worker_id": i,
                "kv_capacity_tokens": int(capacities[i]),
                "eviction": eviction,
                "seed": int(seeds.workers[i]),
                "model": model,
                "hardware": hardware,
                "scheduler": scheduler,
                "time_scale": time_scale,
                "startup_delay_s": float(emu.get("startup_delay_s", 0.0) or 0.0),
                "fault": faults.get(i, emu.get("fault")),
                "tokenizer": tokenizer,
            }
            h, port, node = where(i)
            workers.append(ProcessSpec(f"worker{i}", emulated_worker_command(python, h, port, path), {},
                                       os.path.join(log_dir, f"worker{i}.log"), f"{worker_urls[i]}/health",
                                       path, config, node=node))
    else:
        srv = dict(b.get("server") or {})
        n_local = node_of.count(0)
        gpus = assign_gpus(n_local, tp, b.get("gpus")) + [[] for _ in range(m - n_local)]
        model_path = srv.get("model_path") or model.get("hf_id")
        if not model_path:
            raise OrchestrationError("backend.server.model_path is not set and the model config has no hf_id")
        explicit = cluster.get("kv_cache_tokens")
        seed = srv.get("random_seed")
        for i in range(m):
            h, port, node = where(i)
            cmd = sglang_server_command(
                python, model_path, h, port, eviction["name"], scheduler,
                kv_cache_tokens=int(capacities[i]) if explicit is not None else None,
                mem_fraction=None if explicit is not None else float(cluster["mem_fraction"]),
                tensor_parallel=tp,
                # The server seeds RLT with --random-seed: worker i gets the simulator's eviction
                # seed of worker i (SeedPlan.workers[i], folded into SGLang's int range).
                random_seed=int(seeds.workers[i]) % (2**31 - 1) if seed is None else int(seed),
                load_format=srv.get("load_format"),
                dtype=srv.get("dtype"),
                extra_args=list(srv.get("extra_args") or []),
            )
            # /health answers from the server's state instead of running a 1-token generation
            # (which would put a probe path into the radix cache the experiment measures).
            env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
            env.update({str(k): str(v) for k, v in (srv.get("env") or {}).items()})
            if node is None:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i])  # remote: the node agent splits its step's GPUs
            workers.append(ProcessSpec(f"server{i}", cmd, env, os.path.join(log_dir, f"server{i}.log"),
                                       f"{worker_urls[i]}/health", node=node, gpus=tp if node else 0))

    request_timeout_s = float(timeouts.get("request_s", 600))
    router_url = f"http://{host}:{router_port}"
    if router_impl == "ours":
        path = os.path.join(log_dir, "router.json")
        rs = dict(b.get("router_service") or {})
        service = {
            "worker_urls": worker_urls,
            "kv_capacity_tokens": [int(c) for c in capacities],
            "eviction_policy": str(eviction["name"]),
            "view_tracker_granularity": str(eviction.get("granularity", "node")),
            "seed": int(seeds.router),
            "time_scale": time_scale,
            "request_timeout_s": request_timeout_s,
            "connect_timeout_s": float(timeouts.get("connect_s", 10)),
            "tokenizer": tokenizer,
            **rs,
        }
        config = {"router": cfg["router"], "model": model, "hardware": hardware, "service": service}
        router = ProcessSpec("router", router_service_command(python, host, router_port, path), {},
                             os.path.join(log_dir, "router.log"), f"{router_url}/health", path, config)
    else:
        sr = dict(b.get("sglang_router") or {})
        prometheus_port = next(p for p in free_ports(m + 2, host) if p not in ports)
        cmd = sglang_router_command(
            str(sr.get("python") or python), host, router_port, worker_urls, cfg["router"],
            request_timeout_s=request_timeout_s,
            worker_startup_timeout_s=float(timeouts.get("router_start_s", 60)),
            prometheus_port=prometheus_port,
            extra_args=list(sr.get("extra_args") or []),
        )
        # /readiness, not /health: the real router answers /health before any worker is registered
        router = ProcessSpec("sglang_router", cmd, {}, os.path.join(log_dir, "router.log"), f"{router_url}/readiness")

    client = dict(b.get("client") or {})
    send_ref = client.get("send_reference_output", "auto")
    client_cfg = {
        "time_scale": time_scale,
        "request_timeout_s": request_timeout_s,
        "connect_timeout_s": float(timeouts.get("connect_s", 10)),
        "send_reference_output": emulate if send_ref == "auto" else bool(send_ref),
        "send_text": bool(client.get("send_text", True)),
    }
    full_timeouts = {
        "server_start_s": float(timeouts.get("server_start_s", 1200)),
        "router_start_s": float(timeouts.get("router_start_s", 60)),
        "request_s": request_timeout_s,
        "connect_s": float(timeouts.get("connect_s", 10)),
        "cell_s": float(timeouts.get("cell_s", 14400)),
        "shutdown_grace_s": float(timeouts.get("shutdown_grace_s", 20)),
    }
    local_ports = [ports[i] for i in range(m) if node_of[i] == 0] + [router_port]
    return CellPlan(workers, router, router_url, worker_urls, log_dir, emulate, router_impl, time_scale,
                    full_timeouts, client_cfg, gpus, nodes, local_ports)


# ---------------------------------------------------------------------------- processes
class ManagedProcess:
    """A child in its own session (process group): started with its log, stopped as a group."""

    def __init__(self, spec: ProcessSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        spec = self.spec
        if spec.config_path is not None and spec.config is not None:
            atomic_write_json(spec.config_path, spec.config)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(spec.log_path, "ab", buffering=0)
        self._log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {shlex.join(spec.cmd)}\n".encode())
        env = dict(os.environ)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The children import repro from the same tree as this process.
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen(spec.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            raise ServerStartError(f"{spec.name}: cannot start {shlex.join(spec.cmd)}: {exc}") from exc

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s; returns the exit code."""
        p = self.proc
        if p is None:
            return None
        try:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
            _signal_group(p.pid, signal.SIGKILL)  # stragglers of the group (SGLang's own children)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return p.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.spec.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text.splitlines()[-lines:])

    def describe_failure(self, what: str) -> str:
        return (f"{self.name} {what}\n  command: {shlex.join(self.spec.cmd)}\n  log: {self.spec.log_path}\n"
                f"  last lines of the log:\n" + "\n".join("    " + ln for ln in self.log_tail().splitlines()))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child is its session's leader: its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------- other nodes
def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class RemoteNode:
    """The servers of one other node of the job: one `srun` step running node_agent there."""

    def __init__(self, node: Any, specs: Sequence[ProcessSpec], plan: CellPlan):
        self.node = node
        self.specs = list(specs)
        self.plan = plan
        base = os.path.join(plan.log_dir, f"node-{node.name}")
        self.spec_path, self.addr_path, self.log_path = base + ".json", base + ".addr.json", base + ".log"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.addrs: dict = {}

    @property
    def name(self) -> str:
        return f"node {self.node.name}"

    def srun_command(self) -> list[str]:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            raise OrchestrationError("servers on other nodes need a Slurm job (SLURM_JOB_ID is not set)")
        cmd = ["srun", f"--jobid={job}", "-N1", "-n1", f"--nodelist={self.node.name}", "--kill-on-bad-exit=1",
               f"--job-name=repro-servers-{self.node.name}"]
        gpus = sum(s.gpus for s in self.specs)
        if gpus:
            cmd.append(f"--gpus-per-node={gpus}")
        if os.environ.get("SLURM_CPUS_PER_TASK"):  # the servers share the node's CPUs of the job
            cmd.append(f"--cpus-per-task={os.environ['SLURM_CPUS_PER_TASK']}")
        python = str(self.specs[0].cmd[0])  # the servers' interpreter (backend.python) runs the agent too
        return cmd + [python, "-m", "repro.backends.sglang.node_agent", "--spec", self.spec_path]

    def start(self) -> None:
        for s in self.specs:
            if s.config_path is not None and s.config is not None:
                atomic_write_json(s.config_path, s.config)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.addr_path)
        atomic_write_json(self.spec_path, {
            "host": self.node.addr, "addr_file": self.addr_path, "grace_s": self.plan.timeouts["shutdown_grace_s"],
            # ports this node's processes were given but may not have bound yet: not free for the agent
            # when "nodes" share a host (the test cluster); harmless elsewhere
            "avoid_ports": self.plan.local_ports,
            "servers": [{"name": s.name, "cmd": s.cmd, "env": s.env, "log": s.log_path, "gpus": s.gpus}
                        for s in self.specs],
        })
        cmd = self.srun_command()
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for k in ("SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_NPROCS"):  # the cell's own step
            env.pop(k, None)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {shlex.join(cmd)}\n".encode())
        try:
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        except OSError as exc:
            raise ServerStartError(f"{self.name}: cannot run {shlex.join(cmd)}: {exc}") from exc

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def failure(self, what: str) -> str:
        return (f"{self.name}: {what}\n  step: {shlex.join(self.srun_command())}\n  agent log: {self.log_path}\n"
                f"  last lines of the agent log:\n" + "\n".join("    " + ln for ln in _tail(self.log_path).splitlines()))

    def wait_addresses(self, deadline: float) -> dict[str, str]:
        """{placeholder URL: real URL} of this node's servers, once the agent has written them."""
        while True:
            rc = self.poll()
            if rc is not None:
                raise ServerStartError(self.failure(f"the server step ended with code {rc} before reporting addresses"))
            try:
                with open(self.addr_path) as fh:
                    info = json.load(fh)
                break
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise ServerStartError(self.failure("no server addresses reported in time (is the step pending?)"))
            time.sleep(0.2)
        self.addrs = info
        urls = {}
        for s in self.specs:  # health_url was "<placeholder>/health" until now
            url = info["servers"][s.name]["url"]
            urls[s.health_url.removesuffix("/health")] = url
            s.health_url = url + "/health"
        return urls

    def servers(self) -> list["RemoteServer"]:
        return [RemoteServer(s, self) for s in self.specs]

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM to the step's agent (`scancel -s TERM job.step`: it stops its servers), then, if the
        step is still there after the grace, SIGTERM to srun (Slurm kills the step), then SIGKILL."""
        p = self.proc
        if p is None:
            return None
        try:
            if p.poll() is None and self.addrs.get("step"):
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    subprocess.run(["scancel", "-s", "TERM", str(self.addrs["step"])], capture_output=True, timeout=30)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=grace_s + 5)
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    _signal_group(p.pid, signal.SIGKILL)  # the step dies with srun; servers with the agent
                    p.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return p.returncode


class RemoteServer:
    """One remote server as wait_healthy sees it (it exits = its node's step ended)."""

    def __init__(self, spec: ProcessSpec, node: RemoteNode):
        self.spec = spec
        self.node = node

    @property
    def name(self) -> str:
        return f"{self.spec.name} on node {self.spec.node}"

    def poll(self) -> int | None:
        return self.node.poll()

    def describe_failure(self, what: str) -> str:
        return (f"{self.name} {what}\n  log: {self.spec.log_path}\n  last lines of the log:\n"
                + "\n".join("    " + ln for ln in _tail(self.spec.log_path).splitlines())
                + "\n" + self.node.failure("its node agent"))


# Local probes never go through an http_proxy of the environment (Slurm nodes often set one).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url: str, timeout_s: float = HEALTH_PROBE_TIMEOUT_S) -> str | None:
    """None if GET url answers 200, else why not."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{type(reason).__name__}: {reason}"


def wait_healthy(procs: Sequence[ManagedProcess], timeout_s: float, interval_s: float = 0.5,
                 deadline: float | None = None) -> float:
    """Poll every process's health URL until all answer 200; returns the seconds it took.

    ServerStartError as soon as one exits, or when timeout_s (or the absolute monotonic
    `deadline`, whichever is first) passes; the message names the process and shows its log tail.
    """
    t0 = time.monotonic()
    end = t0 + timeout_s if deadline is None else min(t0 + timeout_s, deadline)
    pending = list(procs)
    last: dict[str, str] = {}
    while pending:
        for p in list(pending):
            rc = p.poll()
            if rc is not None:
                raise ServerStartError(p.describe_failure(f"exited with code {rc} before becoming healthy"))
            why = probe(p.spec.health_url, min(HEALTH_PROBE_TIMEOUT_S, max(0.5, end - time.monotonic())))
            if why is None:
                pending.remove(p)
            else:
                last[p.name] = why
        if not pending:
            break
        if time.monotonic() >= end:
            names = ", ".join(p.name for p in pending)
            first = pending[0]
            raise ServerStartError(
                f"not healthy after {time.monotonic() - t0:.0f}s: {names} (last probe of {first.name} "
                f"{first.spec.health_url}: {last.get(first.name)})\n"
                + first.describe_failure("never became healthy")
            )
        time.sleep(interval_s)
    return time.monotonic() - t0


@contextlib.contextmanager
def _sigterm_raises():
    """Turn SIGTERM into SystemExit while the cell runs (main thread only), so teardown runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum, frame):
        raise SystemExit(f"received signal {signum}: tearing the cell's processes down")

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _get_json(url: str, timeout_s: float = 10.0) -> Any:
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except Exception as exc:  # best effort: statistics only
        return {"error": f"{type(exc).__name__}: {exc}"}


@dataclass
class PlanResult:
    records: Any  # pandas DataFrame, RECORD_COLUMNS
    client_report: dict
    router_stats: dict | None
    worker_stats: list | None
    startup_s: dict


async def _stream_worker_state(router_url: str, log: Callable[[dict], None], every_s: float = 2.0) -> None:
    """Per-worker curves of a live cell for W&B (the keys of repro.tracking.series): the router
    service's own view of each worker (in flight, waiting, estimated KV use), polled from /stats."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False) as session:
        while True:
            await asyncio.sleep(every_s)
            try:
                async with session.get(f"{router_url}/stats", timeout=aiohttp.ClientTimeout(total=every_s)) as r:
                    workers = (await r.json())["workers"]
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                continue  # a missed point; the cell itself is judged by the replay
            point = {}
            for w in workers:
                i = w["worker_id"]
                point[f"in_flight/w{i}"] = w["in_flight"]
                point[f"queue/w{i}"] = w["waiting"]
                point[f"kv_use/w{i}"] = w["active_kv_tokens"]
            log(point)


def run_plan(plan: CellPlan, requests: Sequence[Any], progress: Callable[[float], None] | None = None) -> PlanResult:
    """Start the workers and the router, replay `requests`, collect statistics, tear down."""
    from repro.backends.sglang.client import ClientConfig, replay

    t_start = time.monotonic()
    cell_deadline = t_start + plan.timeouts["cell_s"]
    Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(os.path.join(plan.log_dir, "plan.json"), plan.describe())
    procs: list[ManagedProcess] = []
    remote = [RemoteNode(node, plan.remote_nodes()[node.name], plan) for node in plan.nodes[1:]
              if node.name in plan.remote_nodes()]
    startup: dict[str, float] = {}
    try:
        with _sigterm_raises():
            for spec in plan.workers:
                if spec.node is None:
                    p = ManagedProcess(spec)
                    procs.append(p)
                    p.start()
            for r in remote:
                r.start()
            servers: list[Any] = list(procs)
            t0 = time.monotonic()
            for r in remote:  # their addresses first, then everyone's health
                plan.bind_urls(r.wait_addresses(min(t0 + plan.timeouts["server_start_s"], cell_deadline)))
                servers += r.servers()
            startup["workers_s"] = wait_healthy(servers, plan.timeouts["server_start_s"] - (time.monotonic() - t0),
                                                deadline=cell_deadline) + (time.monotonic() - t0)
            for p in servers:  # one that lost its port to another process answers /health through that one
                rc = p.poll()
                if rc is not None:
                    raise ServerStartError(p.describe_failure(f"exited with code {rc} while the others became healthy"))
            if remote:
                atomic_write_json(os.path.join(plan.log_dir, "plan.json"), plan.describe())  # with the real URLs
            router = ManagedProcess(plan.router)
            procs.append(router)
            router.start()
            startup["router_s"] = wait_healthy([router], plan.timeouts["router_start_s"], deadline=cell_deadline)
            remaining = cell_deadline - time.monotonic()
            if remaining <= 0:
                raise CellTimeoutError(f"timeouts.cell_s={plan.timeouts['cell_s']:g}s spent before the replay started")
            client_cfg = ClientConfig(**plan.client)

            async def _watch_nodes():  # a lost node or server fails the cell (it cannot be replaced)
                while True:
                    for r in remote:
                        rc = r.poll()
                        if rc is not None:
                            return r, rc
                    await asyncio.sleep(0.5)

            async def _replay():
                run = asyncio.ensure_future(replay(requests, plan.router_url, client_cfg, progress))
                watch = asyncio.ensure_future(_watch_nodes())
                live = getattr(progress, "log", None)
                poll = asyncio.ensure_future(_stream_worker_state(plan.router_url, live)
                                             if live is not None and plan.router_impl == "ours" else asyncio.sleep(0))
                try:
                    done, _ = await asyncio.wait({run, watch}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                    if run in done:
                        return run.result()
                    if watch in done:
                        r, rc = watch.result()
                        raise ServerStartError(r.failure(f"the server step ended with code {rc} in the middle of "
                                                         f"the cell"))
                    raise CellTimeoutError(
                        f"the replay ran past timeouts.cell_s={plan.timeouts['cell_s']:g}s "
                        f"(router log: {plan.router.log_path})"
                    )
                finally:
                    for t in (run, watch, poll):
                        t.cancel()
                    await asyncio.gather(run, watch, poll, return_exceptions=True)

            records, report = asyncio.run(_replay())
            atomic_write_json(os.path.join(plan.log_dir, "client_report.json"), report)
            router_stats = None
            if plan.router_impl == "ours":
                router_stats = _get_json(f"{plan.router_url}/stats")
                atomic_write_json(os.path.join(plan.log_dir, "router_stats.json"), router_stats)
            worker_stats = None
            if plan.emulate:
                worker_stats = [_get_json(u + "/emulator/stats", 5.0) for u in plan.worker_urls]
                atomic_write_json(os.path.join(plan.log_dir, "worker_stats.json"), worker_stats)
            return PlanResult(records, report, router_stats, worker_stats, startup)
    finally:
        grace = plan.timeouts["shutdown_grace_s"]
        exit_codes = {}
        for p in reversed(procs):  # router first, then the workers
            exit_codes[p.name] = p.stop(grace)
        for r in remote:
            exit_codes[r.name] = r.stop(grace)
        with contextlib.suppress(OSError):
            atomic_write_json(os.path.join(plan.log_dir, "exit_codes.json"), exit_codes)


__all__ = [
    "CellPlan",
    "CellTimeoutError",
    "ManagedProcess",
    "OrchestrationError",
    "PlanResult",
    "ProcessSpec",
    "ServerStartError",
    "assign_gpus",
    "emulated_worker_command",
    "free_ports",
    "plan_cell",
    "probe",
    "router_service_command",
    "run_plan",
    "sglang_router_command",
    "sglang_server_command",
    "wait_healthy",
]
