"""StepCostModel: agrees with the reference, is monotone, and its MoE term behaves."""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.costmodel import StepCostModel
from tests.costmodel.costmodel_reference import reference_step_time_s
from tests.costmodel.costmodel_support import HARDWARE, MODELS, load_conf

CFG_MODELS = {m: load_conf("model", m) for m in MODELS}
CFG_HW = {h: load_conf("hardware", h) for h in HARDWARE}

coefficient_sets = st.fixed_dictionaries(
    {
        "eta_gemm": st.floats(0.05, 1.0),
        "eta_weights": st.floats(0.05, 1.0),
        "eta_attn": st.floats(0.05, 1.0),
        "eta_kv": st.floats(0.05, 1.0),
        "eta_head": st.floats(0.05, 1.0),
        "eta_expert": st.floats(0.05, 1.0),
        "t_cpu_s": st.floats(0.0, 2e-3),
        "t_cpu_prefix_s": st.floats(0.0, 1e-3),
        "t_floor_s": st.floats(0.0, 5e-4),
        "p": st.floats(1.0, 12.0),
    }
)
step_inputs = st.tuples(
    st.integers(0, 40_000),  # prefill tokens
    st.floats(0.0, 2e9),  # attention work
    st.integers(0, 1024),  # decode batch
    st.integers(0, 4_000_000),  # decode context tokens
)


def build(model: str, hw: str, coef: dict | None = None, **overrides) -> tuple[StepCostModel, dict]:
    if coef is None:
        return _build_committed(model, hw, tuple(sorted(overrides.items())))
    return _build(model, hw, coef, **overrides)


@functools.lru_cache(maxsize=None)
def _build_committed(model: str, hw: str, overrides: tuple) -> tuple[StepCostModel, dict]:
    return _build(model, hw, None, **dict(overrides))


def _build(model: str, hw: str, coef: dict | None, **overrides) -> tuple[StepCostModel, dict]:
    cfg = copy.deepcopy(CFG_MODELS[model])
    cfg.update(overrides)
    if overrides:  # derived sizes change with dtype / tp
        cfg["weight_bytes"] = cfg["kv_bytes_per_token"] = None
    if coef is not None:
        cfg["cost_model"] = dict(coef)
    return StepCostModel.from_config(cfg, CFG_HW[hw]), cfg


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("hw", HARDWARE)
@settings(max_examples=25, deadline=None)
@given(coef=coefficient_sets, inputs=step_inputs, has_prefix=st.sampled_from([None, False, True]))
def test_matches_reference_on_random_inputs(model, hw, coef, inputs, has_prefix):
    fast, cfg = build(model, hw, coef)
    expected = reference_step_time_s(cfg, CFG_HW[hw], coef, *inputs, has_prefix)
    assert fast.step_time_s(*inputs, has_prefix) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    if has_prefix is None:  # the default derives the flag
        assert fast.step_time_s(*inputs) == fast.step_time_s(*inputs, None)


@pytest.mark.parametrize(
    "overrides",
    [
        {"tensor_parallel": 2},
        {"tensor_parallel": 4, "weight_dtype": "fp8"},
        {"weight_dtype": "fp8", "kv_cache_dtype": "fp8"},
    ],
)
@pytest.mark.parametrize("hw", ["h200", "a100", "l40"])
@settings(max_examples=25, deadline=None)
@given(inputs=step_inputs)
def test_matches_reference_with_fp8_and_tensor_parallel(overrides, hw, inputs):
    for model in MODELS:
        fast, cfg = build(model, hw, **overrides)
        expected = reference_step_time_s(cfg, CFG_HW[hw], cfg["cost_model"], *inputs)
        assert fast.step_time_s(*inputs) == pytest.approx(expected, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("hw", HARDWARE)
@settings(max_examples=40, deadline=None)
@given(
    inputs=step_inputs,
    which=st.integers(0, 3),
    more=st.floats(0.0, 1e6),
)
def test_more_work_is_never_cheaper(model, hw, inputs, which, more):
    cm, _ = build(model, hw)
    base = list(inputs)
    bigger = list(inputs)
    bigger[which] += int(more) if which in (0, 2, 3) else more
    for flag in (False, True):  # a given cached-prefix flag: monotone in every input
        assert cm.step_time_s(*bigger, flag) >= cm.step_time_s(*base, flag)
    # Derived flag (attention work > tokens^2 / 2): more attention work, batch or context never
    # cheaper; more new tokens at the same attention work only by switching the flag off.
    if cm.step_time_s(*bigger) < cm.step_time_s(*base):
        assert which == 0
        assert _derived_flag(*base) and not _derived_flag(*bigger)


def _derived_flag(tokens, attn_work, *_):
    return attn_work > tokens * tokens / 2


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("hw", HARDWARE)
@settings(max_examples=25, deadline=None)
@given(inputs=step_inputs)
def test_cached_prefix_flag_never_makes_a_step_cheaper(model, hw, inputs):
    cm, cfg = build(model, hw)
    with_prefix, without = cm.step_time_s(*inputs, True), cm.step_time_s(*inputs, False)
    assert with_prefix >= without
    if inputs[0] == 0:  # no prefill: the flag does nothing
        assert with_prefix == without


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=40, deadline=None)
@given(new=st.integers(1, 20_000), cached=st.integers(0, 100_000))
def test_flag_derivation_is_exact_for_one_request(model, new, cached):
    cm, _ = build(model, "h200")
    attn = new * (cached + new / 2)
    assert _derived_flag(new, attn) == (cached > 0)
    assert cm.step_time_s(new, attn, 0, 0) == cm.prefill_time_s(new, cached)
    assert cm.step_time_s(new, attn, 0, 0, cached > 0) == cm.prefill_time_s(new, cached)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=12))
