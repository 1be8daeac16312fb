"""CLI: argument errors, and --run-missing runs exactly the experiments that need it."""

from __future__ import annotations

import subprocess

import repro.figures.__main__ as cli


def test_unknown_name_is_rejected(tmp_path, capsys):
    assert cli.main(["fig99", "--results-dir", str(tmp_path)]) == 2
    assert "unknown figure/table" in capsys.readouterr().err


def test_check_and_run_missing_do_not_mix(tmp_path):
    assert cli.main(["--check", "--run-missing", "--results-dir", str(tmp_path)]) == 2


def test_run_missing_runs_only_what_is_missing(results_copy, tmp_path, monkeypatch):
    conf = tmp_path / "conf_exp"
    conf.mkdir()
    for exp in ("fig4_order", "fig5_request_rate"):
        (conf / f"{exp}.yaml").write_text("# @package _global_\n")
    monkeypatch.setattr(cli, "CONF_EXP", conf)
    # fig5's results are gone: nothing finished, so it runs without a dry run first
    import shutil

    shutil.rmtree(results_copy / "fig5_request_rate")
    calls = []

    def fake_run(exp, results_dir, *extra):
        calls.append((exp, extra))
        out = f"   0  abc  finished  x\n{exp}: 6 cell(s), 6 finished, 0 to run\n" if extra else ""
        return subprocess.CompletedProcess([], 0, stdout=out, stderr="")

    monkeypatch.setattr(cli, "_repro_run", fake_run)
    monkeypatch.setattr(cli, "_standalone_run", lambda exp, r, f: calls.append((exp, "standalone")) or
                        subprocess.CompletedProcess([], 0, stdout="", stderr=""))
    problems = cli.run_missing(["fig4_order", "fig5_request_rate", "fig6_workers", "thm_competitive_ratio"],
                               results_copy)
    assert calls == [("fig4_order", ("--dry-run",)), ("fig5_request_rate", ()),
                     ("thm_competitive_ratio", "standalone")]  # no conf/exp yet: its own runner
    assert problems == ["fig6_workers: conf/exp/fig6_workers.yaml does not exist (experiment not defined yet)"]


def test_run_missing_reruns_an_incomplete_experiment(results_copy, tmp_path, monkeypatch):
    conf = tmp_path / "conf_exp"
    conf.mkdir()
    (conf / "fig4_order.yaml").write_text("")
    monkeypatch.setattr(cli, "CONF_EXP", conf)
    calls = []

    def fake_run(exp, results_dir, *extra):
        calls.append(extra)
        out = f"{exp}: 8 cell(s), 6 finished, 2 to run\n" if extra else ""
        return subprocess.CompletedProcess([], 0 if extra else 1, stdout=out, stderr="")

    monkeypatch.setattr(cli, "_repro_run", fake_run)
    problems = cli.run_missing(["fig4_order"], results_copy)
    assert calls == [("--dry-run",), ()]
    assert problems == ["fig4_order: `python -m repro.run +exp=fig4_order` exited 1"]
