"""Real SGLang 0.5.23 HTTP servers on this CPU (marker `sglang_server`; `make test-sglang-server`).

The servers run with .venv-sglang's interpreter (make sglang-server-env), the harness, router
service and client with the interpreter running pytest. Without that venv these tests are SKIPPED
with the reason; under CI=true such a skip FAILS the run (tests/conftest.py).

Memory: a server holds ~2.7 GB over three processes; no test here runs more than three at once.
Every server is started in its own process group and stopped (group SIGTERM, then SIGKILL) in a
finally block; `wait_no_orphans` finds what a test left behind by its marker variable, the
sessions of marked processes and this process's tree (orphans.py: SGLang's renamed children carry
no marker in /proc/<pid>/environ).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.live_server.orphans import MARK_VAR, leftover_pids, marked_pids, wait_no_orphans, watch

ROOT = Path(__file__).resolve().parents[2]
SERVER_PYTHON = Path(os.environ.get("REPRO_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
ROUTER_PYTHON = Path(os.environ.get("REPRO_ROUTER_PYTHON", ROOT / ".venv-router" / "bin" / "python"))
__all__ = ["MARK_VAR", "leftover_pids", "marked_pids", "router_python", "server_python", "wait_no_orphans", "watch"]


def server_python() -> str:
    if not SERVER_PYTHON.is_file():
        pytest.skip(f"no SGLang server environment at {SERVER_PYTHON} (make sglang-server-env)")
    return str(SERVER_PYTHON)


def router_python() -> str:
    if not ROUTER_PYTHON.is_file():
        pytest.skip(f"no sglang-router environment at {ROUTER_PYTHON} (make router-env)")
    return str(ROUTER_PYTHON)


@pytest.fixture
def test_mark(monkeypatch) -> str:
    """A marker variable in this test's environment, inherited by every process it starts; this
    process watches its tree from now on (orphans.watch)."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK_VAR, mark)
    watch(mark)
    return mark
