"""Servers of a cell on the other nodes of its Slurm job: placement, and the agent started there.

A cell wider than one node (fig6's 10 workers on 8-GPU nodes; launchers/README.md) runs as one
process on the job's first node: router, client, results and the servers of that node. For every
other node it starts ONE job step inside the same allocation,

    srun --jobid=$SLURM_JOB_ID -N1 -n1 -w <node> [--gpus-per-node=<n>] \
        python -m repro.backends.sglang.node_agent --spec <cell logs>/node-<node>.json

and that agent starts the node's servers (each in its own process group, with the GPUs of the step
split tensor_parallel per server, on free ports of that node, bound to the node's address), writes
their addresses to `<cell logs>/node-<node>.addr.json` (the orchestrator health-checks them from
the first node), and supervises them:
- a server that exits (or never starts) makes the agent stop the node's other servers and exit
  non-zero with a line naming the node and the server: the cell fails with that message;
- SIGTERM / SIGINT (teardown: `scancel -s TERM <job>.<step>`; `scancel` of the job signals every
  step) stops every server (SIGTERM to its group, SIGKILL after the grace period) before the agent
  exits; each server also dies with the agent if the agent is SIGKILLed (PR_SET_PDEATHSIG), so
  nothing outlives the step. (SIGTERM to `srun` itself is no graceful stop: srun then kills the
  step outright; it is the teardown's fallback.)
Logs go straight into the cell's log folder (the shared filesystem the launcher already needs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from repro.backends.sglang.ports import pick_free_ports

PORT_PLACEHOLDER = "{port}"  # in a remote server's command and URL; the agent picks the port


class PlacementError(RuntimeError):
    """The cell cannot be placed on the nodes of this job."""


@dataclass(frozen=True)
class Node:
    name: str  # Slurm node name (srun -w)
    addr: str  # where its servers listen and the router reaches them (Slurm's NodeAddr)


def _run(cmd: Sequence[str], timeout: float = 30) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PlacementError(f"{shlex.join(cmd)} failed: {exc}") from None
    if out.returncode != 0:
        raise PlacementError(f"{shlex.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def job_nodes(env: dict | None = None) -> list[Node] | None:
    """The nodes of the Slurm job this process runs in, this node first; None outside a job or in a
    one-node job. Addresses from `scontrol show node` (NodeAddr)."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        return None
    if not any(c in env["SLURM_JOB_NODELIST"] for c in ",["):  # one node: no scontrol needed
        return None
    names = _run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]]).split()
    if len(names) < 2:
        return None
    here = env.get("SLURMD_NODENAME") or names[0]
    if here not in names:
        raise PlacementError(f"this node {here!r} is not in the job's node list {names}")
    names.remove(here)
    nodes = []
    for name in [here, *names]:
        info = _run(["scontrol", "show", "node", "-o", name])
        fields = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
        nodes.append(Node(name, fields.get("NodeAddr") or name))
    return nodes


def split_workers(num_workers: int, nodes: Sequence[Node]) -> list[int]:
    """Node index of each worker: ceil(M / nodes) per node, this node first (the launcher's shape:
    10 workers on 2 nodes -> 5 + 5)."""
    per = math.ceil(num_workers / len(nodes))
    return [i // per for i in range(num_workers)]


# ---------------------------------------------------------------------------- the agent
def _die_with_parent() -> None:
    """preexec_fn: the server gets SIGKILL if the agent dies, even by SIGKILL (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _write_json(path: str, obj) -> None:
    from repro.fileio import write_atomic

    write_atomic(path, json.dumps(obj, indent=1))


def _stop(procs: dict, grace_s: float) -> dict:
    for p in procs.values():
        if p.poll() is None:
            _killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs.values():
        _killpg(p.pid, signal.SIGKILL)  # stragglers of each group
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    return {name: p.returncode for name, p in procs.items()}


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_agent(spec_path: str) -> int:
    """Start the servers of spec_path, report their addresses, supervise them (see the module doc)."""
    with open(spec_path) as fh:
        spec = json.load(fh)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    host = spec["host"]
    servers = spec["servers"]
    grace = float(spec.get("grace_s", 20))
    stopping = {"signal": None}

    def _on_signal(signum, frame):
        stopping["signal"] = signum

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    need = sum(int(s.get("gpus", 0)) for s in servers)
    if need > len(gpus):
        print(
            f"node {node}: the servers need {need} GPUs, the step has {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={','.join(gpus) or 'unset'})",
            file=sys.stderr,
            flush=True,
        )
        return 3
    ports = pick_free_ports(len(servers), host, set(spec.get("avoid_ports") or ()))
    procs: dict[str, subprocess.Popen] = {}
    addrs = {}
    used = 0
    for s, port in zip(servers, ports):
        env = dict(os.environ)
        env.update(s.get("env") or {})
        if int(s.get("gpus", 0)):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[used : used + int(s["gpus"])])
            used += int(s["gpus"])
        cmd = [a.replace(PORT_PLACEHOLDER, str(port)) for a in s["cmd"]]
        log = open(s["log"], "ab", buffering=0)
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start on {node}: {shlex.join(cmd)}\n".encode())
        try:
            procs[s["name"]] = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            print(f"node {node}: cannot start {s['name']}: {exc}", file=sys.stderr, flush=True)
            _stop(procs, grace)
            return 3
        finally:
            log.close()
        addrs[s["name"]] = {"url": f"http://{host}:{port}", "pid": procs[s["name"]].pid}
    step = f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}" if os.environ.get("SLURM_STEP_ID") else None
    _write_json(
        spec["addr_file"],
        {"node": node, "hostname": socket.gethostname(), "agent_pid": os.getpid(), "step": step, "servers": addrs},
    )
    started = ", ".join(f"{n} ({a['url']})" for n, a in addrs.items())
    print(f"node {node}: started {started}", flush=True)
    rc = 0
    while stopping["signal"] is None:
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        if dead:
            name, code = next(iter(dead.items()))
            print(
                f"node {node}: server {name} exited with code {code} (log: "
                f"{next(s['log'] for s in servers if s['name'] == name)})",
                file=sys.stderr,
                flush=True,
            )
            rc = 4
            break
        time.sleep(0.2)
    codes = _stop(procs, grace)
    print(
        f"node {node}: servers stopped ({'signal ' + str(stopping['signal']) if stopping['signal'] else 'failure'}):"
        f" {codes}",
        flush=True,
    )
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="start and supervise one node's servers of a cell (srun step)")
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    return run_agent(args.spec)


if __name__ == "__main__":
    sys.exit(main())
