"""Config helpers every layer shares (OmegaConf nodes in, plain Python out)."""

from __future__ import annotations

from typing import Any, Mapping

from omegaconf import OmegaConf


def to_plain(node: Any) -> Any:
    """An OmegaConf node as plain dicts/lists with interpolations resolved; anything else as is."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def get_path(cfg: Mapping, dotted: str, default: Any = None) -> Any:
    """cfg["a"]["b"] for "a.b"; `default` when any part is missing or not a mapping."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
