"""Shared fixtures for the router tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="session")
def conf_dir(tmp_path_factory) -> Path:
    """A copy of conf/ where group options other branches have not delivered yet are stubbed.

    Only missing files are added (eviction/{lru,rlt} come from the kvcache branch; the root
    defaults' model/hardware/... from others), so the test keeps checking the real files as
    they land.
    """
    out = tmp_path_factory.mktemp("conf") / "conf"
    shutil.copytree(CONF, out)
    root = yaml.safe_load((CONF / "config.yaml").read_text())
    needed = {("eviction", "lru"), ("eviction", "rlt")}
    for entry in root["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            if option is not None and not group.startswith("optional") and group not in ("policy", "exp"):
                needed.add((group, option))
    for group, option in needed:
        path = out / group / f"{option}.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            body = {"name": option, "granularity": "node"} if group == "eviction" else {"stub": True}
            path.write_text(yaml.safe_dump(body))
    return out
