"""Issue 42: an override run of a paper experiment gets a folder of its own (repro.harness.naming),
router / eviction knobs set while sweeping systems apply where they exist (repro.harness.knobs),
and --dry-run tells will-run from will-copy (repro.harness.dryrun)."""

from __future__ import annotations

import pytest
from hydra import initialize_config_dir

from repro.harness.argv import prepare_argv
from repro.harness.naming import EXEMPT_KEYS, MAX_PARTS_CHARS, derived_exp_name
from tests.harness.helpers import ROOT, run_inprocess

FIG5 = {"workload.request_rate": "4.0,8.0,12.0,16.0,20.0", "policy": "a,b,lbgr_rlt", "seed": "0,1,2"}


def name(*overrides, params=FIG5, **kw):
    return derived_exp_name(params, ["exp=fig5_request_rate", *overrides], **kw)


def test_a_changed_knob_names_the_folder():
    assert name("cluster.kv_cache_tokens=16384") == "fig5_request_rate+kv16384"
    assert name("cluster.kv_cache_tokens=16384.0") == "fig5_request_rate+kv16384"  # one number, one name
    assert name("workload=sharegpt") == "fig5_request_rate+sharegpt"  # a group shows its option
    assert name("workload.request_rate=24,28") == "fig5_request_rate+rate24,28"  # beyond the grid
    assert name("router.generation=le_0_2_3") == "fig5_request_rate+generation-le_0_2_3"
    assert name("~router.decay_interval_s") == "fig5_request_rate+no-dt"
    # sorted by key: the order on the command line does not matter
    assert name("workload=sharegpt", "cluster.num_workers=8") == name("cluster.num_workers=8", "workload=sharegpt")
    assert name("workload=sharegpt", "cluster.num_workers=8") == "fig5_request_rate+workers8+sharegpt"


def test_a_subset_of_the_grid_and_bookkeeping_keys_are_no_change():
    assert name("seed=0") is None and name("policy=lbgr_rlt", "workload.request_rate=8") is None
    assert name("seed=0,1", "workload.request_rate=range(4,13,4)") is None
    assert name("tracking=disabled", "n_jobs=1", "keep_stale=true", "hydra.verbose=true") is None
    assert "protocol" in EXEMPT_KEYS and name("protocol=artifact") is None  # both protocols: the paper folder
    assert name("protocol=artifact", exempt=()) == "fig5_request_rate+artifact"  # the list decides
    assert name("seed=3") == "fig5_request_rate+seed3"  # a seed the grid does not have is a change


def test_a_folder_the_user_names_wins_and_only_project_experiments_are_renamed():
    assert name("cluster.kv_cache_tokens=16384", "exp_name=mine") is None
    assert name("cluster.kv_cache_tokens=16384", "results_dir=/tmp/x") is None
    assert derived_exp_name(None, ["exp=tiny", "cluster.kv_cache_tokens=4096"]) is None  # a test fixture
    assert derived_exp_name(None, ["cluster.kv_cache_tokens=4096"]) is None  # no experiment: adhoc
    assert derived_exp_name(None, ["exp=live_cpu_gsp", "policy=lbgr_rlt"]) is None  # a demo, run with overrides


def test_long_names_stay_short_unique_and_deterministic():
    many = [f"workload.request_rate={','.join(str(r) for r in range(30, 60))}", "cluster.num_workers=16",
            "workload.output_len=64", "cluster.kv_cache_tokens=65536"]
    a, b = name(*many), name(*reversed(many))
    assert a == b and len(a) <= len("fig5_request_rate+") + MAX_PARTS_CHARS
    assert a != name(*many[:-1], "cluster.kv_cache_tokens=65537")
    assert all(ch.isalnum() or ch in "._,-+" for ch in a)


def test_the_experiments_own_value_is_no_change():
    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer
    from repro.harness.naming import composer_baseline

    ov = ["exp=fig5_request_rate", "workload=gsp", "cluster.kv_cache_tokens=32768", "workload.num_queries=1024"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        composer = GridComposer("config")
        assert derived_exp_name(FIG5, ov, composer_baseline(composer, ov)) is None
        ov2 = [*ov, "workload.num_queries=512"]
        assert derived_exp_name(FIG5, ov2, composer_baseline(composer, ov2)) == "fig5_request_rate+queries512"


def test_an_override_run_writes_its_own_folder_not_the_papers(tmp_path, monkeypatch):
    rc = run_inprocess(tmp_path, "+exp=fig5_request_rate", "cluster.kv_cache_tokens=16384", "policy=random_lru",
                       "seed=0", "workload.request_rate=4", "workload.num_queries=24", "tracking=disabled",
                       "n_jobs=1", monkeypatch=monkeypatch)
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("_")) == [
        "fig5_request_rate+kv16384+queries24"]
    assert len(list((tmp_path / "fig5_request_rate+kv16384+queries24").glob("*/summary.json"))) == 1