def test_flag_derivation_batches(sizes):
    """A batch without prefixes never gets the flag; one whose prefixes are long against its new tokens does."""
    tokens = sum(sizes)
    fresh = sum(n * n / 2 for n in sizes)
    assert not _derived_flag(tokens, fresh)
    cm, _ = build("llama31_8b", "h200")
    assert cm.step_time_s(tokens, fresh, 0, 0) == cm.step_time_s(tokens, fresh, 0, 0, False)
    long_prefix = fresh + sum(n * tokens for n in sizes)  # every request has c_i = tokens cached
    assert _derived_flag(tokens, long_prefix)
    assert cm.step_time_s(tokens, long_prefix, 0, 0) == cm.step_time_s(tokens, long_prefix, 0, 0, True)


def test_cached_prefix_steps_up_small_prefills_on_the_profiled_gpu():
    """8B on the H200: a 64-token prefill costs more on top of any cached prefix, by about the host term."""
    cm, cfg = build("llama31_8b", "h200")
    extra = cfg["architecture"]["num_layers"] * cfg["cost_model"]["t_cpu_prefix_s"]
    assert extra > 0
    fresh = cm.prefill_time_s(64, 0)
    for cached in (1, 2048, 16384):
        step = cm.prefill_time_s(64, cached) - fresh
        assert 0.5 * extra < step < 1.5 * extra
    # Flat in the cached length while launch-bound (the term does not grow with c).
    assert cm.prefill_time_s(64, 16384) / cm.prefill_time_s(64, 1) < 1.1


def test_config_without_the_prefix_term_gives_the_old_numbers():
    """Configs saved before t_cpu_prefix_s existed load (it defaults to 0) and reproduce their times.

    The coefficients are the 8B ones committed before the term; the expected times were printed by
    that version of the model (git show aead4a6:conf/model/llama31_8b.yaml, on L40)."""
    old = {
        "fitted_on": "h200",
        "eta_gemm": 0.71575,
        "eta_weights": 0.57383,
        "eta_attn": 0.27646,
        "eta_kv": 0.92262,
        "eta_head": 0.81137,
        "t_cpu_s": 0.00048067,
        "t_floor_s": 1e-09,
        "p": 1.841,
    }
    cm, _ = build("llama31_8b", "l40", old)
    assert cm.coefficients.t_cpu_prefix_s == 0.0
    assert cm.prefill_time_s(2048, 0) == pytest.approx(0.24757616280913372, rel=1e-12)
    assert cm.prefill_time_s(128, 2048) == pytest.approx(0.040374890594472315, rel=1e-12)
    assert cm.decode_time_s(32, 32 * 2048) == pytest.approx(0.0408163870918251, rel=1e-12)
    mixed = (300, 300 * (1000 + 150) + 200 * 100, 4, 9000)
    assert cm.step_time_s(*mixed) == pytest.approx(0.08373786452620145, rel=1e-12)


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=60, deadline=None)
@given(
    new=st.integers(1, 30_000),
    cached=st.integers(0, 100_000),
    batch=st.integers(1, 512),
    ctx=st.integers(0, 2_000_000),
    d_tok=st.integers(0, 5_000),
    d_ctx=st.integers(0, 50_000),
)
def test_request_level_times_are_monotone(model, new, cached, batch, ctx, d_tok, d_ctx):
    cm, _ = build(model, "l40")
    assert cm.prefill_time_s(new + d_tok, cached) >= cm.prefill_time_s(new, cached)
    assert cm.prefill_time_s(new, cached + d_ctx) >= cm.prefill_time_s(new, cached)  # incl. the c = 0 -> c > 0 step
    assert cm.decode_time_s(batch + d_tok, ctx) >= cm.decode_time_s(batch, ctx)
    assert cm.decode_time_s(batch, ctx + d_ctx) >= cm.decode_time_s(batch, ctx)


