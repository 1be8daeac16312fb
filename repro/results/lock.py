"""One process per cell: a lock file that works on NFS and Lustre (docs/ARCHITECTURE.md "Locks").

`<cell>/.lock` is created with O_CREAT|O_EXCL (atomic on NFSv3+, Lustre and local disks; no
flock, which NFS sites often do not honour across nodes) and holds its owner as JSON: host,
pid, the process's start time and boot id (so a reused pid is not mistaken for the owner),
and a random token. While the lock is held a daemon thread touches it every HEARTBEAT_S.

A lock is dead, and may be broken, when
- its owner ran on this host (same hostname and boot id) and that process is gone, or
- its owner ran elsewhere and the file's mtime has not moved for `stale_after_s`
  (default 10 heartbeats) — clocks of the nodes must agree to within that (NTP; Slurm needs it too).
- it is empty and older than EMPTY_AFTER_S: its creator never wrote it (a full disk, a crash
  between create and write); broken with a warning instead of after `stale_after_s`.
A create whose write fails (ENOSPC) removes its file before the error goes on.
Breaking renames the dead file to a unique name first (atomic), so two processes breaking the
same dead lock cannot both win; the loser simply sees the winner's fresh lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path

from repro.results.store import CellStore

LOCK = CellStore.LOCK
HEARTBEAT_S = 15.0
STALE_AFTER_S = 10 * HEARTBEAT_S
EMPTY_AFTER_S = 1.0  # a creator writes its record microseconds after the create
log = logging.getLogger(__name__)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """Process start time in clock ticks since boot (Linux), "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    now = _start_time(pid)
    return not (start and now and now != start)


def owner_record() -> dict:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid": pid,
        "start": _start_time(pid),
        "token": secrets.token_hex(8),
        "since": time.time(),
    }


class LockBusy(RuntimeError):
    """The cell is being computed by another live process."""


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM until the block is done, then deliver them to the handlers as they were.
    Python-level (the handlers are swapped, not the thread's signal mask): the kernel may hand a
    process-directed signal to any thread (the lock's heartbeat, a watchdog), and Python then runs
    the handler in the main thread whatever that thread's mask says. Main thread only (where
    Python runs handlers); elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, lambda signum, frame: pending.append(signum))
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(pending):  # each held signal once, to the handler it would have met
            signal.raise_signal(s)


class CellLock:
    """Non-blocking lock on one cell folder. Use try_acquire()/release() or `with`."""

    def __init__(
        self, cell_dir: str | os.PathLike, *, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S
    ):
        self.path = Path(cell_dir) / LOCK
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.owner: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state of someone else's lock ---------------------------------------------------------
    def read_owner(self) -> dict | None:
        try:
            return json.loads(self.path.read_text() or "{}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # being written right now, or unreadable: judged by its mtime

    def is_dead(self, owner: dict | None = None) -> bool:
        owner = self.read_owner() if owner is None else owner
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return True
        age = time.time() - st.st_mtime
        if st.st_size == 0 and not owner:
            return age > EMPTY_AFTER_S
        if owner and owner.get("host") == socket.gethostname() and owner.get("boot_id", "") == _boot_id():
            try:
                return not _pid_alive(int(owner["pid"]), str(owner.get("start", "")))
            except (KeyError, TypeError, ValueError):
                pass
        return age > self.stale_after_s

    def held_by_other(self) -> bool:
        """True while another live process holds the lock (cheap: one read, one stat)."""
        if self.owner is not None:
            return False
        owner = self.read_owner()
        return owner is not None and not self.is_dead(owner)

    # -- acquire / release --------------------------------------------------------------------
    def try_acquire(self) -> bool:
        if self.owner is not None:
            return True
        for _ in range(3):
            me = owner_record()
            with signals_deferred():  # a stop between create and self.owner would orphan the file
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    fd = None
                except FileNotFoundError:  # a releaser removed the empty folder meanwhile
                    continue
                if fd is not None:
                    try:
                        with os.fdopen(fd, "w") as f:
                            json.dump(me, f)
                            f.flush()
                            os.fsync(f.fileno())
                    except OSError:  # a full disk: no empty lock may stay behind to stall the next run
                        with contextlib.suppress(OSError):
                            self.path.unlink()
                        raise
                    # NFS: a retransmitted create can succeed for someone else; trust the content only
                    if (self.read_owner() or {}).get("token") != me["token"]:
                        return False
                    self.owner = me
                    self._start_heartbeat()
                    return True
            if not self._break_if_dead():
                return False
        return False

    def _break_if_dead(self) -> bool:
        owner = self.read_owner()
        if owner is None:
            return True  # released meanwhile: try again
        if not self.is_dead(owner):
            return False
        if not owner:
            log.warning("%s: empty lock (its creator never wrote it: full disk or crash); broken", self.path)
        grave = self.path.with_name(f"{LOCK}.dead.{secrets.token_hex(6)}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return True
        try:
            moved = json.loads(grave.read_text() or "{}")
        except (OSError, ValueError):
            moved = {}
        if owner and moved.get("token") != owner.get("token"):
            # we moved a newer, live lock (someone broke the dead one first): give it back
            try:
                os.link(grave, self.path)
            except OSError:
                pass
            grave.unlink(missing_ok=True)
            return False
        grave.unlink(missing_ok=True)
        return True

    def still_mine(self) -> bool:
        return self.owner is not None and (self.read_owner() or {}).get("token") == self.owner["token"]

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.heartbeat_s):
                try:
                    os.utime(self.path)
                except OSError:
                    pass

        self._thread = threading.Thread(target=beat, name="cell-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Unlink the lock if still ours, and the cell folder if that leaves it empty (a stop
        cannot fall between: signals wait for the end)."""
        if self.owner is None:
            return
        with signals_deferred():
            self._stop.set()
            try:
                if self.still_mine():
                    self.path.unlink()
            except OSError:
                pass
            self.owner = None
            try:
                self.path.parent.rmdir()  # only if empty: an interrupted cell leaves no folder
            except OSError:
                pass

    def __enter__(self) -> "CellLock":
        if not self.try_acquire():
            raise LockBusy(f"{self.path.parent} is being computed by another process")
        return self

    def __exit__(self, *exc) -> None:
        self.release()
