"""The inverse search (python -m repro.analysis.inverse_search): argument checks before any work, a
study resumed from its journal, trials as ordinary cells, the claims' units and the report."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from repro.analysis.inverse_search.__main__ import main
from repro.analysis.inverse_search.claims import FIG2_FOUR, JOINT, joint_distance, load_claims, targets
from repro.analysis.inverse_search.search import EXP, counted, evaluate, journal_path, open_study

CLAIM = "tab2.ca_rlt_latency"  # one benchmark (GSP), two cache-aware systems: the smallest trials
TINY = ["--seeds", "0", "--num-queries", "32"]


def _search(results: Path, trials: int, claim: str = CLAIM, *extra: str) -> int:
    return main(["search", "--claim", claim, "--trials", str(trials), "--results-dir", str(results), *TINY, *extra])


def _study(results: Path, claim: str = CLAIM):
    return open_study(journal_path(results, claim), targets()[claim], create=False)


def _summaries(results: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (results / EXP).glob("*/summary.json")}


@pytest.mark.parametrize("args, why", [
    (["--claim", "fig9.nope", "--trials", "2"], "unknown claim"),
    (["--claim", CLAIM, "--trials", "0"], "--trials"),
    (["--claim", CLAIM, "--trials", "two"], "--trials"),
    (["--claim", CLAIM, "--trials", "2", "--seeds", "0,0"], "--seeds"),
    (["--claim", CLAIM, "--trials", "2", "cluster.num_workers=0"], "num_workers"),
    (["--claim", CLAIM, "--trials", "2", "workload.no_such_key=1"], "no_such_key"),
])
def test_bad_arguments_exit_2_before_any_work(tmp_path, capsys, args, why):
    assert main(["search", *args, "--results-dir", str(tmp_path)]) == 2
    assert why in capsys.readouterr().err
    assert not (tmp_path / EXP).exists()  # no journal, no cell


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A study run to 2 trials, then resumed to 5; and the same 5 in one run elsewhere."""
    root = tmp_path_factory.mktemp("inverse")
    a, b = root / "a", root / "b"
    assert _search(a, 2) == 0
    before = _summaries(a)
    assert _search(a, 5) == 0
    assert _search(b, 5) == 0
    return SimpleNamespace(a=a, b=b, before=before)


def test_resume_adds_trials_to_the_journal_and_keeps_finished_cells(resumed):
    study = _study(resumed.a)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5 and counted(study) == 5
    after = _summaries(resumed.a)
    assert len(resumed.before) == 4 and set(resumed.before) <= set(after)
    assert all(after[s] == m for s, m in resumed.before.items())  # trials 0-1's cells were not rerun
    # trial k is drawn from (sampler seed, k) and the trials before it: a resumed study is the one-shot one
    one_shot = _study(resumed.b)
    assert [t.params for t in study.trials] == [t.params for t in one_shot.trials]
    assert [t.value for t in study.trials] == [t.value for t in one_shot.trials]
    # trials 1 and 2: the paper's setting (trial 0) at the lowest and highest rate of the space
    from repro.analysis.inverse_search.space import RATE_HALVES

    paper = study.trials[0].params
    assert [t.params for t in study.trials[1:3]] == [{**paper, "request_rate_x2": r} for r in RATE_HALVES]
    assert _search(resumed.a, 5) == 0 and len(_study(resumed.a).trials) == 5  # already there: nothing asked


def test_trials_are_ordinary_cells_and_fresh_ones_are_skipped(resumed, tmp_path):
    first = _study(resumed.a).trials[0]
    assert first.params["workload"] == "gsp" and first.params["num_workers"] == 4 and first.params["kv_ktokens_gsp"] == 32
    cells = {(c["policy"], c["seed"]): c for c in first.user_attrs["cells"]}
    assert set(cells) == {("cache_aware_lru", 0), ("cache_aware_rlt", 0)}
    for c in cells.values():
        assert (resumed.a / EXP / c["signature"] / "summary.json").is_file()
    # a study started afresh over finished cells: the harness skips them as fresh
    fresh = tmp_path / "r"
    (fresh / EXP).mkdir(parents=True)
    for sig in (c["signature"] for c in cells.values()):
        shutil.copytree(resumed.a / EXP / sig, fresh / EXP / sig)
    assert _search(fresh, 1) == 0
    assert {c["status"] for c in _study(fresh).trials[0].user_attrs["cells"]} == {"skipped"}


