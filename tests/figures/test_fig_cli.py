"""CLI: argument errors, and --run-missing runs exactly the experiments that need it."""

from __future__ import annotations

import repro.figures.__main__ as cli
from fig_fixture import out_file


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
    assert (tmp_path / "fig" / out_file("tab2_ablation", ".md")).is_file()


# -- issue 32 point 4/5: your own experiment, generated docs written by a whole build only -------
def _user_experiment(results, exp: str, extra_system: str) -> None:
    """results/<exp>/: fig2_main's cells plus a copy of Random+LRU's cells named `extra_system`."""
    import json
    import shutil

    import yaml

    shutil.copytree(results / "fig2_main", results / exp)
    for d in sorted((results / exp).iterdir()):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        if cfg["policy_name"] != "Random+LRU":
            continue
        new = d.with_name(d.name + "x")
        shutil.copytree(d, new)
        cfg["policy_name"], cfg["router"]["name"] = extra_system, "mine"
        (new / "config.yaml").write_text(yaml.safe_dump(cfg))
        summary = json.loads((new / "summary.json").read_text())
        summary["latency_p50_s"] *= 0.5
        if "policy_name" in summary.get("provenance", {}):
            summary["provenance"]["policy_name"] = extra_system
        (new / "summary.json").write_text(json.dumps(summary))


def test_a_users_own_experiment_is_drawn_into_a_folder_of_their_choice(results_copy, tmp_path):
    _user_experiment(results_copy, "my_fig2", "Mine+LRU")
    figures = tmp_path / "mine"
    md = tmp_path / "REPRODUCE.md"
    md.write_text("untouched\n")
    assert cli.main(["my_fig2", "--results-dir", str(results_copy), "--figures-dir", str(figures),
                     "--reproduce-md", str(md), "--tracking", "disabled"]) == 0
    caption = (figures / "my_fig2.caption.txt").read_text()
    assert caption.startswith("Performance of the seven systems (results/my_fig2/).") and "Beyond the paper's six systems: Mine+LRU." in caption
    assert (figures / "my_fig2.png").stat().st_size > 0 and "Mine+LRU" in (figures / "my_fig2.csv").read_text()
    assert md.read_text() == "untouched\n" and not (figures / "claims.md").exists()


def test_the_generic_figure_picks_bars_or_a_sweep_from_the_cells(fixture_results):
    from repro.figures.generic import figure_for

    bars = figure_for("fig2_main", fixture_results)
    assert (bars.kind, bars.facets) == ("bars", ("workload.name",))
    sweep = figure_for("fig5_request_rate", fixture_results)
    assert (sweep.kind, sweep.x) == ("sweep", "workload.request_rate")


def test_a_paper_figure_counts_the_systems_it_draws(results_copy, tmp_path):
    from repro.figures.perf import counted

    assert counted("Figure 2: the six systems on four benchmarks", ["a"] * 6) == "Figure 2: the six systems on four benchmarks"
    assert counted("Figure 2: the six systems", ["a"] * 7) == "Figure 2: the seven systems"
    _user_experiment(results_copy, "fig2_extra", "Mine+LRU")
    import shutil

    shutil.rmtree(results_copy / "fig2_main")
    (results_copy / "fig2_extra").rename(results_copy / "fig2_main")
    assert cli.main(["fig2_main", "--results-dir", str(results_copy), "--figures-dir", str(tmp_path / "f"),
                     "--tracking", "disabled"]) == 0
    assert "of the seven systems" in (tmp_path / "f" / out_file("fig2_main", ".caption.txt")).read_text()


def test_a_failed_render_never_writes_no_data_claims(results_copy, tmp_path, monkeypatch):
    import shutil

    shutil.rmtree(results_copy / "fig4_order")
    md = tmp_path / "REPRODUCE.md"
    md.write_text("untouched\n")
    monkeypatch.setattr(cli, "ARTEFACTS", ("fig4_order", "tab3_single_worker"))
    rc = cli.main(["--results-dir", str(results_copy), "--figures-dir", str(tmp_path / "f"), "--reproduce-md", str(md),
                   "--tracking", "disabled"])
    assert rc == 1 and md.read_text() == "untouched\n" and not (tmp_path / "f" / "claims.md").exists()
    assert (tmp_path / "f" / "tab3_single_worker.md").is_file()


def test_an_unknown_name_that_is_no_experiment_folder_is_rejected(results_copy, capsys):
    assert cli.main(["my_nothing", "--results-dir", str(results_copy)]) == 2
    assert "no such experiment folder" in capsys.readouterr().err
