"""Fixtures of the cost-model tests: the committed model and hardware configs as plain dicts."""

from __future__ import annotations

import pytest

from tests.costmodel.costmodel_support import HARDWARE, MODELS, load_conf


@pytest.fixture(scope="session")
def model_cfgs() -> dict[str, dict]:
    return {m: load_conf("model", m) for m in MODELS}


@pytest.fixture(scope="session")
def hardware_cfgs() -> dict[str, dict]:
    return {h: load_conf("hardware", h) for h in HARDWARE}
