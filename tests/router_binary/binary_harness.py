"""Drive the real router binaries (sglang-router 0.3.2, smg 1.13.0, 0.1.4, 0.1.5) in front of fake workers
that hold every request. What differs between the binaries lives in `BINARIES` (one place).

- `HoldingWorkers`: aiohttp apps on 127.0.0.1 (free ports) in the test's event loop. Each
  /generate records which worker got it (by the request's `rid`, which the router forwards),
  then waits until the test releases it, so the router's in-flight counts are exact.
- `RealRouter`: `python -m <launcher>` from the binary's venv (make router-env),
  bound to 127.0.0.1 with its Prometheus endpoint on another free 127.0.0.1 port, debug log to
  a file (the log tells how many empty-key inserts start-up made, i.e. the tree's epoch, and
  when the background trim ran). Ready = `/readiness` answers 200 (`/health` answers before
  any worker is registered). Stopped by PID (its process group), bounded waits everywhere.
- `Driver`: one request at a time through the real router, the same key through two of our
  routers: `step` gets the real router's loads (GET /workers) before every decision and then
  commits the real decision; `closed` runs on its own bookkeeping. Labels are our worker
  ids = position in --worker-urls; the real registry order is read from GET /workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from repro.backends.sglang.orchestrate import free_ports
from repro.backends.sglang.protocol import serve_app

REPO = Path(__file__).resolve().parents[2]
ROUTER_VERSION = "0.3.2"
STEP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Binary:
    """One real router release: where its venv is, how to start it, what its log says."""

    dist: str  # the PyPI distribution
    version: str
    launcher: str  # python -m <launcher>
    venv: str  # default venv, relative to the repo (make router-env builds it)
    env_var: str  # overrides the venv's interpreter
    args: tuple[str, ...] = ()  # added to every start
    # a debug-log line per routing decision: (marker, regex of its branch), if the binary writes one
    decision_log: tuple[str, str] | None = None
    # 0.1.x has no GET /workers nor /readiness: it serves only once every worker is healthy, so
    # /health (forwarded to a worker) is its readiness; 0.1.4 has no Prometheus endpoint either
    modern: bool = True
    prometheus: bool = True


BINARIES = {
    "0.3.2": Binary("sglang-router", "0.3.2", "sglang_router.launch_router", ".venv-router", "REPRO_ROUTER_PYTHON"),
    # smg polls every worker's load by default (our fake workers report none: a "dark fleet") and
    # vetoes overloaded workers; both read the workers' own reports, which these workers never send.
    "smg_1_13": Binary("smg", "1.13.0", "smg.launch_router", ".venv-router", "REPRO_ROUTER_PYTHON",
                       decision_log=("Cache-aware selection", r'branch="([a-z_]+)"')),
    # its own venv: it ships the same `sglang_router` module as 0.3.2
    "0.1.4": Binary("sglang-router", "0.1.4", "sglang_router.launch_router", ".venv-router014",
                    "REPRO_ROUTER014_PYTHON", args=("--worker-startup-check-interval", "1"), modern=False,
                    prometheus=False),
    # 0.1.4's cache-aware code with a request reader that reads `text`; it re-serializes the body
    # (dropping `rid`: the workers read the request id from a header then)
    "0.1.5": Binary("sglang-router", "0.1.5", "sglang_router.launch_router", ".venv-router015",
                    "REPRO_ROUTER015_PYTHON", args=("--worker-startup-check-interval", "1"), modern=False),
}
RID_HEADER = "X-Test-Rid"


def router_python(binary: str = "0.3.2") -> Path | None:
    """The binary's venv interpreter ($<env_var>, else its default venv), if it has the wheel."""
    b = BINARIES[binary]
    env = os.environ.get(b.env_var)
    py = Path(env) if env else REPO / b.venv / "bin" / "python"
    if not py.exists():
        return None
    probe = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({b.dist!r}))"],
        capture_output=True, text=True, timeout=60,
    )
    return py if probe.returncode == 0 and probe.stdout.strip() == b.version else None


