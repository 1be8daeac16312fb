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


def test_drawing_tasks_draw_after_their_experiment_and_hand_back_its_frames(results_copy, tmp_path):
    """--run-missing draws an artefact on the pool once its one experiment is done; the frames the
    worker loaded join the claims' memo (that experiment's only), so nothing is read twice."""
    import pickle

    from pandas.testing import assert_frame_equal

    from repro.figures import load
    from repro.harness.pool import _call

    drawn: dict = {}
    then = cli.drawing_tasks(["tab2_ablation", "fig2_router_rules"], results_copy, tmp_path / "fig", drawn)
    assert then("fig2_main") == [] and then("fig2_router_rules") == []  # reads two experiments: after the run
    (task,) = then("tab2_ablation")
    (tmp_path / "fig").mkdir()
    with load.memoized_loads() as memo:
        task.done(*pickle.loads(pickle.dumps(_call(task.fn, task.args))))  # as from a worker
        assert drawn == {"tab2_ablation": None}
        key = (str(results_copy.resolve()), "tab2_ablation")
        assert list(memo) == [key]
        want = load._load_cells(results_copy, "tab2_ablation")
        assert_frame_equal(memo[key], want)
        assert memo[key].attrs == want.attrs
    assert (tmp_path / "fig" / "tab2_ablation.md").is_file()
