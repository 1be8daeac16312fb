"""Outputs never go into the checkout's source folders or its root (issue 41, point 2): files under
repro/ count as package data in every cell's fingerprint, so one results folder there made every
committed result stale. results_dir (both run forms, hence the inverse search's journal too, which
lives in its results_dir) and the figures' folders exit 2 before any work."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.harness.helpers import ROOT, run_inprocess

NO_WANDB = "tracking=disabled"


def _probe(where: str) -> str:
    return "." if where == "." else f"{where}/_outdir_probe_{os.getpid()}"


@pytest.mark.parametrize(
    "where,form,fragment",
    [
        ("repro", "inprocess", "inside the repository's repro/"),
        ("conf", "inprocess", "inside the repository's conf/"),
        ("tests", "inprocess", "inside the repository's tests/"),
        (".", "inprocess", "is the repository's root"),
        ("repro", "multirun", "inside the repository's repro/"),
    ],
)
def test_results_dir_in_the_checkout_fails_before_any_cell(tmp_path, monkeypatch, capsys, where, form, fragment):
    target = _probe(where)
    before = set(os.listdir(ROOT))
    args = ["+exp=tiny", NO_WANDB, f"results_dir={target}"]
    try:
        rc = run_inprocess(tmp_path, *(["-m", *args] if form == "multirun" else args), monkeypatch=monkeypatch)
        err = capsys.readouterr().err
        assert rc == 2, err
        assert "invalid configuration" in err and fragment in err
        assert target == "." or not (ROOT / target).exists()
        assert set(os.listdir(ROOT)) == before  # no tiny/ at the root either
    finally:
        if target != ".":
            shutil.rmtree(ROOT / target, ignore_errors=True)
        shutil.rmtree(ROOT / "tiny", ignore_errors=True)


def test_results_dir_beside_the_source_folders_is_fine(tmp_path):
    from repro.harness.validate import output_dir_error

    assert output_dir_error(ROOT / "results", "results_dir") is None
    assert output_dir_error(ROOT / "reproduction_results", "results_dir") is None  # a prefix is not a folder
    assert output_dir_error(tmp_path, "results_dir") is None


@pytest.mark.parametrize("flag,where", [("--figures-dir", "repro"), ("--figures-dir", "."), ("--results-dir", "conf")])
def test_figures_folders_in_the_checkout_exit_2(monkeypatch, capsys, flag, where):
    from repro.figures.__main__ import main

    target = _probe(where)
    monkeypatch.chdir(ROOT)
    before = set(os.listdir(ROOT))
    try:
        assert main(["fig5_request_rate", flag, target]) == 2
        assert flag in capsys.readouterr().err
        assert target == "." or not (ROOT / target).exists()
        assert set(os.listdir(ROOT)) == before
    finally:
        if target != ".":
            shutil.rmtree(ROOT / target, ignore_errors=True)
        for name in set(os.listdir(ROOT)) - before:  # what a failing run drew there
            (ROOT / name).unlink()


def test_inverse_search_journal_in_the_checkout_exits_2():
    import subprocess
    import sys

    target = _probe("repro")
    try:
        res = subprocess.run(
            [sys.executable, "-m", "repro.analysis.inverse_search", "search", "--claim", "fig2.p50_latency_vs_ca",
             "--trials", "1", "--results-dir", target],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert res.returncode == 2, res.stderr
        assert "inside the repository's repro/" in res.stderr and not (ROOT / target).exists()
    finally:
        shutil.rmtree(ROOT / target, ignore_errors=True)
