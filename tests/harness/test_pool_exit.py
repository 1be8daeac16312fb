"""repro.harness.pool: a released worker ends without interpreter teardown, losing no output."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("wandb_loaded", [False, True])
def test_exit_without_teardown_flushes_and_skips_exit_hooks_unless_wandb_is_loaded(wandb_loaded):
    out = run_python(f"""
        import atexit, sys, types
        from repro.harness import pool
        if {wandb_loaded}:
            sys.modules["wandb"] = types.ModuleType("wandb")  # its exit hook must get to run
        atexit.register(lambda: print(" exit hook", end=""))
        print("buffered", end="")
        pool._exit_without_teardown()
        print(" returned", end="")
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("buffered returned exit hook" if wandb_loaded else "buffered")


def test_released_workers_lose_no_output():
    out = run_python("""
        import functools
        from repro.harness import pool
        if __name__ == "__main__":
            feed = pool.Feed()
            done = []
            feed.put([pool.Task(functools.partial(print, end=""), (f"<task {i}>",), lambda v, e: done.append(e))
                      for i in range(4)])
            feed.close()
            pool.run_cells([], 2, lambda outcome: None, feed)
            assert done == [None] * 4, done
            print("<parent>")
    """)
    assert out.returncode == 0, out.stderr
    for text in ["<parent>"] + [f"<task {i}>" for i in range(4)]:
        assert text in out.stdout, out.stdout
