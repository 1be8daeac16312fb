"""How a cell's process ended, and what it left: a clean stop told from a death, renamed children found.

- `ManagedProcess.stop` records "stopped" (exited after our SIGTERM, whatever its code: SGLang's
  server SIGKILLs its own tree then, so -9), "killed" (our SIGKILL after the grace) or "died"
  (gone before we signalled it: on its own, or killed by someone else).
- A child that renames itself the way SGLang's scheduler does (setproctitle blanks its
  /proc/<pid>/environ) carries no test marker: the tests' orphan check finds it by session and
  process tree, and the teardown ends it by session even when it left the process group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from repro.backends.sglang.processes import ManagedProcess
from repro.backends.sglang.planning import ProcessSpec
from tests.live_server.orphans import MARK_VAR, leftover_pids, marked_pids, watch

# Blank this process's environment block as setproctitle does (env_start..env_end of /proc/self/stat).
BLANK_ENVIRON = (
    "import ctypes; f = open('/proc/self/stat', 'rb').read().rsplit(b')', 1)[1].split(); "
    "ctypes.memset(int(f[47]), 0, int(f[48]) - int(f[47]))"
)


def _process(tmp_path: Path, name: str, code: str) -> ManagedProcess:
    return ManagedProcess(ProcessSpec(name, [sys.executable, "-c", code], {}, str(tmp_path / f"{name}.log"), "http://x"))


def _wait_file(path: Path) -> str:
    while not (path.exists() and path.read_text().strip()):  # the child writes it once it is ready
        time.sleep(0.02)
    return path.read_text().strip()


def _gone(pid: int) -> bool:
    """Not running any more (a zombie counts as gone; one re-parented to us is reaped here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state == b"Z"


def test_a_clean_stop_is_told_from_a_kill_and_from_deaths(tmp_path):
    ready = tmp_path / "ready"
    # like SGLang's server: on SIGTERM it kills its own tree, itself included, with SIGKILL
    sglang_like = _process(tmp_path, "server", (
        "import os, signal, time; signal.signal(signal.SIGTERM, lambda *a: os.kill(os.getpid(), signal.SIGKILL)); "
        f"open({str(ready)!r}, 'w').write('1'); time.sleep(120)"))
    sglang_like.start()
    _wait_file(ready)
    assert sglang_like.stop(5.0) == -signal.SIGKILL
    assert sglang_like.exit_record() == {"exit_code": -9, "ended": "stopped", "left_in_session": []}

    deaf = _process(tmp_path, "deaf", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    f"open({str(tmp_path / 'deaf_ready')!r}, 'w').write('1'); time.sleep(120)")
    deaf.start()
    _wait_file(tmp_path / "deaf_ready")
    deaf.stop(0.3)
    assert deaf.exit_record()["ended"] == "killed" and deaf.exit_record()["exit_code"] == -9

    quits = _process(tmp_path, "quits", "import sys; sys.exit(3)")
    quits.start()
    quits.proc.wait()
    quits.stop(1.0)
    assert quits.exit_record() == {"exit_code": 3, "ended": "died", "left_in_session": []}

    # killed by someone else: the same code as a clean stop of SGLang's server, but a death
    victim = _process(tmp_path, "victim", f"import time; open({str(tmp_path / 'v')!r}, 'w').write('1'); time.sleep(120)")
    victim.start()
    _wait_file(tmp_path / "v")
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    victim.stop(1.0)
    assert victim.exit_record() == {"exit_code": -9, "ended": "died", "left_in_session": []}


@pytest.mark.parametrize("own_group", [False, True])
def test_a_renamed_orphan_is_found_by_session_and_ended_by_the_teardown(tmp_path, monkeypatch, own_group):
    """The leader starts a child that blanks its environment (and, with own_group, moves to its own
    process group, out of reach of the group signal), then dies on its own."""
    mark = f"orphan-{os.getpid()}-{own_group}"
    monkeypatch.setenv(MARK_VAR, mark)
    watch(mark)
    pidfile = tmp_path / "child.pid"
    child = (BLANK_ENVIRON + "; import os, time; " + ("os.setpgid(0, 0); " if own_group else "")
             + f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    leader = _process(tmp_path, "leader", (
        f"import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"while not (os.path.exists({str(pidfile)!r}) and os.path.getsize({str(pidfile)!r})): time.sleep(0.02)"))
    leader.start()
    gc = int(_wait_file(pidfile))
    leader.proc.wait()  # the leader is gone; its renamed child lives on, in its session
    try:
        assert f"{MARK_VAR}={mark}".encode() not in Path(f"/proc/{gc}/environ").read_bytes()
        assert gc not in marked_pids(mark)  # the environment check alone is blind to it
        assert gc in leftover_pids(mark)  # by session / process tree it is found
        leader.stop(1.0)
        assert leader.exit_record()["ended"] == "died" and leader.exit_record()["left_in_session"] == []
        assert _gone(gc)
        assert leftover_pids(mark) == []
    finally:
        if not _gone(gc):
            os.kill(gc, signal.SIGKILL)
