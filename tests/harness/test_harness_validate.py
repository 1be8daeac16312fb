"""Validation: every bad cell is reported in one message before anything runs."""

from __future__ import annotations

import copy
import sys
import types
from contextlib import contextmanager

import pytest
from hydra import compose, initialize_config_dir

from repro.harness.compose import compose_cells, resolve
from repro.harness.grid import expand_grid
from repro.harness.sweep import plan_cells
from repro.harness.validate import (
    ConfigError,
    cell_errors,
    deep_errors,
    schema_errors,
    value_errors,
    workload_seed,
)
from tests.harness.helpers import FIXTURE_CONF, ROOT


@contextmanager
def fixture_compose():
    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):

        composer = GridComposer("config")  # the harness's own composition (canonical types)

        def _compose(overrides):
            return composer([*overrides, f"hydra.searchpath=[file://{FIXTURE_CONF}]"])

        yield _compose


@pytest.fixture(scope="module")
def good_cfg() -> dict:
    with fixture_compose() as c:
        return resolve(c(["exp=tiny"]))


def with_(cfg: dict, dotted: str, value) -> dict:
    cfg = copy.deepcopy(cfg)
    node = cfg
    *path, last = dotted.split(".")
    for p in path:
        node = node[p]
    node[last] = value
    return cfg


def test_good_config_has_no_errors(good_cfg):
    assert cell_errors(good_cfg) == []


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("workload.request_rate", -1.0, "workload.request_rate must be > 0"),
        ("workload.request_rate", 0, "workload.request_rate must be > 0"),
        ("workload.request_rate", float("nan"), "workload.request_rate must be > 0"),
        ("cluster.num_workers", 0, "cluster.num_workers must be an integer >= 1"),
        ("cluster.mem_fraction", 1.5, "cluster.mem_fraction must be in (0, 1]"),
        ("cluster.kv_cache_tokens", 0, "cluster.kv_cache_tokens must be null or >= 1"),
        ("cluster.kv_cache_tokens", [4096], "needs one integer >= 1 per worker (2)"),
        ("cluster.kv_cache_tokens", [4096, 0], "needs one integer >= 1 per worker (2)"),
        ("cluster.scheduler.schedule_policy", "lifo", "schedule_policy must be one of lpm, fcfs"),
        ("cluster.scheduler.max_running_requests", 0, "max_running_requests must be an integer >= 1"),
        ("cluster.scheduler.lpm_max_queue", 0, "lpm_max_queue must be an integer >= 1"),
        ("cluster.scheduler.chunk_insertion", "eager", "chunk_insertion must be one of whole, per_chunk"),
        ("workload.num_queries", 0, "workload.num_queries must be an integer >= 1"),
        ("workload.output_len", 0, "workload.output_len must be an integer >= 1"),
        ("workload.order", "sorted", "workload.order must be one of random, round_robin"),
        ("seed", -3, "seed must be an integer >= 0"),
        ("tracking.mode", "cloud", "tracking.mode must be one of"),
        ("backend.name", "gpu_magic", "unknown backend 'gpu_magic'"),
        ("eviction.granularity", "page", "eviction.granularity must be one of token, node"),
        ("exp_name", "../x", "exp_name must be a plain folder name"),
    ],
)
def test_bad_values(good_cfg, key, value, fragment):
    errs = value_errors(with_(good_cfg, key, value))
    assert any(fragment in e for e in errs), errs


def test_every_scheduler_problem_is_listed(good_cfg):
    cfg = with_(with_(good_cfg, "cluster.scheduler.schedule_policy", "lifo"), "cluster.scheduler.max_prefill_tokens", 0)
    errs = value_errors(cfg)
    assert any("schedule_policy must be one of lpm, fcfs (got 'lifo')" in e for e in errs), errs
    assert any("max_prefill_tokens must be an integer >= 1 (got 0)" in e for e in errs), errs


def test_schema_rejects_added_keys_and_wrong_types(good_cfg):
    bad = with_(good_cfg, "cluster.num_worker", 3)
    assert any("num_worker" in e for e in schema_errors(bad))
    bad = with_(good_cfg, "tracking.max_points", "maybe")
    assert schema_errors(bad)
    bad = with_(good_cfg, "surprise", 1)
    assert any("surprise" in e for e in schema_errors(bad))


