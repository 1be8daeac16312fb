"""CLI: argument errors, and --run-missing runs exactly the experiments that need it."""

from __future__ import annotations

import repro.figures.__main__ as cli


def test_unknown_name_is_rejected(tmp_path, capsys):
    assert cli.main(["fig99", "--results-dir", str(tmp_path)]) == 2
    assert "unknown figure/table" in capsys.readouterr().err


def test_check_and_run_missing_do_not_mix(tmp_path):
    assert cli.main(["--check", "--run-missing", "--results-dir", str(tmp_path)]) == 2


def test_run_missing_runs_every_defined_experiment_in_one_grid(results_copy, tmp_path, monkeypatch):
    conf = tmp_path / "conf_exp"
    conf.mkdir()
    for exp in ("fig4_order", "fig5_request_rate"):
        (conf / f"{exp}.yaml").write_text("# @package _global_\n")
    monkeypatch.setattr(cli, "CONF_EXP", conf)
    calls = []

    def fake_grid(exps, results_dir, then=None):
        calls.append((list(exps), results_dir))
        return {e: 0 for e in exps}

    monkeypatch.setattr(cli, "_run_grid", fake_grid)
    problems = cli.run_missing(["fig4_order", "fig5_request_rate", "fig6_workers"], results_copy)
    # one grid for both defined experiments (the harness skips their finished cells itself)
    assert calls == [(["fig4_order", "fig5_request_rate"], results_copy)]
    assert problems == ["fig6_workers: conf/exp/fig6_workers.yaml does not exist (experiment not defined yet)"]


def test_the_theory_experiment_runs_through_its_conf_exp_file():
    """thm_competitive_ratio is planned like every experiment (no runner of its own)."""
    assert (cli.CONF_EXP / "thm_competitive_ratio.yaml").is_file()


def test_run_missing_reports_a_failed_experiment(results_copy, tmp_path, monkeypatch):
    conf = tmp_path / "conf_exp"
    conf.mkdir()
    (conf / "fig4_order.yaml").write_text("")
    (conf / "fig5_request_rate.yaml").write_text("")
    monkeypatch.setattr(cli, "CONF_EXP", conf)
    monkeypatch.setattr(cli, "_run_grid", lambda exps, r, then=None: {"fig4_order": 1, "fig5_request_rate": 0})
    problems = cli.run_missing(["fig4_order", "fig5_request_rate"], results_copy)
    assert problems == ["fig4_order: its grid ended with exit code 1 (as `python -m repro.run +exp=fig4_order` would)"]
