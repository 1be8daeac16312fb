"""Model, hardware and coefficient specs read from `conf/model/*.yaml` and `conf/hardware/*.yaml`.

Everything is validated here, once, so that a bad config fails with a clear message before
any simulation starts; the step-cost hot path then works on plain floats only.

Choices the paper leaves open (documented in the config files too):
- GPU memory is the driver-reported total (`memory_mib`, what nvidia-smi / torch report and what
  SGLang's `mem_fraction_static` multiplies), not the marketing "GB" figure.
- Weight bytes = transformer-layer parameters x bytes of `weight_dtype` + embedding, LM head and
  norms in bf16 (FP8 checkpoints such as Llama-3.1-70B-FP8 keep those in bf16).
- KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes of `kv_cache_dtype`.
- `tensor_parallel = tp` shards weights and KV heads over tp GPUs of the same kind; one worker
  then owns tp x the GPU memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from repro.confutil import to_plain

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class CostModelConfigError(ValueError):
    """A model / hardware / coefficient config that cannot be used (raised before any work)."""


def _config_dict(cfg: Any) -> dict:
    """A model / hardware config as a plain dict (OmegaConf nodes resolved), or a clear error."""
    if cfg is None:
        raise CostModelConfigError("config is None")
    out = to_plain(cfg)
    if not isinstance(out, Mapping):
        raise CostModelConfigError(f"expected a mapping, got {type(cfg).__name__}")
    out = dict(out)
    for key, value in list(out.items()):
        if not isinstance(value, (dict, list, str, int, float, bool, type(None))):
            out[key] = _config_dict(value)  # a config node inside a plain dict; anything else: an error
    return out


def _get(cfg: Mapping, key: str, where: str, kind: type | tuple = (int, float), *, default: Any = ...):
    if key not in cfg or cfg[key] is None:
        if default is not ...:
            return default
        raise CostModelConfigError(f"{where}: missing required key '{key}'")
    value = cfg[key]
    if isinstance(value, bool) and kind is not bool:
        raise CostModelConfigError(f"{where}: '{key}' must be a number, got {value!r}")
    if not isinstance(value, kind):
        raise CostModelConfigError(f"{where}: '{key}' has type {type(value).__name__}, expected {kind}")
    return value


def _positive(value: float, key: str, where: str, *, allow_zero: bool = False) -> float:
    if value < 0 or (value == 0 and not allow_zero):
        raise CostModelConfigError(f"{where}: '{key}' must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def _dtype(cfg: Mapping, key: str, where: str) -> str:
    name = _get(cfg, key, where, str, default="bf16")
    if name not in DTYPE_BYTES:
        raise CostModelConfigError(f"{where}: '{key}'={name!r}, expected one of {sorted(DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of one model (per full model, not per GPU)."""

    name: str
    hf_id: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int  # 0 = dense
    experts_per_token: int  # top-k (0 for dense)
    weight_dtype: str
    kv_cache_dtype: str
    tensor_parallel: int
    profile_name: str | None

    # --- derived architecture quantities (per layer unless said otherwise) ---
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v, o projections (no biases in Llama / Mixtral)."""
        q_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_v = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
        return q_o + k_v

    @property
    def mlp_params(self) -> int:
        """One gated MLP (gate, up, down) = one expert for MoE models."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def dense_params_per_layer(self) -> int:
        """Parameters every token runs through: attention (+ MLP for dense, + router for MoE)."""
        if self.is_moe:
            return self.attn_params_per_layer + self.router_params_per_layer
        return self.attn_params_per_layer + self.mlp_params

    @property
    def expert_params_per_layer(self) -> int:
        return self.num_experts * self.mlp_params

    @property
    def layer_linear_params(self) -> int:
        return self.dense_params_per_layer + self.expert_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding + LM head (one matrix if tied) + per-layer and final RMSNorm weights."""
        matrices = 1 if self.tie_word_embeddings else 2
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return matrices * self.vocab_size * self.hidden_size + norms

    @property
    def num_params(self) -> int:
        return self.num_layers * self.layer_linear_params + self.embedding_params

    @property
    def weight_bytes(self) -> int:
        """Layer weights in `weight_dtype`; embedding, LM head and norms in bf16."""
        return (
            self.num_layers * self.layer_linear_params * DTYPE_BYTES[self.weight_dtype]
            + self.embedding_params * DTYPE_BYTES["bf16"]
        )

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_key_value_heads * self.head_dim * DTYPE_BYTES[self.kv_cache_dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.kv_bytes_per_token_per_layer


@dataclass(frozen=True)
class HardwareSpec:
    """Datasheet numbers of one GPU (dense tensor-core peaks, no sparsity)."""

    name: str
    gpu: str
    memory_bytes: int
    bf16_flops: float  # FLOP/s
    fp8_flops: float | None  # FLOP/s; None = no FP8 tensor cores (FP8 weights run weight-only)
    mem_bandwidth: float  # bytes/s
    interconnect_bandwidth: float | None  # bytes/s per direction (tensor parallel only)
    allreduce_latency_s: float | None
    # Every step time is divided by this: 1 = the datasheet scaling of the H200 fit. A probe of
    # the one number the paper does not give (how fast its L40s really ran), not a measurement.
    speed_factor: float = 1.0

    def gemm_flops(self, weight_dtype: str) -> float:
        """Peak used for weight GEMMs: FP8 tensor cores when the weights are FP8 and the card has them."""
        if weight_dtype == "fp8" and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True)
class Coefficients:
    """Fitted step-cost coefficients of one model (see repro/costmodel/model.py for the form).

    Efficiencies are fractions of the datasheet peak (compute: bf16 dense tensor FLOP/s; memory:
    DRAM bandwidth) and carry over to other GPUs unchanged; the floors are seconds per layer and
    carry over unchanged too (assumption: same host, same runtime).

    `t_cpu_prefix_s` is optional in a config (default 0 = the form without it), so configs saved
    with results before it existed load and reproduce their numbers exactly.
    """

    eta_gemm: float  # dense weight GEMMs, compute-bound side
    eta_weights: float  # weight streaming (dense and expert weights), memory-bound side
    eta_attn: float  # prefill attention FLOPs (SDPA / flash kernels)
    eta_kv: float  # decode attention: KV-cache reads
    eta_head: float  # LM head weight read
    t_cpu_s: float  # per-layer host launch time of a prefill (eager), overlapped with GPU work
    t_floor_s: float  # per-layer fixed GPU time (small kernels, gaps), every step
    p: float  # sharpness of the soft max between overlapping bounds (p -> inf: hard max)
    t_cpu_prefix_s: float = 0.0  # extra per-layer host time of a prefill that attends to a cached prefix
    eta_expert: float | None = None  # MoE grouped expert GEMMs, compute-bound side
    fitted_on: str | None = None

    NAMES_DENSE = (
        "eta_gemm",
        "eta_weights",
        "eta_attn",
        "eta_kv",
        "eta_head",
        "t_cpu_s",
        "t_cpu_prefix_s",
        "t_floor_s",
        "p",
    )
    OPTIONAL = {"t_cpu_prefix_s": 0.0}  # name -> value when a config does not set it

    def names(self, moe: bool) -> tuple[str, ...]:
        return self.NAMES_DENSE + (("eta_expert",) if moe else ())


def model_spec_from_config(model_cfg: Any) -> ModelSpec:
    cfg = _config_dict(model_cfg)
    name = _get(cfg, "name", "model config", str)
    where = f"model config '{name}'"
    arch = cfg.get("architecture")
    if not isinstance(arch, Mapping):
        raise CostModelConfigError(f"{where}: missing 'architecture' mapping")
    aw = f"{where}.architecture"
    ints = {}
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
    ):
        ints[key] = int(_positive(_get(arch, key, aw, int), key, aw))
    num_experts = int(_positive(_get(arch, "num_experts", aw, int, default=0), "num_experts", aw, allow_zero=True))
    top_k = int(
        _positive(_get(arch, "experts_per_token", aw, int, default=0), "experts_per_token", aw, allow_zero=True)
    )
    if num_experts == 0 and top_k != 0:
        raise CostModelConfigError(f"{aw}: experts_per_token={top_k} but num_experts=0 (dense model)")
    if num_experts > 0 and not 1 <= top_k <= num_experts:
        raise CostModelConfigError(f"{aw}: experts_per_token={top_k} must be in [1, num_experts={num_experts}]")
    if ints["num_attention_heads"] % ints["num_key_value_heads"]:
        raise CostModelConfigError(
            f"{aw}: num_attention_heads={ints['num_attention_heads']} is not a multiple of "
            f"num_key_value_heads={ints['num_key_value_heads']}"
        )
    tp = int(_positive(_get(cfg, "tensor_parallel", where, int, default=1), "tensor_parallel", where))
    if ints["num_key_value_heads"] % tp:
        raise CostModelConfigError(
            f"{where}: tensor_parallel={tp} must divide num_key_value_heads={ints['num_key_value_heads']}"
        )
    spec = ModelSpec(
        name=name,
        hf_id=_get(cfg, "hf_id", where, str, default=""),
        tie_word_embeddings=bool(_get(arch, "tie_word_embeddings", aw, bool, default=False)),
        num_experts=num_experts,
        experts_per_token=top_k,
        weight_dtype=_dtype(cfg, "weight_dtype", where),
        kv_cache_dtype=_dtype(cfg, "kv_cache_dtype", where),
        tensor_parallel=tp,
        profile_name=_get(cfg, "profile_name", where, str, default=None),
        **ints,
    )
    # Stated facts must agree with the architecture (catches typos and stale overrides).
    for key, derived in (
        ("num_params", spec.num_params),
        ("weight_bytes", spec.weight_bytes),
        ("kv_bytes_per_token", spec.kv_bytes_per_token),
    ):
        stated = cfg.get(key)
        if stated is not None and int(stated) != derived:
            raise CostModelConfigError(
                f"{where}: {key}={stated} disagrees with the architecture and dtypes ({derived}); "
                f"fix it or set it to null to use the derived value"
            )
    return spec


def hardware_spec_from_config(hardware_cfg: Any) -> HardwareSpec:
    cfg = _config_dict(hardware_cfg)
    name = _get(cfg, "name", "hardware config", str)
    where = f"hardware config '{name}'"
    memory_mib = _positive(_get(cfg, "memory_mib", where), "memory_mib", where)
    bf16 = _positive(_get(cfg, "bf16_dense_tflops", where), "bf16_dense_tflops", where)
    fp8 = _get(cfg, "fp8_dense_tflops", where, default=None)
    if fp8 is not None:
        _positive(fp8, "fp8_dense_tflops", where)
    bw = _positive(_get(cfg, "mem_bandwidth_tb_s", where), "mem_bandwidth_tb_s", where)
    link = _get(cfg, "interconnect_gb_s", where, default=None)
    if link is not None:
        _positive(link, "interconnect_gb_s", where)
    lat = _get(cfg, "allreduce_latency_s", where, default=None)
    if lat is not None:
        _positive(lat, "allreduce_latency_s", where, allow_zero=True)
    speed = _positive(_get(cfg, "speed_factor", where, default=1.0), "speed_factor", where)
    if not math.isfinite(speed):
        raise CostModelConfigError(f"{where}: 'speed_factor' must be finite, got {speed!r}")
    return HardwareSpec(
        name=name,
        gpu=_get(cfg, "gpu", where, str, default=name),
        memory_bytes=int(memory_mib * 2**20),
        bf16_flops=float(bf16) * 1e12,
        fp8_flops=None if fp8 is None else float(fp8) * 1e12,
        mem_bandwidth=float(bw) * 1e12,
        interconnect_bandwidth=None if link is None else float(link) * 1e9,
        allreduce_latency_s=None if lat is None else float(lat),
        speed_factor=float(speed),
    )


def coefficients_from_config(model_cfg: Any, spec: ModelSpec) -> Coefficients:
    cfg = _config_dict(model_cfg)
    where = f"model config '{spec.name}'.cost_model"
    coef = cfg.get("cost_model")
    if not isinstance(coef, Mapping):
        raise CostModelConfigError(
            f"{where}: no fitted coefficients; run `python -m repro.costmodel.calibrate --write`"
        )
    values: dict[str, float] = {}
    names = Coefficients.NAMES_DENSE + (("eta_expert",) if spec.is_moe else ())
    for key in names:
        value = float(_get(coef, key, where, default=Coefficients.OPTIONAL.get(key, ...)))
        if key.startswith("eta_") and not 0 < value <= 2.0:
            raise CostModelConfigError(f"{where}: {key}={value} must be in (0, 2] (a fraction of peak)")
        if key.endswith("_s") and value < 0:
            raise CostModelConfigError(f"{where}: {key}={value} must be >= 0 seconds")
        if key == "p" and value < 1:
            raise CostModelConfigError(f"{where}: p={value} must be >= 1")
        values[key] = value
    return Coefficients(fitted_on=coef.get("fitted_on"), **values)


def kv_capacity_tokens(model_cfg: Any, hardware_cfg: Any, mem_fraction: float) -> int:
    """KV tokens one worker holds: (GPU memory x mem_fraction - weights) / KV bytes per token.

    ARCHITECTURE.md "Experiment defaults". With tensor_parallel = tp the worker spans tp GPUs:
    (tp x memory x mem_fraction - weights) / KV bytes per token (weights and KV heads are sharded).
    """
    if isinstance(mem_fraction, bool) or not isinstance(mem_fraction, (int, float)) or not 0 < mem_fraction <= 1:
        raise CostModelConfigError(f"mem_fraction must be a number in (0, 1], got {mem_fraction!r}")
    model = model_cfg if isinstance(model_cfg, ModelSpec) else model_spec_from_config(model_cfg)
    hw = hardware_cfg if isinstance(hardware_cfg, HardwareSpec) else hardware_spec_from_config(hardware_cfg)
    budget = model.tensor_parallel * hw.memory_bytes * mem_fraction
    free = budget - model.weight_bytes
    if free <= 0:
        raise CostModelConfigError(
            f"model '{model.name}' ({model.weight_bytes / 1e9:.1f} GB of {model.weight_dtype} weights) does not fit "
            f"on {model.tensor_parallel} x {hw.gpu} at mem_fraction={mem_fraction} "
            f"({budget / 1e9:.1f} GB budget): no room for a KV cache; use FP8 weights, tensor_parallel, "
            f"a larger mem_fraction or a larger GPU"
        )
    tokens = int(free // model.kv_bytes_per_token)
    if tokens <= 0:
        raise CostModelConfigError(
            f"model '{model.name}' on {hw.gpu} at mem_fraction={mem_fraction}: {free:.0f} bytes left hold no KV token"
        )
    return tokens