def test_schema_rejects_typos_while_composing(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - tiny\n  - _self_\ncluster:\n  num_worker: 2\n"
    )
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cells = expand_grid(None, ["exp=typo", f"hydra.searchpath=[file://{tmp_path},file://{FIXTURE_CONF}]"])
        with pytest.raises(ConfigError) as info:
            compose_cells(cells, lambda ov: compose("config", overrides=ov))
    assert "Key 'num_worker' not in 'ClusterSchema'" in str(info.value)


def test_all_problems_of_all_cells_in_one_error():
    with fixture_compose() as c, pytest.raises(ConfigError) as info:
        plan_cells(
            {"policy": "random_lru,lbgr_rlt", "workload.request_rate": "-1,6"},
            ["exp=tiny", "cluster.num_workers=0"],
            c,
        )
    msg = str(info.value)
    assert msg.startswith("invalid configuration: 4 of 4 cell(s); nothing was run.")
    assert "cluster.num_workers must be an integer >= 1 (got 0)" in msg
    assert "workload.request_rate must be > 0 req/s (got -1.0)" in msg
    assert "0 [policy=random_lru workload.request_rate=-1]" in msg


def test_unknown_policy_is_reported_with_the_options():
    with fixture_compose() as c, pytest.raises(ConfigError) as info:
        plan_cells({"policy": "random_lru,no_such_policy"}, ["exp=tiny"], c)
    msg = str(info.value)
    assert "1 of 2 cell(s)" in msg and "Could not find 'policy/no_such_policy'" in msg and "lbgr_rlt" in msg


def test_router_that_cannot_be_built(good_cfg):
    errs = deep_errors(with_(good_cfg, "router.no_such_knob", 1))
    assert any("router (repro.routing.RandomRouter): cannot be built" in e and "no_such_knob" in e for e in errs), errs
    # checked against the constructor's signature: the message says what the router takes
    assert any("unknown keys ['no_such_knob']: RandomRouter takes ['name']" in e for e in errs), errs
    errs = deep_errors(with_(good_cfg, "router._target_", "repro.routing.NoSuchRouter"))
    assert any("NoSuchRouter" in e for e in errs), errs


@pytest.fixture
def fake_workloads(monkeypatch):
    """A stand-in repro.workloads whose longest request is 1000 tokens (and that counts builds)."""
    mod = types.ModuleType("repro.workloads")
    mod.builds = []

    def build_workload(cfg, seed):
        mod.builds.append((cfg["name"], seed))
        return types.SimpleNamespace(max_request_tokens=1000)

    mod.build_workload = build_workload
    monkeypatch.setitem(sys.modules, "repro.workloads", mod)
    return mod


def test_cache_smaller_than_one_request(good_cfg, fake_workloads):
    assert deep_errors(with_(good_cfg, "cluster.kv_cache_tokens", 1000)) == []
    assert value_errors(with_(good_cfg, "cluster.kv_cache_tokens", [5000, 999])) == []
    assert "holds 999 KV tokens" in deep_errors(with_(good_cfg, "cluster.kv_cache_tokens", [5000, 999]))[0]
    errs = deep_errors(with_(good_cfg, "cluster.kv_cache_tokens", 999))
    assert errs == [
        "cache smaller than one request: a worker holds 999 KV tokens but the longest request of workload "
        "gsp needs 1000 (prompt + output); raise cluster.kv_cache_tokens / cluster.mem_fraction or shorten "
        "the workload"
    ]


def test_each_workload_is_built_once_per_sweep(fake_workloads):
    with fixture_compose() as c:
        plan_cells({"policy": "random_lru,lbgr_rlt", "seed": "0,1"}, ["exp=tiny", "cluster.kv_cache_tokens=4096"], c)
    assert sorted(fake_workloads.builds) == sorted([("gsp", workload_seed(0)), ("gsp", workload_seed(1))])


def test_theory_cells_skip_the_serving_checks(good_cfg):
    cfg = with_(good_cfg, "backend", {"name": "theory"})
    cfg["cluster"]["num_workers"] = 0  # irrelevant to a theory cell
    cfg["theory"] = {"construction": "thm4", "policy": "lru"}
    assert value_errors(cfg) == []
