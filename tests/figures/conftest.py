"""Figures tests: a small fixture results tree (real file format), rendered once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fig_fixture import REPRODUCE_TEMPLATE, make_results


@pytest.fixture(scope="session")
def fixture_results(tmp_path_factory) -> Path:
    """A read-only small results tree; tests that change numbers copy it first."""
    return make_results(tmp_path_factory.mktemp("fx") / "results", small=True)


@pytest.fixture
def results_copy(fixture_results, tmp_path) -> Path:
    dst = tmp_path / "results"
    shutil.copytree(fixture_results, dst)
    return dst


@pytest.fixture(scope="session")
def rendered(fixture_results, tmp_path_factory):
    """Every artefact rendered once through the CLI: (exit code, figures dir, REPRODUCE.md)."""
    from repro.figures.__main__ import main

    out = tmp_path_factory.mktemp("rendered")
    md = out / "REPRODUCE.md"
    md.write_text(REPRODUCE_TEMPLATE)
    figures = out / "figures"
    rc = main(["--results-dir", str(fixture_results), "--figures-dir", str(figures), "--reproduce-md", str(md)])
    return rc, figures, md
