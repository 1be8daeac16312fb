"""Grid expansion and argv preparation (pure functions, no composition)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.harness.argv import prepare_argv
from repro.harness.grid import expand_grid, split_sweep_overrides


def test_product_in_basic_sweeper_order_last_key_fastest():
    cells = expand_grid({"policy": "a,b", "workload.request_rate": "4,8,12"}, ["exp=x"])
    assert [c.overrides for c in cells] == [
        ["policy=a", "workload.request_rate=4", "exp=x"],
        ["policy=a", "workload.request_rate=8", "exp=x"],
        ["policy=a", "workload.request_rate=12", "exp=x"],
        ["policy=b", "workload.request_rate=4", "exp=x"],
        ["policy=b", "workload.request_rate=8", "exp=x"],
        ["policy=b", "workload.request_rate=12", "exp=x"],
    ]
    assert [c.index for c in cells] == list(range(6))
    assert cells[4].swept == {"policy": "b", "workload.request_rate": "8"}
    assert cells[4].label == "policy=b workload.request_rate=8"


def test_range_and_choice_are_hydra_sweeps():
    cells = expand_grid({"seed": "range(0,3)", "policy": "choice(a,b)"}, [])
    assert [c.overrides for c in cells] == [
        [f"seed={s}", f"policy={p}"] for s, p in itertools.product([0, 1, 2], ["a", "b"])
    ]


def test_command_line_replaces_a_swept_key_and_adds_sweeps():
    cells = expand_grid({"policy": "a,b", "seed": "0,1,2"}, ["seed=7", "cluster.num_workers=2,4"])
    assert [c.overrides for c in cells] == [
        ["policy=a", "seed=7", "cluster.num_workers=2"],
        ["policy=a", "seed=7", "cluster.num_workers=4"],
        ["policy=b", "seed=7", "cluster.num_workers=2"],
        ["policy=b", "seed=7", "cluster.num_workers=4"],
    ]
    assert set(cells[0].swept) == {"policy", "cluster.num_workers"}  # seed no longer varies


def test_no_grid_is_one_cell():
    cells = expand_grid(None, ["exp=x"])
    assert len(cells) == 1 and cells[0].overrides == ["exp=x"] and cells[0].label == "exp=x"


def test_quoted_values_with_commas_stay_one_value():
    cells = expand_grid({"tracking.tags": "'[a,b]'"}, [])
    assert len(cells) == 1


values = st.lists(st.integers(0, 99), min_size=1, max_size=4, unique=True)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b.c", "d", "e.f.g"]), values, min_size=1, max_size=3))
def test_expansion_is_the_cartesian_product(grid):
    params = {k: ",".join(map(str, v)) for k, v in grid.items()}
    cells = expand_grid(params, [])
    expected = [
        [f"{k}={v}" for k, v in zip(grid, combo)] for combo in itertools.product(*grid.values())
    ]
    assert [c.overrides for c in cells] == expected


def test_split_sweep_overrides():
    plain, sweeps = split_sweep_overrides(["exp=x", "seed=0,1", "a.b=range(3)", "c='x,y'", "d=[1,2]"])
    assert plain == ["exp=x", "c='x,y'", "d=[1,2]"]
    assert sweeps == ["seed=0,1", "a.b=range(3)"]


def test_plus_exp_is_rewritten_and_sweeps_leave_argv_without_m():
    p = prepare_argv(["+exp=fig5", "seed=0,1", "tracking=disabled", "--cfg", "job", "hydra.verbose=true"])
    assert p.argv == ["--cfg", "job", "exp=fig5", "tracking=disabled", "hydra.verbose=true"]
    assert p.overrides == ["exp=fig5", "seed=0,1", "tracking=disabled"]  # hydra.* is Hydra's own
    assert not p.multirun and not p.dry_run


def test_multirun_keeps_sweeps_for_hydra():
    p = prepare_argv(["-m", "+exp=fig5", "seed=0,1", "hydra/launcher=joblib"])
    assert p.argv == ["-m", "exp=fig5", "seed=0,1", "hydra/launcher=joblib"]
    assert p.multirun and p.overrides == ["exp=fig5", "seed=0,1"]


def test_flag_values_are_not_overrides():
    p = prepare_argv(["--config-dir", "some/dir", "-cn", "config", "--info", "defaults", "exp=a", "--dry-run"])
    assert p.argv == ["--config-dir", "some/dir", "-cn", "config", "--info", "defaults", "exp=a"]
    assert p.overrides == ["exp=a"] and p.dry_run
    p = prepare_argv(["exp=a", "--cfg", "job", "seed=1", "-m"])
    assert p.argv == ["--cfg", "job", "-m", "exp=a", "seed=1"]


@pytest.mark.parametrize("tok", ["++exp=fig2_main", "exp=fig2_main"])
def test_exp_forms(tok):
    assert prepare_argv([tok]).argv == ["exp=fig2_main"]


def test_integer_and_float_spellings_of_a_rate_are_the_same_cell():
    from tests.harness.helpers import compose_fixture
    from repro.harness.compose import cell_signature

    a = compose_fixture(["exp=tiny", "workload.request_rate=8", "router=lbgr", "router.decay_interval_s=1"])
    b = compose_fixture(["exp=tiny", "workload.request_rate=8.0", "router=lbgr", "router.decay_interval_s=1.0"])
    assert a["workload"]["request_rate"] == 8.0 and isinstance(a["workload"]["request_rate"], float)
    assert a == b and cell_signature(a) == cell_signature(b)
