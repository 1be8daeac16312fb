"""Issue 34 (1): a pool worker dies with its parent from its first instruction.

The parent is a script run as a process; its worker, importing the parent's main module
(`__mp_main__`, spawn's first import), writes its pid to a file and blocks there: the import
phase held open. The test kills the parent with -9 at that point and waits for the worker's exit.
Before: the worker armed PR_SET_PDEATHSIG only after its imports and stayed alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from repro.harness.boot import boot_command_line
from tests.harness.test_harness_trust import wait_for

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]
REPEAT = int(os.environ.get("REPRO_RELIABILITY_REPEAT", "3"))

PARENT = '''
import os, signal, sys
if __name__ == "__mp_main__":  # a worker importing this module: say so, then stay in the import
    with open(os.environ["BOOT_MARK"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    signal.pause()
if __name__ == "__main__":
    from repro.harness.pool import Task, run_cells
    run_cells([Task(os.getpid), Task(os.getpid)], 2, lambda out: None)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _kill_parent_mid_import(script: Path, mark: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BOOT_MARK": str(mark)}
    p = subprocess.Popen([sys.executable, str(script)], cwd=script.parent, env=env)
    pids: list[int] = []
    try:
        wait_for(lambda: mark.exists() and len(mark.read_text().split()) >= 2, 120, "both workers to import")
        pids = [int(x) for x in mark.read_text().split()]
        assert all(_alive(pid) for pid in pids)
        p.kill()
        p.wait()
        # a safety net only: they go at once (PR_SET_PDEATHSIG)
        wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "the workers to die with their parent")
    finally:
        p.kill()
        p.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_parent_killed_mid_import_takes_its_workers_along(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    for k in range(REPEAT):
        _kill_parent_mid_import(script, tmp_path / f"mark{k}")


def test_a_worker_whose_parent_died_before_it_armed_ends_at_once():
    """The race: the parent gone before the prctl (the worker was re-parented). The boot line
    compares getppid() with the parent's pid it was given and ends (143) before importing."""
    cmd = boot_command_line(os.getpid() + 999_999, tracker_fd=-1, pipe_handle=-1)  # not our pid
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 143, r.stderr
    r = subprocess.run(boot_command_line(os.getpid(), tracker_fd=-1, pipe_handle=-1), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 143 and "spawn_main" in r.stderr  # its parent alive: it goes on to spawn_main
