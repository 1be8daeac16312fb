"""Helpers for the workload tests (imported as `from wl_helpers import ...`)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def wl_cfg(workload: str, **overrides) -> dict:
    """conf/workload/<workload>.yaml as a plain dict, with overrides merged in."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{workload}.yaml"), resolve=True)
    return _merge(cfg, overrides)


def requests_equal(a, b) -> bool:
    """Field-by-field equality of two request lists (arrays compared by value)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (x.id, x.arrival_s, x.output_len, x.group_id, x.conversation_id, x.turn, x.text) != (
            y.id, y.arrival_s, y.output_len, y.group_id, y.conversation_id, y.turn, y.text
        ):
            return False
        if not (np.array_equal(x.prompt_tokens, y.prompt_tokens) and np.array_equal(x.generated_tokens, y.generated_tokens)):
            return False
    return True
