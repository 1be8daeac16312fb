"""Real SGLang 0.5.23 HTTP servers on this CPU (marker `sglang_server`; `make test-sglang-server`).

The servers run with .venv-sglang's interpreter (make sglang-server-env), the harness, router
service and client with the interpreter running pytest. Without that venv these tests are SKIPPED
with the reason; under CI=true such a skip FAILS the run (tests/conftest.py).

Memory: a server holds ~2.7 GB over three processes; no test here runs more than three at once.
Every server is started in its own process group and stopped (group SIGTERM, then SIGKILL) in a
finally block; `no_orphans` checks /proc for processes that carry the test's marker variable.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_PYTHON = Path(os.environ.get("REPRO_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
ROUTER_PYTHON = Path(os.environ.get("REPRO_ROUTER_PYTHON", ROOT / ".venv-router" / "bin" / "python"))
MARK_VAR = "REPRO_TEST_MARK"


def server_python() -> str:
    if not SERVER_PYTHON.is_file():
        pytest.skip(f"no SGLang server environment at {SERVER_PYTHON} (make sglang-server-env)")
    return str(SERVER_PYTHON)


def router_python() -> str:
    if not ROUTER_PYTHON.is_file():
        pytest.skip(f"no sglang-router environment at {ROUTER_PYTHON} (make router-env)")
    return str(ROUTER_PYTHON)


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment carries MARK_VAR=mark (zombies excluded)."""
    needle = f"{MARK_VAR}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def wait_no_orphans(mark: str, timeout_s: float = 60.0) -> list[int]:
    """Processes of `mark` still alive once teardown has had timeout_s (a bound, not a pass condition:
    the caller asserts the list is empty). Stragglers are killed so that one failure stays one."""
    end = time.monotonic() + timeout_s
    left = marked_pids(mark)
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = marked_pids(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture
def test_mark(monkeypatch) -> str:
    """A marker variable in this test's environment, inherited by every process it starts."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK_VAR, mark)
    return mark
