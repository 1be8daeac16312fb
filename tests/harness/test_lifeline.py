"""repro.lifeline.die_with_sweep arms only a direct child of the process mark_sweep_process named,
and that process only while its pid still names it (start time checked)."""

from __future__ import annotations

import os
import subprocess
import sys

from repro import lifeline

CHILD = "from repro.lifeline import die_with_sweep; print(die_with_sweep())"


def _child(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != lifeline.SWEEP_ENV}
    if env_value is not None:
        env[lifeline.SWEEP_ENV] = env_value
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout


def test_only_a_child_of_the_marked_process_is_armed(monkeypatch):
    monkeypatch.delenv(lifeline.SWEEP_ENV, raising=False)
    lifeline.mark_sweep_process()
    marked = os.environ[lifeline.SWEEP_ENV]
    pid, _, started = marked.partition(":")
    assert pid == str(os.getpid()) and started.isdigit()
    assert _child(marked) == "True\n"
    assert _child(f"{pid}:{int(started) + 1}") == "False\n"  # the pid reused by another process
    assert _child(f"{os.getppid()}:{started}") == "False\n"  # a grandchild / another process
    assert _child(None) == "False\n" and _child("garbage") == "False\n"
    assert lifeline.die_with_sweep() is False  # the marked process itself


def test_a_parent_gone_before_arming_still_gets_one_sigterm():
    """The kernel only signals for a death after the prctl: a parent that is already gone (here: a pid
    that never was the parent) gets the watchdog's SIGTERM, not the os._exit(143) of the grace period."""
    import signal

    code = "import time; from repro.lifeline import die_with_parent; die_with_parent(1); time.sleep(120)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