# ------------------------------------------------------------------------------- workers
class HoldingWorkers:
    def __init__(self, n: int) -> None:
        self.n = n
        self.runners: list = []
        self.ports: list[int] = []
        self.arrived: dict[str, asyncio.Future] = {}
        self.holds: dict[str, asyncio.Event] = {}
        self.bodies: dict[str, dict] = {}

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def _app(self, wid: int) -> web.Application:
        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            rid = body.get("rid") or request.headers.get(RID_HEADER)
            self.bodies[rid] = body
            fut = self.arrived.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(wid)
            hold = self.holds.setdefault(rid, asyncio.Event())
            await asyncio.wait_for(hold.wait(), 120)
            return web.json_response({
                "text": "ok", "output_ids": [1],
                "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": 1},
                              "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0},
            })

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def model_info(request: web.Request) -> web.Response:
            return web.json_response({"model_path": "fake-model", "is_generation": True})

        app = web.Application()
        app.router.add_post("/generate", generate)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, health)
        for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info"):
            app.router.add_get(path, model_info)
        return app

    async def start(self) -> None:
        for wid in range(self.n):
            runner, port = await serve_app(self._app(wid), "127.0.0.1", 0)
            self.runners.append(runner)
            self.ports.append(port)

    def expect(self, rid: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.arrived[rid] = fut
        return fut

    def release(self, rid: str) -> None:
        self.holds.setdefault(rid, asyncio.Event()).set()

    async def stop(self) -> None:
        for ev in self.holds.values():
            ev.set()
        for r in self.runners:
            await r.cleanup()


# ------------------------------------------------------------------------------- router
logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the router probes workers with HTTP/2 first
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RealRouter:
    def __init__(self, python: Path, worker_urls: list[str], policy: str, args: list[str], log_path: Path,
                 binary: str = "0.3.2") -> None:
        self.binary = BINARIES[binary]
        self.port, self.prom_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(python), "-m", self.binary.launcher, "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *worker_urls, "--policy", policy,
        ]
        if self.binary.prometheus:
            self.cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port)]
        if self.binary.modern:
            self.cmd += ["--log-level", "debug"]
        self.cmd += [*self.binary.args, *args]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._offset = self._evictions = self._init_epochs = 0
        self.branches: list[str] = []  # the binary's own branch per decision, where it logs one

    def start(self) -> None:
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return _ANSI.sub("", self.log_path.read_text(errors="replace"))

    def _scan(self) -> None:
        """Read the log's new complete lines (the debug log grows by ~1 MB a scenario)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in _ANSI.sub("", chunk[:end].decode(errors="replace")).splitlines():
            if "Cache eviction completed for model" in line or "String tree eviction completed for model" in line:
                self._evictions += 1
            log = self.binary.decision_log
            if log is not None and log[0] in line:
                self.branches.append(re.search(log[1], line).group(1))
            m = re.search(r"Initializing cache-aware policy with (\d+) workers", line)
            if m:
                self._init_epochs += int(m.group(1))

    def init_epochs(self) -> int:
        """Empty-key inserts start-up made: one per worker per `init_workers` call."""
        self._scan()
        return self._init_epochs

    def evictions(self) -> int:
        """Background trims run so far."""
        self._scan()
        return self._evictions

    async def wait_ready(self, session: aiohttp.ClientSession, n_workers: int, timeout_s: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary.dist} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                async with session.get(f"{self.url}/{'readiness' if self.binary.modern else 'health'}") as r:
                    if r.status == 200 and not self.binary.modern:
                        return []
                    if r.status == 200:
                        workers = await self.workers(session)
                        if len(workers) == n_workers and all(w["is_healthy"] for w in workers):
                            return workers
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.binary.dist} not ready within {timeout_s}s:\n{self.log()[-3000:]}")

    async def workers(self, session: aiohttp.ClientSession) -> list[dict]:
        async with session.get(f"{self.url}/workers") as r:
            r.raise_for_status()
            return (await r.json())["workers"]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


# ------------------------------------------------------------------------------- driver
@dataclass
class Tally:
    decisions: int = 0
    step_agree: int = 0
    closed_agree: int = 0
    branches: dict = field(default_factory=dict)
    disagreements: list = field(default_factory=list)

    def line(self, name: str) -> str:
        return (f"{name}: {self.decisions} decisions, step-by-step {self.step_agree}/{self.decisions}, "
                f"closed-loop {self.closed_agree}/{self.decisions}, branches {dict(sorted(self.branches.items()))}")


class Driver:
    """Sends requests one at a time; compares every decision (see the module docstring)."""

    def __init__(self, workers: HoldingWorkers, router: RealRouter, session: aiohttp.ClientSession) -> None:
        self.workers, self.router, self.session = workers, router, session
        self.url_to_id = {u: i for i, u in enumerate(workers.urls)}
        self.tasks: dict[str, asyncio.Task] = {}
        self.in_flight: dict[str, int] = {}  # rid -> real worker id
        self.k = 0
        self.tally = Tally()

    async def registry_order(self) -> list[int]:
        return [self.url_to_id[w["url"]] for w in await self.router.workers(self.session)]

    async def real_loads(self) -> list[int]:
        loads = [0] * self.workers.n
        for w in await self.router.workers(self.session):
            loads[self.url_to_id[w["url"]]] = int(w["load"])
        return loads

    async def _post(self, body: dict) -> None:
        async with self.session.post(f"{self.router.url}/generate", json=body,
                                     headers={RID_HEADER: body["rid"]}) as r:
            await r.read()
            if r.status != 200:
                raise AssertionError(f"router answered {r.status} for {body.get('rid')}")

    async def send(self, body: dict) -> int:
        """Send one request; returns the real worker that received it (it stays held)."""
        rid = f"q{self.k}"
        self.k += 1
        body = dict(body, rid=rid, sampling_params={"max_new_tokens": 1})
        fut = self.workers.expect(rid)
        self.tasks[rid] = asyncio.create_task(self._post(body))
        done, _ = await asyncio.wait({fut, self.tasks[rid]}, timeout=STEP_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if fut not in done:
            if self.tasks[rid] in done:
                self.tasks[rid].result()
            raise TimeoutError(f"request {rid} reached no worker within {STEP_TIMEOUT_S}s")
        self.in_flight[rid] = fut.result()
        return fut.result()

    async def release(self, rids, closed=None) -> None:
        """Release held requests, wait for their replies and for the router's loads to drop."""
        rids = list(rids)
        for rid in rids:
            self.workers.release(rid)
        for rid in rids:
            await asyncio.wait_for(self.tasks.pop(rid), STEP_TIMEOUT_S)
            w = self.in_flight.pop(rid)
            if closed is not None:
                closed.release(w)
        if closed is not None:
            await self.wait_loads(closed.loads)

    async def wait_loads(self, expected: list[int]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            got = await self.real_loads()
            if got == list(expected):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"router loads {got} never reached {expected}")
            await asyncio.sleep(0.005)

    async def cache_aware_step(self, body: dict, key: str, step, closed, now_s: float) -> None:
        step.loads = await self.real_loads()
        s = step.decide(key, now_s)
        branch = step.last_branch
        c = closed.route_key(key, now_s)
        real = await self.send(body)
        step.commit(key, real)
        t = self.tally
        t.decisions += 1
        t.step_agree += s == real
        t.closed_agree += c == real
        t.branches[branch] = t.branches.get(branch, 0) + 1
        if s != real or c != real:
            t.disagreements.append((self.k - 1, branch, real, s, c, key[:40]))

    async def drain(self, closed=None) -> None:
        await self.release(list(self.in_flight), closed)

