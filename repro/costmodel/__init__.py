"""Step-cost model per (model, GPU) — used by the simulator AND by LBGR, so it sits below both.

Contract (ALGORITHMS.md §6):

    model = StepCostModel.from_config(model_cfg, hardware_cfg)
    model.step_time_s(prefill_tokens, prefill_attn_work, decode_batch, decode_context_tokens) -> float
        Seconds for one scheduler step: `prefill_tokens` new tokens prefilled with attention
        work sum_i n_i * (c_i + n_i / 2) (n new, c cached per request), and/or one decode
        step for `decode_batch` requests holding `decode_context_tokens` KV tokens in total.
    model.prefill_time_s(new_tokens, cached_tokens=0) -> float    # one request alone
    model.decode_time_s(batch, context_tokens) -> float            # one decode step
    kv_capacity_tokens(model_cfg, hardware_cfg, mem_fraction) -> int
"""
