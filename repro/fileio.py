"""Atomic file writes and content digests, shared by every layer (results, workload cache, cost-model
calibration, tracking).

A file is written to a temp file in the same directory and renamed over the target, so a killed
process leaves either the old file or the new one, never half a file. By default the temp file is
fsynced before the rename (a machine crash cannot leave a renamed but empty file either); files
that can be rebuilt at any time (tracking's series and run files) pass `fsync=False`, because a
flush costs milliseconds per file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable


def _file_mode() -> int:
    """0666 minus the process umask: what open() would give, not mkstemp's private 0600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def write_atomic(path: str | os.PathLike, data: bytes | str, *, fsync: bool = True) -> Path:
    """Write `data` (str: UTF-8) to `path` atomically; creates the parent folders. Returns the path."""
    if isinstance(data, str):
        data = data.encode()
    return write_stream_atomic(path, lambda f: f.write(data), fsync=fsync)


def write_stream_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *, fsync: bool = True) -> Path:
    """Atomically write the file that `write(f)` produces on an open binary file (streamed: large
    payloads are never held whole); creates the parent folders. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # collaborators on shared storage can read results
        with os.fdopen(fd, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def dumps_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline (byte-stable)."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=True) + "\n"


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """`obj` as canonical JSON (dumps_json), written atomically."""
    return write_atomic(path, dumps_json(obj))


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes, read in 4 MiB chunks (data files reach 100+ MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """sha256 hex digest of `obj` as compact canonical JSON (sorted keys; non-JSON values as str()).
    Signatures, fingerprints and workload-cache keys are this digest: its bytes must never change."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


__all__ = ["FILE_MODE", "dumps_json", "sha256_file", "sha256_json", "write_atomic", "write_json_atomic"]
