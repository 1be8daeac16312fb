"""Starting, watching and stopping a cell's processes (the supervision half of orchestrate.py).

`ManagedProcess`: a local child in its own session (process group), started with its log and
stopped as a group (SIGTERM, SIGKILL after the grace), then whatever is left of its session
(sessions.py), and how it ended recorded (`exit_record`: stopped / killed / died). `RemoteNode` / `RemoteServer`: the servers
of another node of a Slurm job, one `srun` step running node_agent there. `wait_healthy` polls
their health URLs, failing fast (ServerStartError with the log's tail) when one exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from repro.backends.sglang.planning import CellPlan, OrchestrationError, ProcessSpec, ServerStartError
from repro.backends.sglang.sessions import end_session
from repro.fileio import write_json_atomic

HEALTH_PROBE_TIMEOUT_S = 5.0
# The children import repro from the same tree as this process.
_REPO_ROOT = str(Path(__file__).resolve().parents[3])


def _child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = _REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


# How a process ended, in exit_codes.json: "stopped" (it exited after our SIGTERM, whatever its code:
# SGLang's server kills its own tree with SIGKILL then), "killed" (still there after the grace: our
# SIGKILL), "died" (it had exited before we sent anything: on its own or killed by someone else).
ENDINGS = ("stopped", "killed", "died")


class ManagedProcess:
    """A child in its own session (process group): started with its log, stopped as a group."""

    def __init__(self, spec: ProcessSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.ended: str | None = None  # one of ENDINGS once stopped
        self.left_in_session: list[int] = []  # processes of its session still alive after the teardown

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        spec = self.spec
        if spec.config_path is not None and spec.config is not None:
            write_json_atomic(spec.config_path, spec.config)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(spec.log_path, "ab", buffering=0)
        self._log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {shlex.join(spec.cmd)}\n".encode())
        env = _child_env(spec.env)
        try:
            self.proc = subprocess.Popen(
                spec.cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerStartError(f"{spec.name}: cannot start {shlex.join(spec.cmd)}: {exc}") from exc

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s, then whatever is left of its session;
        returns the exit code (`ended` says how it ended, `exit_record` both)."""
        p = self.proc
        if p is None:
            return None
        try:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=grace_s)
                    self.ended = "stopped"
                except subprocess.TimeoutExpired:
                    _signal_group(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
                    self.ended = "killed"
            elif self.ended is None:
                self.ended = "died"
            _signal_group(p.pid, signal.SIGKILL)  # stragglers of the group (SGLang's own children)
            self.left_in_session = end_session(p.pid)  # the child leads its session: sid = its pid
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return p.returncode

    def exit_record(self) -> dict:
        """Its line of exit_codes.json."""
        rc = None if self.proc is None else self.proc.returncode
        return {"exit_code": rc, "ended": self.ended, "left_in_session": self.left_in_session}

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.spec.log_path, lines)

    def log_since_start(self, lines: int = 80) -> str:
        """The log's tail from this start's header on (a restart appends to the same log)."""
        tail = self.log_tail(lines).splitlines()
        starts = [i for i, ln in enumerate(tail) if ln.startswith("# ") and " start: " in ln]
        return "\n".join(tail[starts[-1] :] if starts else tail)

    def describe_failure(self, what: str) -> str:
        return (
            f"{self.name} {what}\n  command: {shlex.join(self.spec.cmd)}\n  log: {self.spec.log_path}\n"
            f"  last lines of the log:\n" + "\n".join("    " + ln for ln in self.log_tail().splitlines())
        )


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child is its session's leader: its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------- other nodes
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
        self.ended: str | None = None  # one of ENDINGS once stopped

    @property
    def name(self) -> str:
        return f"node {self.node.name}"

    def srun_command(self) -> list[str]:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            raise OrchestrationError("servers on other nodes need a Slurm job (SLURM_JOB_ID is not set)")
        cmd = [
            "srun",
            f"--jobid={job}",
            "-N1",
            "-n1",
            f"--nodelist={self.node.name}",
            "--kill-on-bad-exit=1",
            f"--job-name=repro-servers-{self.node.name}",
        ]
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
                write_json_atomic(s.config_path, s.config)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.addr_path)
        write_json_atomic(
            self.spec_path,
            {
                "host": self.node.addr,
                "addr_file": self.addr_path,
                "grace_s": self.plan.timeouts["shutdown_grace_s"],
                # ports this node's processes were given but may not have bound yet: not free for the agent
                # when "nodes" share a host (the test cluster); harmless elsewhere
                "avoid_ports": self.plan.local_ports,
                "servers": [
                    {"name": s.name, "cmd": s.cmd, "env": s.env, "log": s.log_path, "gpus": s.gpus} for s in self.specs
                ],
            },
        )
        cmd = self.srun_command()
        env = _child_env()
        for k in ("SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_NPROCS"):  # the cell's own step
            env.pop(k, None)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {shlex.join(cmd)}\n".encode())
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerStartError(f"{self.name}: cannot run {shlex.join(cmd)}: {exc}") from exc

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def failure(self, what: str) -> str:
        return (
            f"{self.name}: {what}\n  step: {shlex.join(self.srun_command())}\n  agent log: {self.log_path}\n"
            f"  last lines of the agent log:\n" + "\n".join("    " + ln for ln in _tail(self.log_path).splitlines())
        )

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
        if p.poll() is not None and self.ended is None:
            self.ended = "died"
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
                    self.ended = "killed"
            if self.ended is None:
                self.ended = "stopped"
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
        return p.returncode

    def exit_record(self) -> dict:
        """Its line of exit_codes.json (the node's servers are its agent's: it stops them)."""
        rc = None if self.proc is None else self.proc.returncode
        return {"exit_code": rc, "ended": self.ended, "left_in_session": []}


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
        return (
            f"{self.name} {what}\n  log: {self.spec.log_path}\n  last lines of the log:\n"
            + "\n".join("    " + ln for ln in _tail(self.spec.log_path).splitlines())
            + "\n"
            + self.node.failure("its node agent")
        )


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