@pytest.mark.parametrize("claim, exp", [("fig2.p50_latency_vs_ca", "fig2_main"), ("fig4.latency_vs_ca", "fig4_order"),
                                        (CLAIM, "tab2_ablation")])
def test_each_study_starts_from_the_papers_own_cells(tmp_path, claim, exp):
    """Trial 0 (the paper's defaults, drawn through the search space) has the signatures of the
    paper experiment's text-protocol cells at the paper's query count: copied from there when
    fresh (the search runs the text protocol; fig2_main and tab2_ablation default to the artifact)."""
    from hydra import initialize_config_dir
    from optuna.trial import FixedTrial

    from repro.analysis.inverse_search.search import Runner
    from repro.analysis.inverse_search.space import default_params, suggest
    from repro.confutil import CONF_DIR
    from repro.harness.compose import GridComposer, cell_signature, resolve

    t = targets()[claim]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        runner = Runner(str(tmp_path), (1,), None, (), composer=GridComposer("config"))
        runner.prepare([t])
        start = runner.default_cells(t)
        setting = suggest(FixedTrial(default_params({c.swept["policy"]: c.config for c in start})), t,
                          runner.num_queries)
        drawn = runner.cells(t, setting)
        paper = [cell_signature(resolve(runner.composer([f"exp={exp}", f"workload={t.benchmarks[0]}",
                                                         f"policy={p}", "seed=1", "protocol=text"]))) for p in (t.base, t.ours)]
    assert [c.signature for c in drawn] == [c.signature for c in start] == paper


def test_a_study_keeps_its_settings(resumed, capsys):
    n = len(_study(resumed.a).trials)
    for other in (["--seeds", "0,1", "--num-queries", "32"], ["--seeds", "0", "--num-queries", "48"],
                  ["--seeds", "0", "--num-queries", "32", "cluster.scheduler.max_running_requests=8"]):
        assert main(["search", "--claim", CLAIM, "--trials", str(n + 1), "--results-dir", str(resumed.a), *other]) == 2
        assert "was made with" in capsys.readouterr().err
    assert len(_study(resumed.a).trials) == n


