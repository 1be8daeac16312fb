"""Run signatures and the atomic, resumable result store (ARCHITECTURE.md "Result files")."""

from repro.results.signature import run_signature, signature_payload
from repro.results.store import CellStore

__all__ = ["CellStore", "run_signature", "signature_payload"]
