"""Helpers for the Slurm tests: run a Hydra multirun, poll sacct, read result folders."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE_APP = REPO / "tests" / "slurm" / "fixture_app" / "app.py"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "REQUEUED"}


@dataclass(frozen=True)
class App:
    """A Hydra app with the harness's result layout and a small experiment to sweep."""

    name: str
    cmd: tuple[str, ...]
    exp: str
    grid: tuple[str, ...] = ()  # extra overrides that make the grid small
    cells: int = 4
    fault_grid: tuple[str, ...] = ()  # overrides for a 2-cell grid (fault tests kill array task 1)
    env: dict = field(default_factory=dict)


FIXTURE = App("fixture", (sys.executable, str(FIXTURE_APP)), "toy_grid", cells=4, fault_grid=("seed=0",))


def harness_app() -> App | None:
    """`python -m repro.run` on the harness's own tiny end-to-end experiment (2 policies x 2 rates, fake
    backend), once the harness is in this tree; None before."""
    conf = REPO / "tests" / "harness" / "conf"
    if not (REPO / "repro" / "run.py").exists() or not (conf / "exp" / "tiny.yaml").exists():
        return None
    return App("repro.run", (sys.executable, "-m", "repro.run", "--config-dir", str(conf)), "tiny", cells=4,
               fault_grid=("workload.request_rate=6.0",))


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the test process dies, even by SIGKILL, so that no Hydra process
    is left polling sacct for a cluster that .ci/slurm_down.sh has already stopped (Linux prctl)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def unique_name(prefix: str = "repro-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def multirun(app: App, results: Path, sweep: Path, *overrides: str, launcher: str | None = "slurm",
             timeout: float = 240, extra_env: dict | None = None, background: bool = False):
    """`<app> -m exp=<exp> [hydra/launcher=...] ...` with results in `results`; returns the CompletedProcess
    (or the Popen when background=True). Runs from the repository root, like launchers/slurm_sweep.sh."""
    cmd = [*app.cmd, "-m", f"exp={app.exp}", *app.grid, f"hydra.sweep.dir={sweep}"]
    if launcher:
        cmd.append(f"hydra/launcher={launcher}")
    cmd += list(overrides)
    env = {**os.environ, **app.env, "REPRO_RESULTS_DIR": str(results), "WANDB_MODE": "offline",
           "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "1", **(extra_env or {})}
    if background:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=die_with_parent)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=die_with_parent)


def sacct_rows(job_name: str, expect: int, timeout: float = 30, duplicates: bool = False) -> list[dict]:
    """Allocation rows (-X) of the jobs named job_name, polled until `expect` rows are in a final state
    (accounting reaches slurmdbd a few seconds after a job ends)."""
    cols = ["JobID", "JobIDRaw", "State", "ExitCode", "NodeList", "AllocTRES"]
    cmd = ["sacct", "-X", "-P", "-n", "-S", "now-2hours", "--name", job_name, "-o", ",".join(cols)]
    if duplicates:
        cmd.append("-D")
    deadline = time.monotonic() + timeout
    rows: list[dict] = []
    while True:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        rows = [dict(zip(cols, line.split("|"))) for line in out.splitlines() if line.strip()]
        final = [r for r in rows if r["State"].split()[0] in FINAL_STATES]
        if len(final) >= expect or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def squeue_ids(job_name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "--name", job_name, "-o", "%i %T"],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cancel_by_name(job_name: str) -> None:
    """Test clean-up: nothing a test submitted stays queued."""
    subprocess.run(["scancel", "--name", job_name], capture_output=True, timeout=30)


def cell_files(results: Path, names=("summary.json", "requests.parquet")) -> dict[str, dict[str, bytes]]:
    """{signature: {file name: bytes}} for every cell folder under results/<exp>/."""
    out: dict[str, dict[str, bytes]] = {}
    for summary in sorted(results.glob("*/*/summary.json")):
        cell = summary.parent
        out[f"{cell.parent.name}/{cell.name}"] = {n: (cell / n).read_bytes() for n in names if (cell / n).exists()}
    return out


def file_ids(results: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every result file: an atomic rewrite changes the inode."""
    return {str(p.relative_to(results)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(results.glob("*/*/*")) if p.is_file()}