# Lines after which a server never becomes healthy although its process lives on (SGLang's HTTP server
# keeps its scheduler processes running after uvicorn failed to bind).
FATAL_LOG_LINES = ("address already in use",)


def fatal_log_line(proc: Any) -> str | None:
    """The first fatal start-up line in a local process's log tail (None: none)."""
    if not isinstance(proc, ManagedProcess):
        return None
    for line in proc.log_since_start(80).splitlines():
        if any(marker in line.lower() for marker in FATAL_LOG_LINES):
            return line.strip()
    return None


def check_port_free(spec: ProcessSpec) -> None:
    """ServerStartError if the port in spec's health URL is taken on its host (checked just before the start:
    a server that cannot bind may never exit, and would only fail at timeouts.server_start_s)."""
    from urllib.parse import urlsplit

    from repro.backends.sglang.ports import try_hold

    parts = urlsplit(spec.health_url)
    if parts.port is None:
        return
    held = try_hold(parts.hostname or "127.0.0.1", parts.port)
    if held is None:
        raise ServerStartError(
            f"{spec.name}: port {parts.port} on {parts.hostname} is already in use; "
            f"not started\n  command: {shlex.join(spec.cmd)}"
        )
    held.close()


def wait_healthy(
    procs: Sequence[ManagedProcess], timeout_s: float, interval_s: float = 0.5, deadline: float | None = None
) -> float:
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
            fatal = fatal_log_line(p)
            if fatal is not None:
                raise ServerStartError(p.describe_failure(f"cannot become healthy ({fatal})"))
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
                f"{first.spec.health_url}: {last.get(first.name)})\n" + first.describe_failure("never became healthy")
            )
        time.sleep(interval_s)
    return time.monotonic() - t0


__all__ = [
    "ENDINGS",
    "HEALTH_PROBE_TIMEOUT_S",
    "FATAL_LOG_LINES",
    "ManagedProcess",
    "check_port_free",
    "fatal_log_line",
    "RemoteNode",
    "RemoteServer",
    "probe",
    "wait_healthy",
]
