"""Backends: `sim` (embedded discrete-event simulator) and `sglang` (live servers, optional extra)."""
