"""Test-only backend declaring PLAIN_CONFIG: it checks it gets a plain dict of its own, then
runs as the fake backend (tests/harness/fake_backend.py)."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.harness import fake_backend

PLAIN_CONFIG = True


def run_cell(cfg, progress=None):
    if type(cfg) is not dict or type(cfg["workload"]) is not dict:
        raise TypeError(f"PLAIN_CONFIG backend got {type(cfg).__name__}")
    result = fake_backend.run_cell(OmegaConf.create(cfg), progress)
    cfg["policy_name"] = "changed_by_the_backend"  # its own copy: the cell's files must not see it
    return result