def test_mixed_step_is_the_sum_of_its_forwards():
    cm, _ = build("llama31_8b", "l40")
    prefill = cm.step_time_s(3000, 3000 * (1000 + 1500), 0, 0)
    decode = cm.step_time_s(0, 0, 40, 40 * 3000)
    assert cm.step_time_s(3000, 3000 * (1000 + 1500), 40, 40 * 3000) == pytest.approx(prefill + decode, rel=1e-12)
    assert cm.prefill_time_s(3000, 1000) == pytest.approx(prefill, rel=1e-12)
    assert cm.decode_time_s(40, 40 * 3000) == pytest.approx(decode, rel=1e-12)


def test_empty_step_costs_nothing_and_negative_input_is_rejected():
    cm, _ = build("mixtral_8x7b", "h200")
    assert cm.step_time_s(0, 0, 0, 0) == 0.0
    for bad in [(-1, 0, 0, 0), (1, -1.0, 0, 0), (0, 0, -2, 0), (0, 0, 1, -5)]:
        with pytest.raises(ValueError, match="negative"):
            cm.step_time_s(*bad)
    with pytest.raises(ValueError):
        cm.prefill_time_s(10, -1)


def test_times_are_plain_floats():
    cm, _ = build("llama31_8b", "l40")
    assert type(cm.step_time_s(100, 100 * 50.0, 3, 3000)) is float
    assert type(cm.prefill_time_s(7, 3)) is float
    assert type(cm.decode_time_s(2, 300)) is float


def test_moe_distinct_experts():
    cm, cfg = build("mixtral_8x7b", "h200")
    experts = cfg["architecture"]["num_experts"]
    top_k = cfg["architecture"]["experts_per_token"]
    assert cm.expected_distinct_experts(0) == 0.0
    assert cm.expected_distinct_experts(1) == pytest.approx(top_k)  # one token: exactly its k experts
    assert cm.expected_distinct_experts(8) == pytest.approx(8 * (1 - 0.75**8))
    assert cm.expected_distinct_experts(10_000) == pytest.approx(experts)  # many tokens: all of them
    values = [cm.expected_distinct_experts(t) for t in range(1, 200)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert all(v <= experts for v in values)
    dense, _ = build("llama31_8b", "h200")
    assert dense.expected_distinct_experts(100) == 0.0


@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 8, 16])
def test_moe_distinct_experts_matches_simulated_uniform_routing(tokens):
    """Monte Carlo: each token picks k distinct experts uniformly at random."""
    cm, cfg = build("mixtral_8x7b", "h200")
    experts, top_k = cfg["architecture"]["num_experts"], cfg["architecture"]["experts_per_token"]
    rng = np.random.default_rng(tokens)
    trials = 4000
    picks = np.argsort(rng.random((trials, tokens, experts)), axis=2)[:, :, :top_k]
    touched = np.zeros((trials, experts), dtype=bool)
    for t in range(tokens):
        np.put_along_axis(touched, picks[:, t, :], True, axis=1)
    simulated = touched.sum(axis=1).mean()
    assert cm.expected_distinct_experts(tokens) == pytest.approx(simulated, abs=0.05)


def test_moe_decode_cost_tracks_the_experts_touched():
    """Small decode batches read fewer expert weights: b=1 is much cheaper than b=32 (profile: 0.40 vs 1.20 ms)."""
    cm, _ = build("mixtral_8x7b", "h200")
    ratio = cm.layer_decode_s(32, 32 * 1024) / cm.layer_decode_s(1, 1024)
    assert 2.5 < ratio < 3.5
    dense, _ = build("llama31_8b", "h200")
    assert dense.layer_decode_s(32, 32 * 1024) / dense.layer_decode_s(1, 1024) < 1.4


