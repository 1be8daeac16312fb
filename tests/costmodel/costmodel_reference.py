"""Obviously-right reference of the step-cost model, straight from the raw config dicts.

Independent of repro.costmodel: no precomputed constants, FLOPs and bytes spelled out per kernel
family, the soft max written as the plain power mean (x^p + y^p)^(1/p).
"""

from __future__ import annotations

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def soft_max(x: float, y: float, p: float) -> float:
    return (x**p + y**p) ** (1.0 / p)


def reference_step_time_s(
    model_cfg: dict, hw_cfg: dict, coef: dict, prefill_tokens, attn_work, decode_batch, decode_context, has_prefix=None
):
    """has_prefix: whether the prefill attends to a cached prefix; None: its attention work exceeds
    that of its new tokens as one fresh causal sequence (n^2 / 2)."""
    a = model_cfg["architecture"]
    layers, h, heads, kv_heads, d = a["num_layers"], a["hidden_size"], a["num_attention_heads"], a["num_key_value_heads"], a["head_dim"]
    inter, vocab = a["intermediate_size"], a["vocab_size"]
    experts, top_k = a.get("num_experts", 0), a.get("experts_per_token", 0)
    tp = model_cfg.get("tensor_parallel", 1)
    w_bytes = DTYPE_BYTES[model_cfg["weight_dtype"]]
    kv_bytes = DTYPE_BYTES[model_cfg["kv_cache_dtype"]]
    f_bf16 = hw_cfg["bf16_dense_tflops"] * 1e12
    fp8 = hw_cfg.get("fp8_dense_tflops")
    f_weights = fp8 * 1e12 if model_cfg["weight_dtype"] == "fp8" and fp8 else f_bf16
    bw = hw_cfg["mem_bandwidth_tb_s"] * 1e12
    p = coef["p"]

    q_proj = o_proj = h * heads * d
    k_proj = v_proj = h * kv_heads * d
    one_mlp = 3 * h * inter
    if experts:
        every_token = q_proj + k_proj + v_proj + o_proj + h * experts  # attention + router
    else:
        every_token = q_proj + k_proj + v_proj + o_proj + one_mlp

    def allreduce(tokens):
        if tp == 1:
            return 0.0
        link = hw_cfg["interconnect_gb_s"] * 1e9
        one = hw_cfg["allreduce_latency_s"] + 2 * (tp - 1) / tp * tokens * h * 2 / link
        return 2 * one

    def weight_gemms(tokens):
        t = soft_max(
            2 * tokens * every_token / tp / (coef["eta_gemm"] * f_weights),
            every_token * w_bytes / tp / (coef["eta_weights"] * bw),
            p,
        )
        if experts:
            distinct = experts * (1 - (1 - top_k / experts) ** tokens)
            t += soft_max(
                2 * tokens * top_k * one_mlp / tp / (coef["eta_expert"] * f_weights),
                distinct * one_mlp * w_bytes / tp / (coef["eta_weights"] * bw),
                p,
            )
        return t

    def head(rows):
        return soft_max(
            2 * rows * vocab * h / tp / (coef["eta_gemm"] * f_bf16),
            vocab * h * 2 / tp / (coef["eta_head"] * bw),
            p,
        )

    total = 0.0
    if prefill_tokens > 0:
        attn = attn_work * 4 * heads * d / tp / (coef["eta_attn"] * f_bf16)
        gpu = coef["t_floor_s"] + weight_gemms(prefill_tokens) + attn + allreduce(prefill_tokens)
        if has_prefix is None:
            has_prefix = attn_work > prefill_tokens**2 / 2
        host = coef["t_cpu_s"] + (coef.get("t_cpu_prefix_s", 0.0) if has_prefix else 0.0)
        layer = soft_max(host, gpu, p)
        total += layers * layer + head(1)
    if decode_batch > 0:
        attn = soft_max(
            decode_context * 4 * heads * d / tp / (coef["eta_attn"] * f_bf16),
            decode_context * 2 * kv_heads * d * kv_bytes / tp / (coef["eta_kv"] * bw),
            p,
        )
        layer = coef["t_floor_s"] + weight_gemms(decode_batch) + attn + allreduce(decode_batch)
        total += layers * layer + head(decode_batch)
    return total
