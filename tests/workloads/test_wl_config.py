"""Workload configs: YAML files agree with the classes, bad values fail early with one clear error."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf
from wl_helpers import CONF, wl_cfg

from repro.workloads import COMMON_DEFAULTS, WorkloadConfigError, build_workload, resolve_spec

NAMES = ["gsp", "sharegpt", "ultrachat", "loogle"]


@pytest.mark.parametrize("name", NAMES)
def test_yaml_lists_every_knob_with_the_class_default(name):
    yaml_cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    spec = resolve_spec(yaml_cfg)
    assert yaml_cfg["name"] == spec.name == name
    for key in COMMON_DEFAULTS:
        assert key in yaml_cfg, f"{name}.yaml lacks common key {key}"
    # every knob the class knows is spelled out in the YAML, with the class's default value
    defaults = {**COMMON_DEFAULTS, **type(spec).DEFAULTS}
    assert set(yaml_cfg) - {"_target_", "name"} == set(defaults)
    for key, value in type(spec).DEFAULTS.items():
        if key == "stand_in":
            assert yaml_cfg[key] == type(spec).STAND_IN_DEFAULTS
        else:
            assert yaml_cfg[key] == value, key
    for key in ("num_queries", "request_rate", "order", "output_len"):
        assert yaml_cfg[key] == COMMON_DEFAULTS[key]


def test_all_problems_reported_in_one_error():
    cfg = wl_cfg("gsp", request_rate=-1, num_queries=0, order="sideways", output_len=0, colour="red")
    with pytest.raises(WorkloadConfigError) as exc:
        build_workload(cfg, seed=0)
    msg = str(exc.value)
    for fragment in ("request_rate must be > 0", "num_queries must be >= 1", "order must be one of",
                     "output_len must be >= 1", "unknown key(s) colour"):
        assert fragment in msg


@pytest.mark.parametrize(
    "name,override,fragment",
    [
        ("gsp", {"source": "real"}, "source must be one of auto, synthetic"),
        ("sharegpt", {"source": "synthetic"}, "source must be one of auto, real"),
        ("ultrachat", {"source": "somewhere"}, "source must be one of"),
        ("gsp", {"tokenizer": {"kind": "hf", "path": None}}, "needs tokenizer.path"),
        ("gsp", {"tokenizer": {"kind": "sentencepiece"}}, "tokenizer.kind must be one of"),
        ("gsp", {"range_ratio": 1.5}, "range_ratio must be <= 1"),
        ("gsp", {"system_prompt_len_range": [300, 100]}, "system_prompt_len_range must be"),
        ("gsp", {"shared_prefix_ratio": 1.0}, "shared_prefix_ratio must be < 1"),
        ("gsp", {"shared_prefix_ratio": 0.0}, "shared_prefix_ratio must be > 0"),
        ("gsp", {"num_groups": 2.5}, "num_groups must be an integer"),
        ("gsp", {"output_len": True}, "output_len must be an integer"),
        ("loogle", {"mode": "summarise"}, "mode must be one of"),
        ("loogle", {"config": "summarization"}, "config must be one of"),
        ("loogle", {"stand_in": {"pages": 3}}, "unknown stand_in key(s) pages"),
        ("ultrachat", {"stand_in": {"mean_turns": 0.5}}, "mean_turns must be >= 1"),
        ("sharegpt", {"max_context_len": 0}, "max_context_len must be >= 1"),
        ("gsp", {"name": "sharegpt"}, "name is 'sharegpt'"),
        ("gsp", {"max_context_len": 3000}, "below the longest GSP request (3204 tokens"),
    ],
)
def test_bad_values_are_rejected(name, override, fragment):
    with pytest.raises(WorkloadConfigError) as exc:
        build_workload(wl_cfg(name, **override), seed=0)
    assert fragment in str(exc.value)


def test_missing_or_bad_target_and_seed():
    cfg = wl_cfg("gsp")
    del cfg["_target_"]
    with pytest.raises(WorkloadConfigError, match="no valid _target_"):
        build_workload(cfg, seed=0)
    with pytest.raises(WorkloadConfigError, match="cannot be imported"):
        build_workload(wl_cfg("gsp", _target_="repro.workloads.gsp.Nope"), seed=0)
    with pytest.raises(WorkloadConfigError, match="not a WorkloadSpec"):
        build_workload(wl_cfg("gsp", _target_="repro.workloads.base.Workload"), seed=0)
    with pytest.raises(WorkloadConfigError, match="seed"):
        build_workload(wl_cfg("gsp"), seed=-1)


def test_inf_rate_and_int_rate_accepted():
    spec = resolve_spec(wl_cfg("gsp", request_rate="inf"))
    assert math.isinf(spec.cfg["request_rate"])
    assert resolve_spec(wl_cfg("gsp", request_rate=8)).cfg["request_rate"] == 8.0


def test_omegaconf_node_is_accepted():
    node = OmegaConf.create(wl_cfg("gsp", num_queries=16, num_groups=4, prompts_per_group=4,
                                   system_prompt_len_range=[20, 40], question_len=8))
    wl = build_workload(node, seed=0)
    assert len(wl.requests) == 16


def test_hydra_instantiate_gives_the_spec():
    from hydra.utils import instantiate

    node = OmegaConf.create(wl_cfg("gsp", num_queries=8, num_groups=2, prompts_per_group=4,
                                   system_prompt_len_range=[20, 40], question_len=8))
    spec = instantiate(node)
    assert spec.cfg["system_prompt_len_range"] == [20, 40]
    assert len(spec.build(seed=0).requests) == 8
