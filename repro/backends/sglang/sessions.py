"""The processes of a session, found by /proc/<pid>/stat, and ending them (a server's teardown).

Why not by environment: SGLang's scheduler and detokenizer rename themselves (setproctitle), which
blanks their /proc/<pid>/environ, but they stay in the session (and process group) their server
started in; every process the harness starts leads its own session (sid = its pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

SESSION_GONE_S = 10.0  # how long teardown waits for a session's last processes to go after SIGKILL


def _proc_stat(pid: str) -> tuple[str, int, int, int] | None:
    """(state, ppid, process group, session) of /proc/<pid>, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    out = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = _proc_stat(entry.name)
                if st is not None and st[3] == sid and st[0] != "Z":
                    out.append(int(entry.name))
    return out


def end_session(sid: int, wait_s: float = SESSION_GONE_S) -> list[int]:
    """SIGKILL every process still in session `sid` (one that left the process group too), wait up
    to wait_s for them to go; returns those still there (their pids)."""
    end = time.monotonic() + wait_s
    left = session_members(sid)
    while left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= end:
            break
        time.sleep(0.05)
        left = session_members(sid)
    return left


__all__ = ["SESSION_GONE_S", "end_session", "session_members"]
