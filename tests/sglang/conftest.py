"""Tests against SGLang 0.5.23's real RadixCache (marker `sglang`), run with the CPU env's python:

    bash scripts/make_sglang_env.sh                       # once: .venv-sglang (3.5-7.5 min from scratch)
    .venv-sglang/bin/python -m pytest -m sglang tests/sglang

Outside that env SGLang cannot be imported and these tests are SKIPPED with the reason. Under
CI=true such a skip FAILS the run (tests/conftest.py): CI must prepare the env so that they run.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sg():
    """SGLang's radix-cache API with the CPU shims installed; skips (with the reason) if unavailable."""
    from tests.sglang import sglang_driver

    try:
        return sglang_driver.import_sglang()
    except ImportError as exc:
        pytest.skip(f"SGLang cannot be imported: {exc}")


@pytest.fixture(scope="session")
def rlt(sg):
    """The patched SGLang (rlt registered, RadixCache hooked)."""
    from repro.backends.sglang import rlt_patch

    rlt_patch.apply()
    return rlt_patch
