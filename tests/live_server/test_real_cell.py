"""Whole harness cells on real SGLang servers (the cell starts and stops them) and their faults.

- `python -m repro.run +exp=live_cpu_gsp policy=lbgr_rlt` in a subprocess: a normal cell folder
  (summary, requests, time series, W&B offline run, logs), the servers' own eviction counts in the
  provenance, nothing left running.
- Faults, each failing fast with the server named and its log's tail, nothing half-written, no
  orphans: a bad server flag, a port in use, a model directory that does not exist (caught before
  anything starts), a server that never becomes healthy, a server that dies in the middle of a cell.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from tests.live_server.conftest import ROOT, server_python, wait_no_orphans

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(1800)]


def run_repro(results: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "repro.run", "+exp=live_cpu_gsp", f"results_dir={results}",
           f"backend.server.python={server_python()}", "tracking=offline", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)


def only_cell(results: Path) -> Path:
    cells = [d for d in (results / "live_cpu_gsp").iterdir() if d.is_dir()]
    assert len(cells) == 1, cells
    return cells[0]


def test_a_whole_cell_on_real_servers(tmp_path, test_mark):
    proc = run_repro(tmp_path, "policy=lbgr_rlt", "workload.request_rate=4.0")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cell = only_cell(tmp_path)
    for name in ("summary.json", "requests.parquet", "requests.sha256", "timeseries.parquet", "config.yaml",
                 "fingerprint.json", "timings.json"):
        assert (cell / name).is_file(), name
    assert list((cell / "wandb").glob("offline-run-*")), "no W&B offline run"
    summary = json.loads((cell / "summary.json").read_text())
    prov = summary["provenance"]
    assert summary["num_failed"] == 0 and summary["num_requests"] == 48
    assert prov["ran_on"] == "SGLang servers on CPU" and prov["policy_name"] == "LBGR+RLT"
    assert prov["versions"]["sglang"] == "0.5.23"  # asked of the servers' interpreter
    assert 0 < summary["hit_rate"] < 1
    # the servers' own eviction counts: 8 groups of 200-400-token prefixes do not fit 2 x 2048 tokens
    evictions = [e for e in prov["server_evictions"] if e]
    assert evictions and all(e["policy"] == "rlt" for e in evictions)
    records = pd.read_parquet(cell / "requests.parquet")
    assert (records["output_tokens"] == 4).all() and set(records["worker"]) <= {0, 1}
    # --enable-metrics (the default): each reply's queue time, so latency is taken apart live too
    assert records["queue_wait_s"].notna().all() and (records["queue_wait_s"] >= 0).all()
    parts = records["queue_wait_s"] + records["prefill_s"] + records["decode_s"]
    assert ((parts - (records["finish_s"] - records["arrival_s"])).abs() < 1e-6).all()
    assert 0 <= summary["wait_share_p50"] <= 1 and summary["regime"] in ("stable", "backlogged", "overloaded")
    logs = cell / "logs"
    for name in ("plan.json", "server0.log", "server1.log", "router.log", "client_report.json", "exit_codes.json"):
        assert (logs / name).is_file(), name
    assert "Tree cache initialized: source=registered('repro_radix') impl=RadixCache" in (logs / "server0.log").read_text()
    # a clean teardown: each process exited after our SIGTERM (SGLang's server with -9, its own kill)
    codes = json.loads((logs / "exit_codes.json").read_text())
    assert all(c["ended"] == "stopped" and c["left_in_session"] == [] for c in codes.values()), codes
    assert wait_no_orphans(test_mark) == []


def _assert_failed_cleanly(tmp_path: Path, proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cell = only_cell(tmp_path)
    error = (cell / "error.txt").read_text()
    for needle in needles:
        assert needle in error, error[-3000:]
    assert not (cell / "summary.json").exists() and not (cell / "requests.parquet").exists()
    return error


def test_bad_server_flag_fails_fast_with_the_log_tail(tmp_path, test_mark):
    proc = run_repro(tmp_path, "policy=round_robin_lru", "cluster.num_workers=1",
                     "backend.server.extra_args=[--no-such-flag]")
    error = _assert_failed_cleanly(tmp_path, proc, "server0 exited with code", "last lines of the log",
                                   "--no-such-flag")
    assert "unrecognized arguments" in error
    assert wait_no_orphans(test_mark) == []


def test_missing_model_dir_is_refused_before_anything_starts(tmp_path, test_mark):
    proc = run_repro(tmp_path, "policy=round_robin_lru", "backend.server.model_path=/nonexistent/model-dir")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "/nonexistent/model-dir" in proc.stderr + proc.stdout and "is not a directory" in proc.stderr + proc.stdout
    assert not (tmp_path / "live_cpu_gsp").exists() or not any((tmp_path / "live_cpu_gsp").iterdir())
    assert wait_no_orphans(test_mark, 5.0) == []


def test_server_that_never_becomes_healthy(tmp_path, test_mark):
    proc = run_repro(tmp_path, "policy=round_robin_lru", "cluster.num_workers=1", "backend.timeouts.server_start_s=2")
    _assert_failed_cleanly(tmp_path, proc, "not healthy after", "server0", "last lines of the log")
    assert wait_no_orphans(test_mark) == []


def _plan_one_server(tmp_path: Path, ports=None):
    """A one-server round-robin plan of the live experiment, built as the backend builds it."""
    from hydra import compose, initialize_config_dir

    from repro.backends import assembly
    from repro.backends.sglang.planning import plan_cell
    from repro.confutil import to_plain

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["exp=live_cpu_gsp", "policy=round_robin_lru", "cluster.num_workers=1",
                                           f"backend.server.python={server_python()}",
                                           "backend.timeouts.server_start_s=900", "workload.num_queries=24",
                                           "workload.request_rate=1.0"])
    cell = assembly.assemble(cfg, components=False)
    plan = plan_cell(to_plain(cfg), list(cell.plan.capacities), cell.plan.seeds, tmp_path / "logs", ports=ports)
    return plan, cell.requests


def test_port_in_use_fails_fast_naming_the_server(tmp_path, test_mark):
    from repro.backends.sglang.orchestrate import run_plan
    from repro.backends.sglang.planning import ServerStartError, free_ports

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        plan, requests = _plan_one_server(tmp_path, ports=[taken.getsockname()[1], free_ports(1)[0]])
        with pytest.raises(ServerStartError) as info:
            run_plan(plan, requests)
    finally:
        taken.close()
    message = str(info.value)
    assert "server0" in message and "already in use" in message and "not started" in message
    assert wait_no_orphans(test_mark) == []


def test_server_dying_mid_cell_fails_the_cell_fast(tmp_path, test_mark):
    from repro.backends.sglang.errors import ServerDiedError, ServerStartError
    from repro.backends.sglang.orchestrate import run_plan

    plan, requests = _plan_one_server(tmp_path)
    first_progress = threading.Event()

    def progress(_fraction: float) -> None:
        first_progress.set()

    outcome: dict = {}

    def run() -> None:
        try:
            run_plan(plan, requests, progress)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert first_progress.wait(900), "the replay never started"
    pid = _server_pid(plan)
    os.killpg(pid, signal.SIGKILL)
    t.join(600)
    assert not t.is_alive(), "the cell did not end after its server died"
    error = outcome.get("error")
    assert isinstance(error, ServerDiedError) and not isinstance(error, ServerStartError), error
    assert "server0 exited with code" in str(error) and "in the middle of the cell" in str(error)
    codes = json.loads((Path(plan.log_dir) / "exit_codes.json").read_text())
    assert codes["server0"]["ended"] == "died" and codes["server0"]["exit_code"] == -signal.SIGKILL, codes
    # its scheduler and detokenizer (renamed, no marker in their environment) were in its session
    assert wait_no_orphans(test_mark) == []


def _server_pid(plan) -> int:
    """The pid (= process group) of server0, found by its command line and the test's marker."""
    from tests.live_server.conftest import MARK_VAR

    port = plan.worker_urls[0].rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"repro.backends.sglang.server" in cmd and port.encode() in cmd and \
                f"{MARK_VAR}={os.environ[MARK_VAR]}".encode() in env and os.getpgid(int(entry.name)) == int(entry.name):
            return int(entry.name)
    raise AssertionError("server0's process not found")
