"""On-disk cache of tokenised workload pools.

Directory: `$REPRO_CACHE_DIR`, default `.cache/workloads` under the current directory.
A pool file is keyed by sha256 of: the workload config (minus the knobs applied after
loading: request rate and order), the seed, the data file's sha256, the tokenizer's
identity and the code the workload's module runs (its import closure, repro.codehash: the
cells' fingerprint mechanism; so changing a generator can never serve a stale pool). Files are written atomically (temp + rename); each starts with a
magic string and the sha256 of its payload, so a truncated or corrupt file is
detected on read, reported, and rebuilt.

Hashing a 120 MB data file costs ~0.3 s, too much for every cell of a grid, so checksums of
files over 1 MiB are memoised in `checksums.json` keyed by (real path, device, inode, size,
mtime_ns, ctime_ns): git's index trusts the same stat fields. Smaller files are always hashed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO, Callable

from repro import codehash
from repro.fileio import sha256_file, sha256_json, write_json_atomic, write_stream_atomic

log = logging.getLogger(__name__)

MAGIC = b"REPROWL1"
_DIGEST_LEN = 32
_CHUNK = 1 << 22


def cache_dir() -> Path:
    return Path(os.environ.get("REPRO_CACHE_DIR", ".cache/workloads"))


def code_fingerprint(module: str) -> str:
    """sha256 of the code a workload module runs (part of every cache key): its import closure by
    repro.codehash, the mechanism of the cells' fingerprints (docstrings and comments do not count;
    an out-of-tree workload's own code does)."""
    from repro.confutil import PROJECT_ROOT

    return sha256_json(codehash.code_fingerprint([module], root_dir=PROJECT_ROOT))


# Files up to this size are hashed on every call: cheaper than a memo that might be wrong.
ALWAYS_HASH_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a data file; a large one is memoised in checksums.json by (real path, stat
    identity: device, inode, size, mtime, ctime), so an edit that keeps the size and puts the
    mtime back is still seen (ctime cannot be set back)."""
    path = Path(path)
    st = path.stat()
    if st.st_size <= ALWAYS_HASH_BYTES:
        return sha256_file(path)
    memo_key = "|".join([str(path.resolve()), *map(str, codehash.stat_identity(st))])
    memo_path = cache_dir() / "checksums.json"
    memo: dict = {}
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    digest = memo.get(memo_key)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    digest = sha256_file(path)
    memo[memo_key] = digest
    try:
        write_json_atomic(memo_path, memo)
    except OSError as exc:  # a read-only cache dir only costs speed
        log.warning("could not write checksum memo %s: %s", memo_path, exc)
    return digest


def cache_key(payload: dict) -> str:
    return sha256_json(payload)


def pool_path(name: str, key: str) -> Path:
    return cache_dir() / f"{name}-{key[:32]}.pool"


def open_payload(path: Path):
    """The cache file open at its payload (a binary file object; the caller closes it), or None if
    it is missing or corrupt (corruption is logged). The checksum is checked by reading the file
    in chunks, so a large pool is never held as one bytes object."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("workload cache %s unreadable (%s); rebuilding", path, exc)
        return None
    try:
        head = f.read(len(MAGIC) + _DIGEST_LEN)
        if len(head) < len(MAGIC) + _DIGEST_LEN or not head.startswith(MAGIC):
            log.warning("workload cache %s has a bad header; rebuilding", path)
            f.close()
            return None
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
        if h.digest() != head[len(MAGIC) :]:
            log.warning("workload cache %s fails its checksum (truncated or corrupt); rebuilding", path)
            f.close()
            return None
        f.seek(len(head))
        return f
    except OSError as exc:
        f.close()
        log.warning("workload cache %s unreadable (%s); rebuilding", path, exc)
        return None


def read_payload(path: Path) -> bytes | None:
    """Payload of a cache file, or None if it is missing or corrupt (corruption is logged)."""
    f = open_payload(path)
    if f is None:
        return None
    with f:
        return f.read()


class _HashingWriter(io.RawIOBase):
    """Write-only, not seekable (so zipfile streams, never seeks back): hashes what passes."""

    def __init__(self, f):
        self.f, self.h, self.pos = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.h.update(b)
        n = self.f.write(b)
        self.pos += n
        return n

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        self.f.flush()


def write_stream(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a cache file whose payload `write(f)` produces, atomically (temp file + rename, fsynced):
    MAGIC, the payload's sha256, the payload -- streamed, never held in memory whole."""

    def body(f: BinaryIO) -> None:
        f.write(MAGIC + bytes(_DIGEST_LEN))  # the digest's place, filled in once the payload is written
        w = _HashingWriter(f)
        write(w)
        f.seek(len(MAGIC))
        f.write(w.h.digest())

    write_stream_atomic(path, body)


def write_payload(path: Path, payload: bytes) -> None:
    write_stream(path, lambda f: f.write(payload))
