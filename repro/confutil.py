"""Config helpers every layer shares (OmegaConf nodes in, plain Python out)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

# The checkout (or the editable install's source tree) and its Hydra config root: every composer uses these.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = PROJECT_ROOT / "conf"


def to_plain(node: Any) -> Any:
    """An OmegaConf node as plain dicts/lists with interpolations resolved; anything else as is."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def is_int(v: Any) -> bool:
    """An integer config value (a bool is not one, though Python says it is)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float config value (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_positive(v: Any) -> bool:
    return is_number(v) and v > 0


def get_path(cfg: Mapping, dotted: str, default: Any = None) -> Any:
    """cfg["a"]["b"] for "a.b"; `default` when any part is missing or not a mapping."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def flatten(cfg: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": {}} -> {"a.b": 1, "c": {}}: nested mappings as dotted keys; an empty
    mapping and every non-mapping value (lists included) is a leaf."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
