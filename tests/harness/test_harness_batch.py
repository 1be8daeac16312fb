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
    assert "tiny: 4 ran, 0 skipped (finished), 0 failed" in out.getvalue()
    # a second pass finds every cell finished and runs nothing
    out = io.StringIO()
    assert run_experiments(["tiny"], [f"results_dir={tmp_path}", NO_WANDB], n_jobs=n_jobs,
                           config_dir=str(FIXTURE_CONF), out=out, err=err) == {"tiny": 0}
    assert "tiny: 0 ran, 4 skipped (finished), 0 failed" in out.getvalue()
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
