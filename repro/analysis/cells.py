"""Cells for the analysis tools: a resolved cell config from overrides, and runs cached by signature."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from repro.confutil import CONF_DIR
from repro.fileio import write_atomic


def compose_cell(overrides: Sequence[str]):
    """The resolved cell config for `overrides` (conf/config.yaml + overrides), without running Hydra's app."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from repro.harness.schema import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


def cached_run(overrides: Sequence[str], cache_dir: str | Path, compute: Callable[..., dict], suffix: str = "") -> dict:
    """compute(cfg) for the cell of `overrides`, cached in <cache_dir>/<run signature><suffix>.json.

    The run signature covers every result-affecting setting, the router's resolved keys
    included: a changed default is a new file, a changed code path is not (rerun with a fresh
    cache_dir after changing code).
    """
    from repro.harness.compose import cell_signature, resolve

    cfg = compose_cell(overrides)
    path = Path(cache_dir) / (cell_signature(resolve(cfg)) + suffix + ".json")
    if path.exists():
        return json.loads(path.read_text())
    out = compute(cfg)
    write_atomic(path, json.dumps(out, default=float))
    return out
