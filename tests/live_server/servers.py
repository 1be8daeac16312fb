"""Real SGLang servers for the tests, started by the harness's own code (planning + processes)."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from repro.backends.sglang.protocol import generate_body
from repro.backends.sglang.config import hardware_server
from repro.backends.sglang.planning import ProcessSpec, free_ports, sglang_server_command
from repro.backends.sglang.processes import ManagedProcess, wait_healthy
from repro.backends.sglang.tiny_model import ensure_model_dir

ROOT = Path(__file__).resolve().parents[2]
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def conf(rel: str) -> dict:
    with open(ROOT / "conf" / rel) as fh:
        return yaml.safe_load(fh)


@dataclass
class Server:
    name: str
    url: str
    proc: ManagedProcess

    @property
    def log_path(self) -> str:
        return self.proc.spec.log_path

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")


def server_spec(python: str, name: str, port: int, log_dir: Path, eviction: str, *, seed: int,
                kv_tokens: int, extra_args: Sequence[str] = ()) -> ProcessSpec:
    """The command and environment the harness gives a hardware=cpu server of model=tiny_llama."""
    model = conf("model/tiny_llama.yaml")
    hw = hardware_server(conf("hardware/cpu.yaml"))
    cmd = sglang_server_command(python, str(ensure_model_dir(model)), "127.0.0.1", port, eviction, {},
                                kv_cache_tokens=kv_tokens, mem_fraction=None, random_seed=seed,
                                load_format=model["load_format"], extra_args=[*hw["extra_args"], *extra_args])
    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false", **{k: str(v) for k, v in hw["env"].items()}}
    return ProcessSpec(name, cmd, env, str(log_dir / f"{name}.log"), f"http://127.0.0.1:{port}/health")


@contextlib.contextmanager
def running_servers(python: str, log_dir: Path, kinds: Sequence[tuple], kv_tokens: int,
                    start_timeout_s: float = 900.0) -> Iterator[list[Server]]:
    """Start one server per (name, eviction, seed[, extra_args]) in parallel; stop them all on exit."""
    ports = free_ports(len(kinds))
    servers = [Server(kind[0], f"http://127.0.0.1:{port}",
                      ManagedProcess(server_spec(python, kind[0], port, log_dir, kind[1], seed=kind[2],
                                                 kv_tokens=kv_tokens, extra_args=kind[3] if len(kind) > 3 else ())))
               for kind, port in zip(kinds, ports)]
    try:
        for s in servers:
            s.proc.start()
        wait_healthy([s.proc for s in servers], start_timeout_s)
        yield servers
    finally:
        for s in servers:
            s.proc.stop(20.0)


def post(url: str, body: dict | None = None, timeout_s: float = 120.0) -> dict:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with OPENER.open(req, timeout=timeout_s) as resp:
        raw = resp.read()
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode(errors="replace")}


def generate(url: str, ids: Sequence[int], max_new_tokens: int = 4) -> dict:
    """One non-streaming /generate as the benchmark client sends it (exact ids, a fixed output length,
    temperature 0: the generated tokens enter the radix cache, so they must repeat for its evictions
    to repeat); returns meta_info."""
    out = post(url + "/generate", generate_body(ids, max_new_tokens, stream=False))
    return out["meta_info"]


def flush(url: str) -> None:
    post(url + "/flush_cache")
