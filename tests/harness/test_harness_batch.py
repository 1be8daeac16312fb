"""Several experiments' grids in one pool (repro.harness.batch, behind `make figures`): the same
files as `python -m repro.run +exp=NAME`, finished cells skipped, bad grids reported, and the
fed pool (specs arriving while it runs) on one and two processes."""

from __future__ import annotations

import io

import pytest

from repro.harness.batch import cell_cost, run_experiments
from tests.harness.helpers import FIXTURE_CONF, cell_files, reference_tiny_grid

NO_WANDB = "tracking=disabled"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, bytes]:
    return reference_tiny_grid(tmp_path_factory)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_batch_gives_the_files_of_repro_run(tmp_path, reference, n_jobs):
    out, err = io.StringIO(), io.StringIO()
    codes = run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], n_jobs=n_jobs,
                            config_dir=str(FIXTURE_CONF), out=out, err=err)
    assert codes == {"tiny": 0}, err.getvalue()
    assert cell_files(tmp_path) == reference
    assert "tiny: 4 ran, 0 copied (from a finished twin), 0 skipped (finished), 0 failed" in out.getvalue()
    # a second pass finds every cell finished and runs nothing
    out = io.StringIO()
    assert run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], n_jobs=n_jobs,
                           config_dir=str(FIXTURE_CONF), out=out, err=err) == {"tiny": 0}
    assert "tiny: 0 ran, 0 copied (from a finished twin), 4 skipped (finished), 0 failed" in out.getvalue()
    assert cell_files(tmp_path) == reference


def test_an_invalid_experiment_is_reported_and_the_others_run(tmp_path, reference):
    err = io.StringIO()
    codes = run_experiments(["no_such_exp", "tiny"], [f"results_dir={tmp_path}", NO_WANDB], n_jobs=1,
                            config_dir=str(FIXTURE_CONF), out=io.StringIO(), err=err)
    assert codes == {"no_such_exp": 2, "tiny": 0}
    assert "no_such_exp" in err.getvalue()
    assert cell_files(tmp_path) == reference


def test_cell_cost_puts_whole_traces_first():
    class S:
        def __init__(self, cfg):
            self.config = cfg

    assert cell_cost(S({"workload": {"num_queries": None}})) == float("inf")
    assert cell_cost(S({"workload": {"num_queries": 1024}})) == 1024.0
    assert cell_cost(S({"backend": {"name": "theory"}, "workload": {"num_queries": 9}})) == 0.0


def test_cell_cost_ranks_theory_cells_by_their_replayed_paths():
    """The longest theory cell (RLT, 32 seeds, x = 1024) starts before the serving cells, not last."""
    from repro.backends.theory import replayed_paths

    class S:
        def __init__(self, cfg):
            self.config = cfg

    def thm(panel, policy, x):
        return {"backend": {"name": "theory"}, "theory": {"panel": panel, "policy": policy, "x": x}}

    big, small = thm("thm5", "rlt", 1024), thm("thm4", "lru", 4)
    assert replayed_paths(big) == 32 * 22 * 1024 * 4  # seeds x (phases + 2) x batches x beta paths
    assert replayed_paths(small) == 22 * 4
    assert cell_cost(S(big)) > cell_cost(S({"workload": {"num_queries": 16384}})) > cell_cost(S(small)) > 0
    assert cell_cost(S(thm("thm9", "lru", 4))) == 0.0  # invalid: validation's to report


def _finished_cells(exp_dir: str) -> int:
    """A pool Task (module level: it runs in a worker): the summaries it finds."""
    from pathlib import Path

    return len(list(Path(exp_dir).glob("*/summary.json")))


def _fails() -> None:
    raise RuntimeError("this task fails")


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_then_tasks_run_once_after_the_last_cell_of_their_experiment(tmp_path, reference, n_jobs):
    from repro.harness.pool import Task

    got: list = []

    def then(exp):
        return [Task(_finished_cells, (str(tmp_path / exp),), lambda value, error: got.append((exp, value, error))),
                Task(_fails, (), lambda value, error: got.append((exp, value, error.strip().splitlines()[-1])))]

    args = dict(n_jobs=n_jobs, config_dir=str(FIXTURE_CONF), out=io.StringIO(), err=io.StringIO(), then=then)
    assert run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], **args) == {"tiny": 0}
    want = [("tiny", 4, None), ("tiny", None, "RuntimeError: this task fails")]
    assert sorted(got, key=str) == sorted(want, key=str)  # two workers: either may finish first
    assert cell_files(tmp_path) == reference
    got.clear()  # nothing left to run: nothing follows
    assert run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], **args) == {"tiny": 0}
    assert got == []


def test_validation_builds_its_workloads_on_the_workers_not_here(tmp_path, reference, monkeypatch):
    """The deep check's workloads (their longest request) come from pool Tasks: this process
    never builds one (here it could not), and the files are the same."""
    from repro.backends import assembly

    def no_build(*args, **kwargs):
        raise AssertionError("the parent built a workload")

    monkeypatch.setattr(assembly, "build_workload", no_build)  # this process only: workers import afresh
    err = io.StringIO()
    codes = run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], n_jobs=2,
                            config_dir=str(FIXTURE_CONF), out=io.StringIO(), err=err)
    assert codes == {"tiny": 0}, err.getvalue()
    assert cell_files(tmp_path) == reference


def test_theory_grids_are_planned_first_and_the_tables_keep_the_order_asked():
    from hydra import initialize_config_dir

    import repro.harness.schema  # noqa: F401
    from repro.confutil import CONF_DIR
    from repro.harness.batch import _plan_order
    from repro.harness.compose import GridComposer

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composer = GridComposer("config")
        asked = ["fig2_main", "fig3_models", "thm_competitive_ratio", "no_such_experiment", "tab2_ablation"]
        assert _plan_order(asked, composer) == ["thm_competitive_ratio", "fig2_main", "fig3_models",
                                                "no_such_experiment", "tab2_ablation"]


def test_the_summary_tables_come_in_the_order_asked(tmp_path, monkeypatch):
    import repro.harness.batch as batch

    monkeypatch.setattr(batch, "_plan_order", lambda exps, composer: list(reversed(exps)))
    monkeypatch.setenv("REPRO_RESULTS_DIR", str(tmp_path))
    out = io.StringIO()
    codes = run_experiments(["tiny", "tiny_fake"], [NO_WANDB, "n_jobs=1"], n_jobs=1, config_dir=str(FIXTURE_CONF),
                            out=out, err=io.StringIO())
    assert codes == {"tiny": 0, "tiny_fake": 0}
    text = out.getvalue()
    assert text.index("tiny: 4 ran") < text.index("tiny_fake: 4 ran")