def test_report_names_the_best_setting_and_the_co_occurrence(resumed, tmp_path):
    figs = tmp_path / "figs"
    assert main(["report", "--results-dir", str(resumed.a), "--figures-dir", str(figs)]) == 0
    text = (resumed.a / EXP / "report.md").read_text()
    study = _study(resumed.a)
    best = max((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: (t.value, -t.number))
    assert f"| `{CLAIM}` | −28.1 % |" in text and f"### `{CLAIM}`: best" in text
    assert f"(trial {best.number})" in text
    assert "| `fig2.p50_latency_vs_ca` | 11.96× | - | not run |" in text
    assert "No complete Figure 2 trial yet." in text
    assert (figs / "inverse_search.png").stat().st_size > 0 and (figs / "inverse_search.pdf").is_file()
    import pandas as pd

    rows = pd.read_csv(resumed.a / EXP / "trials.csv")
    assert list(rows["trial"]) == [t.number for t in study.trials] and set(rows["study"]) == {CLAIM}
    assert rows["value"].tolist() == pytest.approx([t.value for t in study.trials])


def test_claims_read_the_papers_numbers_from_the_catalogue():
    claims = load_claims()
    lat, hit, tab2 = claims["fig2.p50_latency_vs_ca"], claims["fig2.hit_vs_ca"], claims[CLAIM]
    assert (lat.base, lat.ours, lat.paper_advantage) == ("cache_aware_lru", "lbgr_rlt", 11.96)
    assert hit.paper_advantage == pytest.approx(1.3645) and hit.printed(1.3645) == "+36.5 %"
    assert tab2.paper_advantage == pytest.approx(1 / (1 - 0.281)) and tab2.printed(1 / (1 - 0.281)) == "−28.1 %"
    assert lat.advantage(2.0, 0.5) == 4.0 and hit.advantage(0.5, 0.6) == pytest.approx(1.2)
    assert targets(claims)["fig4.latency_vs_ca"].fixed == ("workload.order=round_robin",)
    paper = {claims[c].metric: claims[c].paper_advantage for c in FIG2_FOUR}
    assert joint_distance(claims, paper) == pytest.approx(0.0)
    assert joint_distance(claims, {**paper, "latency_p50_s": 11.96 * 2}) == pytest.approx(1.0)
    assert joint_distance(claims, {**paper, "hit_rate": 0.9}) == pytest.approx(math.log2(0.3645 / 1e-3))
    assert math.isinf(joint_distance(claims, {**paper, "throughput_rps": math.nan}))


def test_a_trial_records_each_cells_regime_when_its_summary_has_one():
    t = targets()[CLAIM]
    cells = [SimpleNamespace(swept={"policy": p, "seed": "0"}) for p in (t.base, t.ours)]
    base = {"latency_p50_s": 2.0, "ttft_p50_s": 1.0, "hit_rate": 0.5, "throughput_rps": 10.0,
            "latency_p95_s": 4.0, "ttft_p95_s": 2.0}
    outs = [SimpleNamespace(summary={**base, "regime": "backlogged"}, signature="s1", status="ran"),
            SimpleNamespace(summary={**base, "latency_p50_s": 1.0}, signature="s2", status="ran")]
    value, record = evaluate(t, load_claims(), cells, outs)
    assert value == 2.0 and record["advantages"]["hit_rate"] == 1.0
    assert record["cells"][0]["regime"] == "backlogged" and "regime" not in record["cells"][1]


def test_a_trial_left_running_by_a_dead_process_does_not_count(tmp_path):
    from repro.analysis.inverse_search.search import _abandon_dead
    from repro.results.lock import owner_record

    t = targets()[JOINT]
    study = open_study(journal_path(tmp_path, t.id), t, create=True)
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = {**owner_record(), "pid": proc.pid, "start": "1"}
    study.ask().set_user_attr("owner", dead)
    study.ask().set_user_attr("owner", owner_record())  # this process: alive
    assert counted(study) == 2
    assert _abandon_dead(study) == [0]
    assert [s.state.name for s in study.trials] == ["FAIL", "RUNNING"] and counted(study) == 1
    assert os.getpid() == study.trials[1].user_attrs["owner"]["pid"]


def test_the_spaces_corners_are_valid_cells(tmp_path):
    """The smallest KV budget of each benchmark holds its longest request at the longest output (and
    GSP's longest system prompt): no drawn setting is an invalid cell."""
    from hydra import initialize_config_dir
    from optuna.trial import FixedTrial

    from repro.analysis.inverse_search import space
    from repro.analysis.inverse_search.search import Runner
    from repro.confutil import CONF_DIR
    from repro.harness.compose import GridComposer

    t = targets()["fig2.p50_latency_vs_ca"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        runner = Runner(str(tmp_path), (0,), 256, (), composer=GridComposer("config"))
        for wl in t.benchmarks:
            params = {"workload": wl, "num_workers": 1, "request_rate_x2": 8, "output_len": space.OUTPUT_LEN[1],
                      "kv_mode": "budget", f"kv_ktokens_{wl}": space.KV_KTOKENS[wl][0],
                      "gsp_groups": space.GSP_GROUPS[0], "gsp_sys_lo": space.GSP_SYS_LO[1],
                      "gsp_sys_span_pct": space.GSP_SYS_SPAN_PCT[1], "ca_generation": "le_0_2_3",
                      "lbgr_gamma_pct": 99, "lbgr_decay_interval_s": 10.0, "speed_pct": space.SPEED_PCT[0]}
            setting = space.suggest(FixedTrial(params), t, 256)
            assert len(runner.cells(t, setting)) == 2  # composed and deep-validated (ConfigError otherwise)


def test_a_trial_failed_meanwhile_by_another_process_ends_without_error(tmp_path, monkeypatch):
    """Another process may take a long trial for abandoned (its host's clock, STALE_AFTER_S) and fail
    it: the owner keeps its cells, reports the trial as not counted and goes on."""
    from optuna.trial import TrialState

    from repro.analysis.inverse_search.search import Runner

    real_run = Runner.run

    def run_then_abandoned(self, cells):
        out = real_run(self, cells)
        other = _study(tmp_path)  # "another process": its own view of the journal
        (running,) = other.get_trials(states=(TrialState.RUNNING,))
        other.tell(running.number, state=TrialState.FAIL)
        return out

    monkeypatch.setattr(Runner, "run", run_then_abandoned)
    assert _search(tmp_path, 1) == 0
    t, *queued = _study(tmp_path).trials  # the rate-range ends stay enqueued for a later run
    assert t.state.name == "FAIL" and "error" not in t.user_attrs and counted(_study(tmp_path)) == 0
    assert [q.state.name for q in queued] == ["WAITING", "WAITING"]
    assert len(list((tmp_path / EXP).glob("*/summary.json"))) == 2
