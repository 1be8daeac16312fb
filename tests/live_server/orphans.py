"""Finding the processes a test left behind: by process tree and session, not only by environment.

A test marks its environment (MARK_VAR=<mark>), so every process it starts inherits the mark. But
SGLang's scheduler and detokenizer rename themselves (setproctitle), which blanks their
/proc/<pid>/environ: an orphaned scheduler carries no mark any more. They keep their session (the
harness starts every process as the leader of its own session) and, with this process a child
subreaper (`watch`), they stay in its process tree when their parent dies. So a leftover is any
live process that
- carries the mark in its environment, or
- is in the session of one that does (a renamed child of a marked leader), or
- descends from this process, in another session than its own, and was not there when the mark
  was made (the test's own children are all gone by the time it checks).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

MARK_VAR = "REPRO_TEST_MARK"
_PR_SET_CHILD_SUBREAPER = 36
_baselines: dict[str, set[int]] = {}  # mark -> this process's descendants when the mark was made


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of pid, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[3])


def _table() -> dict[int, tuple[str, int, int]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                out[int(entry.name)] = st
    return out


def _descendants(table: dict[int, tuple[str, int, int]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def watch(mark: str) -> None:
    """Make this process a child subreaper (orphans of its descendants are re-parented to it, not
    to init) and remember its descendants now: they are not the marked test's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    _baselines[mark] = _descendants(_table(), os.getpid())


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment carries MARK_VAR=mark (zombies excluded): blind to
    processes that renamed themselves."""
    needle = f"{MARK_VAR}={mark}".encode()
    pids = []
    for pid, (state, _, _) in _table().items():
        if state == "Z":
            continue
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.append(pid)
        except OSError:
            continue
    return pids


def leftover_pids(mark: str) -> list[int]:
    """Live processes of the test of `mark` (the module docstring's three rules), zombies excluded."""
    me, my_sid = os.getpid(), os.getsid(0)
    table = _table()
    marked = set(marked_pids(mark)) - {me}
    sessions = {table[p][2] for p in marked if p in table} - {my_sid}
    found = marked | {p for p, (_, _, sid) in table.items() if sid in sessions}
    if mark in _baselines:
        tree = _descendants(table, me) - _baselines[mark]
        found |= {p for p in tree if table[p][2] != my_sid}
    return sorted(p for p in found if p in table and table[p][0] != "Z" and p != me)


def wait_no_orphans(mark: str, timeout_s: float = 60.0) -> list[int]:
    """Processes of `mark` still alive once teardown has had timeout_s (a bound, not a pass condition:
    the caller asserts the list is empty). Stragglers are killed so that one failure stays one."""
    end = time.monotonic() + timeout_s
    left = leftover_pids(mark)
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = leftover_pids(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
