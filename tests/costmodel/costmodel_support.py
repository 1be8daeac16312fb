"""Paths and loaders shared by the cost-model tests (the committed configs as plain dicts)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
MODELS = ("llama31_8b", "llama31_70b", "mixtral_8x7b")
HARDWARE = ("h200", "h100", "a100", "l40")


def load_conf(group: str, name: str) -> dict:
    return yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
