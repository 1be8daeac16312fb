"""Test-only live backend: the fake backend's records, plus points streamed through progress.log
(what the SGLang client does as requests complete)."""

from __future__ import annotations

from tests.harness import fake_backend


def run_cell(cfg, progress=None):
    for k in range(5):
        if progress is not None and hasattr(progress, "log"):
            progress.log({"completed": 4 * k, "window/hit_rate": 0.1 * k})
    return fake_backend.run_cell(cfg, progress)