def test_other_gpus_scale_with_their_datasheet_numbers():
    """Roofline scaling: a compute-bound prefill scales with FLOP/s, a weight-bound decode with bandwidth."""
    h200, _ = build("llama31_8b", "h200")
    l40, _ = build("llama31_8b", "l40")
    h100, _ = build("llama31_8b", "h100")
    big_prefill = (8192, 8192 * 4096.0, 0, 0)
    flops_ratio = CFG_HW["h200"]["bf16_dense_tflops"] / CFG_HW["l40"]["bf16_dense_tflops"]
    assert l40.step_time_s(*big_prefill) / h200.step_time_s(*big_prefill) == pytest.approx(flops_ratio, rel=0.05)
    bw_ratio = CFG_HW["h200"]["mem_bandwidth_tb_s"] / CFG_HW["h100"]["mem_bandwidth_tb_s"]
    small_decode = (0, 0, 1, 1024)
    ratio = h100.step_time_s(*small_decode) / h200.step_time_s(*small_decode)
    assert 1.0 < ratio <= bw_ratio * 1.001
    assert ratio == pytest.approx(bw_ratio, rel=0.1)


def test_fp8_weights_speed_up_weight_bound_decode():
    fp8, _ = build("llama31_70b", "h200")
    bf16, _ = build("llama31_70b", "h200", weight_dtype="bf16")
    ratio = bf16.decode_time_s(1, 1024) / fp8.decode_time_s(1, 1024)
    assert 1.6 < ratio < 2.0  # weight bytes halve; KV reads and the LM head do not
    a100_fp8, _ = build("llama31_70b", "a100")
    a100_bf16, _ = build("llama31_70b", "a100", weight_dtype="bf16")
    # No FP8 tensor cores on A100: a compute-bound prefill does not speed up.
    assert a100_fp8.prefill_time_s(8192) == pytest.approx(a100_bf16.prefill_time_s(8192), rel=0.03)


def test_tensor_parallel_costs_less_per_step_but_adds_allreduce():
    tp1, _ = build("llama31_70b", "h200", weight_dtype="bf16")
    tp2, _ = build("llama31_70b", "h200", weight_dtype="bf16", tensor_parallel=2)
    assert tp2.prefill_time_s(8192) < tp1.prefill_time_s(8192)
    assert tp2.prefill_time_s(8192) > 0.5 * tp1.prefill_time_s(8192)  # all-reduces are not free
    assert tp2.decode_time_s(1, 1024) > 0.5 * tp1.decode_time_s(1, 1024)


def test_prefill_time_is_launch_bound_for_tiny_prefills():
    """A 1-token prefill costs about layers x host launch time + the LM head, not ~0."""
    cm, cfg = build("llama31_8b", "h200")
    floor = cfg["architecture"]["num_layers"] * cfg["cost_model"]["t_cpu_s"]
    assert cm.prefill_time_s(1) >= floor
    assert math.isfinite(cm.prefill_time_s(10**7))


@settings(max_examples=300, deadline=None)
@given(
    m=st.sampled_from(MODELS), hw=st.sampled_from(HARDWARE),
    batch=st.integers(1, 512), context=st.integers(0, 4_000_000),
    prefill=st.integers(1, 40_000), cached=st.integers(0, 100_000),
)
def test_memoised_terms_give_the_same_floats(m, hw, batch, context, prefill, cached):
    # decode_step_time_s (the simulator's decode steps) and the memoised prefill GEMM term are
    # the same expressions as a fresh model's: equal floats, first call and memoised call alike
    memo = StepCostModel.from_config(CFG_MODELS[m], CFG_HW[hw])
    attn = prefill * (cached + prefill / 2)
    for _ in range(2):
        fresh = StepCostModel.from_config(CFG_MODELS[m], CFG_HW[hw])
        assert memo.decode_step_time_s(batch, context) == fresh.step_time_s(0, 0.0, batch, context)
        assert memo.step_time_s(prefill, attn, 0, 0) == fresh.step_time_s(prefill, attn, 0, 0)
        assert memo.step_time_s(prefill, attn, batch, context) == fresh.step_time_s(prefill, attn, batch, context)
