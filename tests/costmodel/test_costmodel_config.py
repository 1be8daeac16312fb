"""Configs: every model x hardware builds, KV capacity by hand, bad configs fail clearly, fit reproduces the profile."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from omegaconf import OmegaConf

from repro.costmodel import CostModelConfigError, StepCostModel, kv_capacity_tokens
from repro.costmodel.calibrate import DEFAULT_PROFILE, load_profile, mre, profile_spec
from tests.costmodel.costmodel_support import CONF, HARDWARE, MODELS, load_conf


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("hw", HARDWARE)
def test_from_config_on_every_model_and_gpu(model_cfgs, hardware_cfgs, model, hw):
    cm = StepCostModel.from_config(model_cfgs[model], hardware_cfgs[hw])
    assert cm.model.name == model and cm.hardware.name == hw
    for t in (cm.prefill_time_s(1), cm.prefill_time_s(2048, 4096), cm.decode_time_s(1, 100), cm.decode_time_s(64, 64 * 2048)):
        assert 0 < t < 10


def test_from_config_accepts_omegaconf(model_cfgs, hardware_cfgs):
    plain = StepCostModel.from_config(model_cfgs["mixtral_8x7b"], hardware_cfgs["h200"])
    omega = StepCostModel.from_config(OmegaConf.create(model_cfgs["mixtral_8x7b"]), OmegaConf.load(CONF / "hardware" / "h200.yaml"))
    assert omega.step_time_s(500, 500 * 250.0, 7, 7000) == plain.step_time_s(500, 500 * 250.0, 7, 7000)


def test_omegaconf_config_may_hold_lists_and_interpolations(model_cfgs, hardware_cfgs):
    # a list-valued key used to fail ("expected a mapping, got ListConfig") on an OmegaConf config only
    mcfg = OmegaConf.create({**model_cfgs["llama31_8b"], "notes": ["a", "b"], "alias": "${name}"})
    omega = StepCostModel.from_config(mcfg, OmegaConf.create({**hardware_cfgs["l40"], "tags": [1]}))
    plain = StepCostModel.from_config(model_cfgs["llama31_8b"], hardware_cfgs["l40"])
    assert omega.model == plain.model and omega.hardware == plain.hardware
    assert omega.decode_time_s(8, 8000) == plain.decode_time_s(8, 8000)


@pytest.mark.parametrize("bad", [None, [1], (1,), "x"])
def test_non_mapping_config_fails_clearly(hardware_cfgs, bad):
    with pytest.raises(CostModelConfigError, match="config is None|expected a mapping"):
        StepCostModel.from_config(bad, hardware_cfgs["l40"])


def test_default_cell_is_8b_on_l40():
    root = OmegaConf.load(CONF / "config.yaml")
    defaults = {k: v for d in root.defaults if isinstance(d, dict) or OmegaConf.is_dict(d) for k, v in d.items()}
    assert defaults["model"] == "llama31_8b" and defaults["hardware"] == "l40"
    assert (CONF / "model" / "llama31_8b.yaml").is_file() and (CONF / "hardware" / "l40.yaml").is_file()


def test_architecture_sizes():
    m8 = load_conf("model", "llama31_8b")
    cm = StepCostModel.from_config(m8, load_conf("hardware", "l40"))
    # 128 KiB per token in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
    assert cm.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert cm.model.num_params == 8_030_261_248  # published parameter count of Llama-3.1-8B
    m70 = StepCostModel.from_config(load_conf("model", "llama31_70b"), load_conf("hardware", "h200")).model
    assert m70.num_params == 70_553_706_496 and m70.weight_dtype == "fp8"
    assert 70e9 < m70.weight_bytes < 75e9  # "FP8 weights, about 70 GB" on one H200
    mix = StepCostModel.from_config(load_conf("model", "mixtral_8x7b"), load_conf("hardware", "h200")).model
    assert mix.num_params == 46_702_792_704 and mix.is_moe


def test_kv_capacity_by_hand(model_cfgs, hardware_cfgs):
    # Llama-3.1-8B on L40 at mem_fraction 0.9:
    #   memory 46068 MiB = 48,305,799,168 B; x 0.9 = 43,475,219,251.2 B
    #   weights 8,030,261,248 params x 2 B = 16,060,522,496 B  -> 27,414,696,755.2 B left
    #   / 131,072 B per token = 209,157.5 -> 209,157 tokens
    assert kv_capacity_tokens(model_cfgs["llama31_8b"], hardware_cfgs["l40"], 0.9) == 209_157
    # Mixtral (bf16, 93,405,585,408 B) on H200 (143771 MiB) at 0.9: 42,273,752,678.4 B / 131,072 = 322,523.1
    assert kv_capacity_tokens(model_cfgs["mixtral_8x7b"], hardware_cfgs["h200"], 0.9) == 322_523
    # Llama-3.1-70B FP8 (72,656,371,712 B) on H200 at 0.9: 63,022,966,374.4 B / 327,680 = 192,330.8
    assert kv_capacity_tokens(model_cfgs["llama31_70b"], hardware_cfgs["h200"], 0.9) == 192_330
    # fig7 sweeps mem_fraction: capacity grows with it.
    caps = [kv_capacity_tokens(model_cfgs["llama31_8b"], hardware_cfgs["l40"], f) for f in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert caps == sorted(caps) and caps[0] > 0


def test_kv_capacity_tensor_parallel_option(model_cfgs, hardware_cfgs):
    cfg = copy.deepcopy(model_cfgs["llama31_70b"])
    cfg.update(weight_dtype="bf16", weight_bytes=None, tensor_parallel=2)
    # 2 x 143771 MiB x 0.9 - 70,553,706,496 x 2 B = 130,251,604,940.8 B / 327,680 = 397,495.3
    assert kv_capacity_tokens(cfg, hardware_cfgs["h200"], 0.9) == 397_495


def test_kv_capacity_errors(model_cfgs, hardware_cfgs):
    bf16_70b = dict(model_cfgs["llama31_70b"], weight_dtype="bf16", weight_bytes=None)
    with pytest.raises(CostModelConfigError, match="does not fit"):
        kv_capacity_tokens(bf16_70b, hardware_cfgs["h200"], 0.9)
    with pytest.raises(CostModelConfigError, match="does not fit"):
        kv_capacity_tokens(model_cfgs["llama31_8b"], hardware_cfgs["l40"], 0.3)  # 14.5 GB < 16.1 GB of weights
    for bad in (0, 0.0, -0.5, 1.2, True, "0.9", None):
        with pytest.raises(CostModelConfigError, match="mem_fraction"):
            kv_capacity_tokens(model_cfgs["llama31_8b"], hardware_cfgs["l40"], bad)


def _broken_model(base: dict, path: tuple, value) -> dict:
    cfg = copy.deepcopy(base)
    node = cfg
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return cfg


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("architecture", "num_layers"), KeyError, "missing required key 'num_layers'"),
        (("architecture", "hidden_size"), -4096, "'hidden_size' must be > 0"),
        (("architecture", "head_dim"), 128.5, "'head_dim' has type float"),
        (("architecture", "num_key_value_heads"), 7, "not a multiple"),
        (("architecture", "experts_per_token"), 2, "dense model"),
        (("architecture",), KeyError, "missing 'architecture'"),
        (("weight_dtype",), "int3", "weight_dtype"),
        (("kv_bytes_per_token",), 65536, "kv_bytes_per_token=65536 disagrees"),
        (("num_params",), 8_000_000_000, "num_params=8000000000 disagrees"),
        (("weight_bytes",), 15e9, "weight_bytes=15000000000.0 disagrees"),
        (("tensor_parallel",), 3, "tensor_parallel=3 must divide"),
        (("tensor_parallel",), 0, "'tensor_parallel' must be > 0"),
        (("cost_model",), KeyError, "calibrate --write"),
        (("cost_model", "eta_gemm"), 0.0, "eta_gemm=0.0 must be in"),
        (("cost_model", "eta_kv"), KeyError, "missing required key 'eta_kv'"),
        (("cost_model", "t_cpu_s"), -1e-4, "t_cpu_s=-0.0001 must be >= 0"),
        (("cost_model", "t_cpu_prefix_s"), -1e-4, "t_cpu_prefix_s=-0.0001 must be >= 0"),
        (("cost_model", "t_cpu_prefix_s"), "2e-4", "'t_cpu_prefix_s' has type str"),
        (("cost_model", "p"), 0.5, "p=0.5 must be >= 1"),
        (("name",), KeyError, "missing required key 'name'"),
    ],
)
def test_bad_model_config_fails_clearly(model_cfgs, hardware_cfgs, path, value, message):
    cfg = _broken_model(model_cfgs["llama31_8b"], path, value)
    with pytest.raises(CostModelConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StepCostModel.from_config(cfg, hardware_cfgs["l40"])


def test_bad_moe_config_fails_clearly(model_cfgs, hardware_cfgs):
    cfg = _broken_model(model_cfgs["mixtral_8x7b"], ("architecture", "experts_per_token"), 9)
    with pytest.raises(CostModelConfigError, match=r"experts_per_token=9 must be in \[1, num_experts=8\]"):
        StepCostModel.from_config(cfg, hardware_cfgs["h200"])
    cfg = _broken_model(model_cfgs["mixtral_8x7b"], ("cost_model", "eta_expert"), KeyError)
    with pytest.raises(CostModelConfigError, match="eta_expert"):
        StepCostModel.from_config(cfg, hardware_cfgs["h200"])


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("memory_mib", KeyError, "missing required key 'memory_mib'"),
        ("memory_mib", 0, "'memory_mib' must be > 0"),
        ("mem_bandwidth_tb_s", -1.0, "'mem_bandwidth_tb_s' must be > 0"),
        ("bf16_dense_tflops", True, "must be a number"),
        ("bf16_dense_tflops", "181", "has type str"),
        ("fp8_dense_tflops", -3.0, "'fp8_dense_tflops' must be > 0"),
    ],
)
def test_bad_hardware_config_fails_clearly(model_cfgs, hardware_cfgs, key, value, message):
    cfg = copy.deepcopy(hardware_cfgs["l40"])
    if value is KeyError:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(CostModelConfigError, match=message):
        StepCostModel.from_config(model_cfgs["llama31_8b"], cfg)


def test_tensor_parallel_needs_interconnect_numbers(model_cfgs, hardware_cfgs):
    cfg = dict(model_cfgs["llama31_8b"], tensor_parallel=2)
    hw = dict(hardware_cfgs["l40"], interconnect_gb_s=None)
    with pytest.raises(CostModelConfigError, match="interconnect_gb_s"):
        StepCostModel.from_config(cfg, hw)
    assert StepCostModel.from_config(cfg, hardware_cfgs["l40"]).decode_time_s(1, 10) > 0


def test_h200_config_is_the_profiled_card(hardware_cfgs):
    """The measured ceilings live once, in the profile (calibrate reads them there), not in conf/hardware."""
    profile = json.loads(DEFAULT_PROFILE.read_text())
    assert {"bf16_gemm_tflops", "copy_tb_s"} <= set(profile["ceilings"])
    assert not any("measured" in hw for hw in hardware_cfgs.values())
    # The shipped profile is the shared one (same bytes would be checked by the lead; here: same content).
    assert profile["info"]["device"] == hardware_cfgs["h200"]["gpu"] == "NVIDIA H200"


# In-sample MRE bounds of the COMMITTED coefficients on the profile (calibrate prints the exact values;
# 8B prefill was 11 % before the cached-prefix host term t_cpu_prefix_s, 3.8 % with it).
COMMITTED_FIT_BOUNDS = {
    ("llama31_8b", "prefill"): 0.05,
    ("llama31_8b", "decode"): 0.03,
    ("llama31_70b", "prefill"): 0.05,
    ("llama31_70b", "decode"): 0.03,
    ("mixtral_8x7b", "prefill"): 0.05,
    ("mixtral_8x7b", "decode"): 0.03,
}


@pytest.mark.parametrize("model", MODELS)
def test_committed_coefficients_reproduce_the_profile(model_cfgs, hardware_cfgs, model):
    profile = load_profile()
    cm = StepCostModel.from_config(model_cfgs[model], hardware_cfgs["h200"])
    as_profiled = StepCostModel(profile_spec(cm.model), cm.hardware, cm.coefficients)
    pm = profile.models[cm.model.profile_name]
    assert mre(as_profiled, pm.prefill) <= COMMITTED_FIT_BOUNDS[(model, "prefill")]
    assert mre(as_profiled, pm.decode) <= COMMITTED_FIT_BOUNDS[(model, "decode")]
    # GPU-bound prefills (>= 1024 new tokens) are within 10 % on every model.
    big = [p for p in pm.prefill if p.new_tokens >= 1024]
    assert mre(as_profiled, big) <= 0.10
    if cm.model.profile_name in profile.repeats:  # held out: the second run of the same script
        rp = profile.repeats[cm.model.profile_name]
        assert mre(as_profiled, rp.prefill) <= 0.10
        assert mre(as_profiled, rp.decode) <= 0.03
    # Full model = per layer x layers + LM head: the profile's layer count matches the config.
    assert pm.layers_total == cm.model.num_layers


def test_committed_yaml_records_how_it_was_made():
    for model in MODELS:
        text = (CONF / "model" / f"{model}.yaml").read_text()
        assert "python -m repro.costmodel.calibrate --write" in text
        block = yaml.safe_load(text)["cost_model"]
        assert block["fitted_on"] == "h200"
        # Every coefficient is a number (a comment glued to a value would make YAML read a string).
        assert all(isinstance(v, float) for k, v in block.items() if k != "fitted_on"), block
        assert block["t_cpu_prefix_s"] >= 0.0


@pytest.mark.parametrize("factor", [0.5, 1.25, 2.0])
def test_speed_factor_divides_every_step_time(model_cfgs, hardware_cfgs, factor):
    base = StepCostModel.from_config(model_cfgs["llama31_8b"], hardware_cfgs["l40"])
    fast = StepCostModel.from_config(model_cfgs["llama31_8b"], {**hardware_cfgs["l40"], "speed_factor": factor})
    cases = [(1, 0.5, 0, 0), (2048, 2048 * 3072.0, 0, 0), (0, 0.0, 16, 16 * 900.0), (512, 512 * 300.0, 32, 32 * 1500.0)]
    for args in cases:
        assert fast.step_time_s(*args) == pytest.approx(base.step_time_s(*args) / factor, rel=1e-12)
    for batch, ctx in [(1, 100.0), (64, 64 * 2048.0)]:
        assert fast.decode_step_time_s(batch, ctx) == fast.step_time_s(0, 0.0, batch, ctx)
        assert fast.decode_step_time_s(batch, ctx) == pytest.approx(base.decode_step_time_s(batch, ctx) / factor, rel=1e-12)


def test_speed_factor_one_changes_no_float(model_cfgs, hardware_cfgs):
    cfg = dict(hardware_cfgs["l40"])
    cfg.pop("speed_factor", None)
    absent = StepCostModel.from_config(model_cfgs["llama31_8b"], cfg)
    one = StepCostModel.from_config(model_cfgs["llama31_8b"], {**cfg, "speed_factor": 1.0})
    assert absent.step_time_s(777, 777 * 500.0, 9, 9000.0) == one.step_time_s(777, 777 * 500.0, 9, 9000.0)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "fast", True])
def test_bad_speed_factor_is_rejected(model_cfgs, hardware_cfgs, bad):
    with pytest.raises(CostModelConfigError, match="speed_factor"):
        StepCostModel.from_config(model_cfgs["llama31_8b"], {**hardware_cfgs["l40"], "speed_factor": bad})
