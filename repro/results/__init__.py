"""Run signatures and the atomic, resumable result store (ARCHITECTURE.md "Result files")."""

from repro.results.signature import run_signature, signature_payload
from repro.results.store import CellStore, atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = [
    "CellStore",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "run_signature",
    "signature_payload",
]
