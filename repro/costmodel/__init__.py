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

The form and every assumption are documented in `repro/costmodel/model.py`; the coefficients
are fitted on the measured H200 profile (`repro/costmodel/data/h200_profile.json`) by
`python -m repro.costmodel.calibrate [--write]` and live in `conf/model/<model>.yaml`.
"""

from repro.costmodel.model import StepCostModel
from repro.costmodel.specs import (
    Coefficients,
    CostModelConfigError,
    HardwareSpec,
    ModelSpec,
    hardware_spec_from_config,
    kv_capacity_tokens,
    model_spec_from_config,
)

__all__ = [
    "StepCostModel",
    "kv_capacity_tokens",
    "Coefficients",
    "CostModelConfigError",
    "HardwareSpec",
    "ModelSpec",
    "hardware_spec_from_config",
    "model_spec_from_config",
]
