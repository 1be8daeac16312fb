"""tests/conftest.py: under CI=true a skipped `sglang` test fails the run (runs without SGLang)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.mark.parametrize("ci", ["true", None])
def test_skipped_sglang_test_fails_only_under_ci(tmp_path, ci):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    sglang: needs SGLang\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.sglang\n"
        "def test_needs_sglang():\n"
        "    pytest.skip('SGLang cannot be imported')\n"
        "def test_other_skip():\n"
        "    pytest.skip('not an sglang test')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout + proc.stderr
    if ci == "true":
        assert proc.returncode == 1, out
        assert "1 failed, 1 skipped" in out and "must run, but it was skipped" in out
    else:
        assert proc.returncode == 0, out
        assert "2 skipped" in out
