"""Config helpers every layer shares (OmegaConf nodes in, plain Python out)."""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=None)
def _yaml_dumper() -> Any:
    """OmegaConf's YAML dumper (its representers: e.g. a str that reads as a number is quoted) on
    libyaml's emitter when PyYAML has it: the same text ~4x faster (config.yaml of every cell)."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    base = get_omega_conf_dumper()
    if not getattr(yaml, "__with_libyaml__", False):
        return base
    dumper = type("OmegaConfCDumper", (yaml.CDumper,), {})
    dumper.yaml_representers = dict(base.yaml_representers)
    dumper.yaml_multi_representers = dict(base.yaml_multi_representers)
    return dumper


def _printable_ascii(obj: Any) -> bool:
    if isinstance(obj, str):
        return obj.isascii() and obj.isprintable()
    if isinstance(obj, Mapping):
        return all(_printable_ascii(k) and _printable_ascii(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_printable_ascii(v) for v in obj)
    return True


def to_yaml(cfg: Mapping) -> str:
    """`OmegaConf.to_yaml(OmegaConf.create(cfg), sort_keys=True)` of a plain (resolved) config,
    without building the node (tests/test_confutil.py checks the text is the same). libyaml
    escapes some characters the Python emitter prints (U+0085, astral planes...): a config
    with any string beyond printable ASCII takes OmegaConf's own dumper."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    cfg = to_plain(cfg)
    dumper = _yaml_dumper() if _printable_ascii(cfg) else get_omega_conf_dumper()
    return yaml.dump(cfg, Dumper=dumper, default_flow_style=False, allow_unicode=True, sort_keys=True)