def _plan(*overrides):
    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer
    from repro.harness.sweep import plan_cells

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return plan_cells(None, list(overrides), GridComposer("config"), deep=False)


def test_a_knob_of_one_router_applies_to_the_systems_that_have_it():
    cells = _plan("workload=gsp", "policy=cache_aware_lru,cache_aware_rlt", "router.generation=le_0_2_3")
    assert [c.config["router"]["generation"] for c in cells] == ["le_0_2_3", "le_0_2_3"]
    assert all(not c.not_applied for c in cells)
    mixed = _plan("workload=gsp", "policy=cache_aware_lru,lbgr_rlt", "router.generation=le_0_2_3")
    assert mixed[0].config["router"]["generation"] == "le_0_2_3" and not mixed[0].not_applied
    assert "generation" not in mixed[1].config["router"]
    assert mixed[1].not_applied == ["router.generation=le_0_2_3"]


def test_a_knob_no_swept_system_has_is_still_an_error():
    from repro.harness.validate import ConfigError

    with pytest.raises(ConfigError, match="generation"):
        _plan("workload=gsp", "policy=random_lru,lbgr_rlt", "router.generation=le_0_2_3")
    with pytest.raises(ConfigError, match="genration"):
        _plan("workload=gsp", "policy=cache_aware_lru,cache_aware_rlt", "router.genration=le_0_2_3")


def test_the_command_line_with_a_system_sweep_and_one_routers_knob(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "workload=gsp", "policy=cache_aware_lru,cache_aware_rlt",
                         "router.generation=le_0_2_3", "--dry-run", monkeypatch=monkeypatch) == 0
    assert "2 cell(s)" in capsys.readouterr().out


def test_hydra_sees_system_knobs_only_where_it_needs_them():
    p = prepare_argv(["workload=gsp", "policy=a,b", "router.generation=x"])
    assert p.argv == ["workload=gsp"] and p.overrides == ["workload=gsp", "policy=a,b", "router.generation=x"]
    assert prepare_argv(["--cfg", "job", "router.generation=x"]).argv == ["--cfg", "job", "router.generation=x"]
    m = prepare_argv(["-m", "policy=a,b", "router.generation=x", "+router.y=1"])
    assert m.argv == ["-m", "policy=a,b", "++router.generation=x", "+router.y=1"]


def test_dry_run_tells_will_copy_from_will_run(tmp_path, monkeypatch, capsys):
    one = ["+exp=tiny", "policy=random_lru", "workload.request_rate=6.0", "tracking=disabled", "n_jobs=1"]
    assert run_inprocess(tmp_path, *one, monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert run_inprocess(tmp_path, "+exp=tiny", "tracking=disabled", "exp_name=tiny_twin", "--dry-run",
                         monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "policy=" in ln]
    assert sum("will-copy" in ln and "(from tiny/" in ln for ln in lines) == 1
    assert sum("will-run" in ln for ln in lines) == 3
    assert "4 to run: 1 will-copy (from a finished twin), 3 will-run" in out
    assert run_inprocess(tmp_path, *one, "--dry-run", monkeypatch=monkeypatch) == 0
    assert "  fresh  " in capsys.readouterr().out


def test_a_grid_changed_through_hydra_sweeper_params_gets_its_own_folder():
    grown = {**FIG5, "policy": "a,b,lbgr_rlt,mine_lru"}
    assert name(params=grown, original_params=FIG5) == "fig5_request_rate+mine_lru"
    assert name(params={**FIG5, "policy": "a,b"}, original_params=FIG5) is None  # fewer systems: a subset


def test_minus_m_writes_the_same_folder_and_refuses_a_knob_some_system_lacks(tmp_path, monkeypatch, capsys):
    one = ["+exp=fig5_request_rate", "cluster.kv_cache_tokens=16384", "policy=random_lru", "seed=0",
           "workload.request_rate=4", "workload.num_queries=24", "tracking=disabled"]
    assert run_inprocess(tmp_path, "-m", *one, monkeypatch=monkeypatch) == 0
    assert len(list((tmp_path / "fig5_request_rate+kv16384+queries24").glob("*/summary.json"))) == 1
    assert not (tmp_path / "fig5_request_rate").exists()
    capsys.readouterr()
    assert run_inprocess(tmp_path, *one, monkeypatch=monkeypatch) == 0  # the in-process grid: the same cell
    assert "1 skipped" in capsys.readouterr().out
    code = run_inprocess(tmp_path, "-m", "+exp=fig5_request_rate", "policy=random_lru,cache_aware_lru",
                         "router.generation=le_0_2_3", "seed=0", "workload.request_rate=4", "tracking=disabled",
                         monkeypatch=monkeypatch)
    assert code == 2 and "is no knob of cell 0 [policy=random_lru]" in capsys.readouterr().err
