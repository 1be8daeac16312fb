"""repro.backends.assembly: the one place a cell's parts are put together (both backends, validation)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from repro.backends import assembly
from repro.sim.worker import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def test_every_router_config_has_only_keys_its_class_takes():
    files = sorted((CONF / "router").glob("*.yaml"))
    assert files
    for path in files:
        node = yaml.safe_load(path.read_text())
        assert assembly.router_errors(node) == [], path.name
        assert type(assembly.build_router(node)).__name__ == node["_target_"].rsplit(".", 1)[1]


def test_unknown_router_keys_are_rejected_before_the_router_is_built(monkeypatch):
    import repro.routing

    built = []
    real = repro.routing.RandomRouter

    class Counting(real):
        def __init__(self, name: str = "random") -> None:
            built.append(name)
            super().__init__(name)

    monkeypatch.setattr(repro.routing, "RandomRouter", Counting)
    node = {"_target_": "repro.routing.RandomRouter", "name": "random", "colour": "red", "size": 3}
    assert assembly.router_errors(node) == ["unknown keys ['colour', 'size']: Counting takes ['name']"]
    with pytest.raises(ValueError, match=r"router \(repro.routing.RandomRouter\): unknown keys \['colour', 'size'\]"):
        assembly.build_router(node)
    assert built == []  # nothing was constructed
    assembly.build_router({"_target_": "repro.routing.RandomRouter", "name": "random"})
    assert built == ["random"]
    assert "cannot import" in assembly.router_errors({"_target_": "repro.routing.NoSuchRouter"})[0]
    assert "no _target_" in assembly.router_errors({"name": "random"})[0]


def any_router(name: str = "any", **options):
    return {"name": name, **options}


def test_a_target_taking_any_keyword_is_not_second_guessed():
    node = {"_target_": "tests.sim.test_assembly.any_router", "anything": 1}
    assert assembly.router_errors(node) == []
    assert assembly.build_router(node) == {"name": "any", "anything": 1}
    assert assembly.router_errors({"_target_": "builtins.dict", "x": 1}) == []  # no signature: instantiate judges


def test_the_schema_is_the_scheduler_config():
    """The scheduler's fields, types and defaults are defined once (SchedulerConfig)."""
    from repro.harness.schema import ClusterSchema, SchedulerSchema

    ours = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
    assert {f.name: f.default for f in dataclasses.fields(SchedulerSchema)} == ours
    node = OmegaConf.structured(ClusterSchema)
    assert OmegaConf.to_container(node.scheduler) == ours
    assert "lpm_max_queue" in ours  # settable from config (below)


def _compose(overrides: list[str]):
    import repro.harness.schema  # noqa: F401  (the harness's composition: schema registered)
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def test_every_scheduler_knob_is_settable_from_config():
    cfg = _compose(["cluster.scheduler.lpm_max_queue=64", "cluster.scheduler.schedule_policy=fcfs"])
    sched = assembly.scheduler_config(cfg)
    assert (sched.lpm_max_queue, sched.schedule_policy) == (64, "fcfs")
    assert dataclasses.replace(sched, lpm_max_queue=128, schedule_policy="lpm") == SchedulerConfig()
    with pytest.raises(Exception, match="lpm_max_queue"):
        _compose(["cluster.scheduler.lpm_max_queue=many"])


def test_a_plain_composition_without_the_schema_gets_the_same_scheduler():
    """conf/ composed without repro.harness.schema (other packages' tests do) has no scheduler
    values: the cell assembly fills in SchedulerConfig's defaults, the same as with the schema."""
    code = (
        "import sys; from hydra import compose, initialize_config_dir\n"
        "from repro.backends import assembly\n"
        "from repro.sim.worker import SchedulerConfig\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base='1.3'):\n"
        "    cfg = compose('config', overrides=['exp=fig2_main', 'protocol=text'])\n"  # text: no scheduler preset
        "assert 'repro.harness.schema' not in sys.modules\n"
        "assert assembly.scheduler_config(cfg) == SchedulerConfig()\n"
        "plan = assembly.plan_cell(cfg)\n"
        "print(plan.num_workers, plan.capacities[0], plan.eviction_name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "32768", "rlt"]


def _cell(**cluster):
    return {
        "seed": 3,
        "model": {"name": "m"},
        "hardware": {"name": "g"},
        "cluster": {"num_workers": 2, "mem_fraction": 0.9, "kv_cache_tokens": 500, **cluster},
        "eviction": {"name": "lru", "granularity": "node"},
        "router": {"_target_": "repro.routing.RandomRouter", "name": "random"},
    }


def test_plan_cell_takes_everything_from_the_config_alone():
    plan = assembly.plan_cell(_cell(scheduler={"max_running_requests": 8}))
    assert plan.seeds == assembly.SeedPlan.spawn(3, 2) and plan.capacities == (500, 500)
    assert plan.scheduler == SchedulerConfig(max_running_requests=8) and plan.eviction_name == "lru"
    assert assembly.plan_cell(_cell(kv_cache_tokens=[300, 400])).capacities == (300, 400)
    assert assembly.workload_seed(3) == plan.seeds.workload  # independent of the number of workers
    for cluster, message in [({"num_workers": 0}, "num_workers"), ({"kv_cache_tokens": [1, 2, 3]}, "3 capacities"),
                             ({"scheduler": {"lpm_max_queue": 0}}, "lpm_max_queue"),
                             ({"scheduler": {"max_batch": 3}}, "unknown cluster.scheduler keys")]:
        with pytest.raises(ValueError, match=message):
            assembly.plan_cell(_cell(**cluster))


def test_scheduler_problems_are_listed_together():
    probs = SchedulerConfig.problems({"schedule_policy": "lifo", "max_prefill_tokens": 0, "exact_budgets": "no"})
    assert len(probs) == 3, probs
    assert SchedulerConfig.problems({}) == []


def test_check_cell_reports_every_part_and_builds_each_once(monkeypatch):
    import repro.workloads

    builds = []

    def build_workload(cfg, seed):
        builds.append(seed)
        return type("W", (), {"max_request_tokens": 1000})()

    monkeypatch.setattr(repro.workloads, "build_workload", build_workload)
    memo = assembly.Memo()
    cfg = _cell(kv_cache_tokens=999)
    cfg["router"]["colour"] = "red"
    cfg["workload"] = {"name": "w"}
    errs = assembly.check_cell(cfg, memo)
    assert any("router (repro.routing.RandomRouter): cannot be built: unknown keys ['colour']" in e for e in errs)
    assert any("cache smaller than one request: a worker holds 999" in e for e in errs)
    assert any(e.startswith("model/hardware: cannot build the step-cost model") for e in errs)  # no real model
    assert assembly.check_cell(cfg, memo) == errs and builds == [assembly.workload_seed(3)]
