"""Token keys and the longest-common-prefix comparator: the one key primitive of every tree.

A key is the bytes of packed native int32 token ids (`as_key`), so comparing two keys' slices
is one memcmp in C (`bytes.startswith`), never a loop over tokens in Python. Every radix tree
of the project (`RadixCache`, `TraceIndex`, LBGR's trackers, the cache-aware router's
approximate tree) keys its nodes this way and finds where two keys part with
`common_prefix_len`. The approximate tree also keys by characters (`str`, the real router's
text mode); the comparator is generic over the unit for that reason.
"""

from __future__ import annotations

import numpy as np

TOKEN_BYTES = 4  # a key holds each token id as one native int32
_NDARRAY = np.ndarray
_INT32 = np.dtype(np.int32)
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def as_key(tokens) -> bytes:
    """Token ids -> the key: bytes of packed native int32 (converted once).

    Accepts an int32 numpy array (no copy beyond `tobytes`), any integer array or sequence
    (range-checked), or bytes / bytearray / memoryview already in the key format.
    """
    if type(tokens) is _NDARRAY and tokens.dtype is _INT32 and tokens.ndim == 1:  # the common case, first
        return tokens.tobytes()
    if type(tokens) is bytes:
        if len(tokens) & 3:
            raise ValueError(
                f"a bytes key must hold packed int32 token ids (length a multiple of 4), got {len(tokens)} bytes"
            )
        return tokens
    if isinstance(tokens, (bytearray, memoryview)):
        return as_key(bytes(tokens))
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == np.int32:
        return arr.tobytes()
    if arr.size == 0:
        return b""
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be integer ids, got dtype {arr.dtype}")
    if int(arr.min()) < _INT32_MIN or int(arr.max()) > _INT32_MAX:
        raise ValueError("token ids must fit in int32")
    return arr.astype(np.int32).tobytes()


def key_prefix(key: bytes, n_tokens: int) -> bytes:
    """The key of the first `n_tokens` tokens of `key`."""
    return key[: n_tokens * TOKEN_BYTES]


def key_slice(key: bytes, start: int, stop: int) -> bytes:
    """The key of tokens start..stop-1 of `key`."""
    return key[start * TOKEN_BYTES : stop * TOKEN_BYTES]


def key_to_tokens(key: bytes) -> np.ndarray:
    """The key's token ids as a read-only int32 view (no copy)."""
    return np.frombuffer(key, dtype=np.int32)


def common_prefix_len(key, pos: int, other, unit: int = 4) -> int:
    """Positions (a multiple of `unit`) that key[pos:] and `other` share.

    `key` and `other` are both bytes (unit 4: packed int32 tokens) or both str (unit 1:
    characters); whole units only. Precondition (every tree's case: the child was found by
    its first unit): the first unit is equal, so the result is >= unit. Long token runs: one
    vectorised numpy comparison; otherwise a C-level `startswith` on the not yet verified
    part, then a binary search with `startswith` (cheaper than numpy's call overhead).
    """
    hi = min(len(other), len(key) - pos) // unit  # units; invariant below: lo match, hi do not
    if hi > 256 and unit == 4 and type(key) is bytes:
        ne = np.frombuffer(key, np.int32, hi, pos) != np.frombuffer(other, np.int32, hi)
        i = int(ne.argmax())
        return (i if ne[i] else hi) << 2
    if key.startswith(other[unit : hi * unit], pos + unit):
        return hi * unit
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if key.startswith(other[lo * unit : mid * unit], pos + lo * unit):
            lo = mid
        else:
            hi = mid
    return lo * unit
