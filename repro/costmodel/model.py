"""The step-cost model: seconds of one SGLang scheduler step, from a roofline-shaped form.

Per layer, on one GPU (tensor-parallel shards divide every FLOP and byte by tp):

    gemm(T)    = smax(T * 2 P_dense / (eta_gemm F),  P_dense * w / (eta_weights B))
    experts(T) = smax(T * 2 k P_exp / (eta_expert F), D(T) * P_exp * w / (eta_weights B))   [MoE only]
                 D(T) = E (1 - (1 - k/E)^T): expected distinct experts T tokens touch (uniform top-k routing)
    prefill    = smax(t_cpu + [prefix] t_cpu_prefix,  t_floor + gemm(T) + experts(T) + W * 4 H d / (eta_attn F_bf16))
    decode     = t_floor + gemm(b) + experts(b) + C * smax(4 H d / (eta_attn F_bf16), kv / (eta_kv B))
    head(rows) = smax(rows * 2 V h / (eta_gemm F_bf16), V h * 2 / (eta_head B))      (LM head, bf16)

    prefill forward = layers * prefill + head(1);   decode forward = layers * decode + head(b)

T = prefill new tokens, W = prefill attention work sum n (c + n/2), b = decode batch, C = decode
context tokens (sum over the batch), P_dense / P_exp = parameters per layer every token uses /
of one expert, w = bytes per weight, kv = KV bytes per token per layer, H d = heads x head_dim,
F / B = datasheet tensor FLOP/s / memory bandwidth. smax(x, y) = (x^p + y^p)^(1/p) is a soft
roofline: kernels whose compute and memory times are close overlap imperfectly (p -> inf gives
the hard max). Each kernel family (weight GEMMs, expert GEMMs, attention) is bounded on its own
and the families add up, because they run one after another. Prefill runs eagerly, so its host
launch time t_cpu overlaps the GPU work (smax again); decode runs in CUDA graphs (no host term).

Cached-prefix overhead t_cpu_prefix ([prefix] = 1 when a prefilled request attends to a cached
prefix, else 0). In the profile, small (launch-bound) prefills take one time without a cached prefix
and a higher, c-independent time with one (8B, 16-64 new tokens: 0.39-0.42 ms per layer at c = 0,
0.58-0.72 ms at c = 2k-16k; the repeat run shows the same step, smaller: 0.49-0.50 vs 0.60-0.62 ms),
while from 1024 new tokens on the step hides under the GPU work. We take it as host time, not GPU
time: the profiled eager PyTorch layer calls SDPA with plain `is_causal` without a prefix but with a
lower-right causal mask with one, and that path does more per-layer host work before the same
attention FLOPs (which part -- input checks, backend selection, mask construction -- was not
measured). So it adds to the host launch time and overlaps GPU work like t_cpu. It does not grow
with c: small-prefill times are flat from c = 2k to 16k, and a term linear in c instead fits the 8B
profile worse (in-sample MRE 8.0 % vs 3.8 %; see calibrate). One fitted number per model; it may
come out ~0 where the data do not need it.
  - It is a property of the profiled eager implementation (PyTorch version, host CPU), not of the
    GPU: like t_cpu it is assumed the same on every card (assumption, not measured). On slower cards
    small prefills are GPU-bound and it mostly hides under the GPU work (8B, 128 new on 2048 cached:
    +8 % on the L40, +31 % on the A100, +60 % on the H200).
  - A real SGLang server has the same kind of switch (its attention backends run extra kernels, e.g.
    a paged-prefix pass and a merge, when any request of the batch has a prefix: `extend_no_prefix`)
    but its size there was not measured; the profiled value is used as is.
  - Per step, not per request: charged once when ANY prefilled request of the step has a cached
    prefix (as SGLang's batch-level switch). Callers that know it pass `prefill_has_cached_prefix`;
    otherwise it is derived from (T, W): the step has a prefix iff W > T^2 / 2, i.e. its attention
    work exceeds that of its T new tokens as one fresh sequence. That is exact for one request
    (W - T^2/2 = n c) and for any batch without prefixes (W = sum n_i^2 / 2 < T^2 / 2); a batch WITH
    prefixes counts only if sum n_i c_i > sum_{i<j} n_i n_j (prefixes long against the co-batched new
    tokens). A miss under-charges by at most layers x t_cpu_prefix, and only while the step is
    launch-bound (on the H200, 8B prefills under ~1k new tokens).
  - Monotonicity: every time is non-decreasing in tokens, attention work, batch, context and the flag
    (prefill_time_s(n, c) in n and in c: c = 0 -> c > 0 steps up). With the derived flag, adding new
    tokens at FIXED attention work can switch the flag off (same work spread over fresher sequences);
    that is the only way a step gets cheaper (tested).

Choices the paper leaves open:
- A step holding both a prefill batch and a decode batch costs the SUM of the two forwards:
  SGLang (without --enable-mixed-chunk, its default) runs them as separate forward passes.
  A mixed-chunk step would read the weights once, so the sum overestimates it by at most one
  weight read (the smaller of the two forwards).
- Prefill samples one row per step for the LM head (rows barely matter: the head is
  weight-read bound); decode samples one row per request.
- Prefill attention is compute-bound here (reading the cached prefix is included in the FLOPs
  fit; dropping an explicit KV-read term did not change the fit on the profile).
- Scheduler CPU time between steps and sampling are not modelled (not in the profile).
- Other GPUs: every efficiency is a fraction of the datasheet peak, fitted on the H200, and is
  assumed to carry over to any card (with its own datasheet FLOP/s and bandwidth); the floors
  t_cpu, t_cpu_prefix and t_floor are assumed hardware independent. This is an assumption, not a
  measurement.
- FP8 weights: weight bytes halve and weight GEMMs use the card's FP8 tensor peak when it has
  one (A100 has none: weight-only FP8 at the bf16 rate); attention and LM head stay bf16.
- tensor_parallel = tp > 1 (not in the profile): per-GPU terms divide by tp and each layer adds
  two ring all-reduces of the activations: 2 (latency + 2 (tp-1)/tp * T h * 2 B / link).

Speed: the simulator calls step_time_s on every step and LBGR on every request for every
worker, so the hot path is plain float arithmetic on precomputed constants (no numpy).
"""

from __future__ import annotations

from typing import Any

from repro.costmodel.specs import (
    DTYPE_BYTES,
    Coefficients,
    CostModelConfigError,
    HardwareSpec,
    ModelSpec,
    coefficients_from_config,
    hardware_spec_from_config,
    model_spec_from_config,
)


class StepCostModel:
    """Seconds per scheduler step for one (model, GPU); see the module docstring for the form."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, coefficients: Coefficients):
        if model.is_moe and coefficients.eta_expert is None:
            raise CostModelConfigError(f"model '{model.name}' is MoE but its coefficients have no eta_expert")
        self.model = model
        self.hardware = hardware
        self.coefficients = coefficients
        c = coefficients
        tp = model.tensor_parallel
        f_gemm = hardware.gemm_flops(model.weight_dtype)
        f_bf16 = hardware.bf16_flops
        bw = hardware.mem_bandwidth
        w_bytes = DTYPE_BYTES[model.weight_dtype]
        hd = model.num_attention_heads * model.head_dim

        self._layers = float(model.num_layers)
        self._p = float(c.p)
        self._inv_p = 1.0 / float(c.p)
        self._t_cpu = float(c.t_cpu_s)
        self._t_cpu_with_prefix = float(c.t_cpu_s) + float(c.t_cpu_prefix_s)
        self._t_floor = float(c.t_floor_s)
        # Dense weight GEMMs: seconds per token (compute side) and per step (weight read).
        self._gemm_tok = 2.0 * model.dense_params_per_layer / tp / (c.eta_gemm * f_gemm)
        self._gemm_read = model.dense_params_per_layer * w_bytes / tp / (c.eta_weights * bw)
        # MoE experts: compute per token (k experts each), weight read per distinct expert.
        self._moe = model.is_moe
        if self._moe:
            self._num_experts = float(model.num_experts)
            self._expert_keep = 1.0 - model.experts_per_token / model.num_experts
            self._exp_tok = 2.0 * model.experts_per_token * model.mlp_params / tp / (c.eta_expert * f_gemm)
            self._exp_read = model.mlp_params * w_bytes / tp / (c.eta_weights * bw)
        else:
            self._num_experts = 0.0
            self._expert_keep = 1.0
            self._exp_tok = 0.0
            self._exp_read = 0.0
        # Attention: prefill per unit of attention work (FLOPs); decode per context token (max of
        # FLOPs and KV read, both proportional to the context, so the soft max is a constant).
        self._attn_work = 4.0 * hd / tp / (c.eta_attn * f_bf16)
        kv_read = model.kv_bytes_per_token_per_layer / tp / (c.eta_kv * bw)
        self._attn_ctx = self._smax(self._attn_work, kv_read)
        # LM head (bf16): compute per sampled row, weight read per step.
        head_params = model.vocab_size * model.hidden_size / tp
        self._head_row = 2.0 * head_params / (c.eta_gemm * f_bf16)
        self._head_read = head_params * DTYPE_BYTES["bf16"] / (c.eta_head * bw)
        # Tensor-parallel all-reduces (two per layer); zero for tp = 1.
        if tp > 1:
            if not hardware.interconnect_bandwidth or hardware.allreduce_latency_s is None:
                raise CostModelConfigError(
                    f"tensor_parallel={tp} needs 'interconnect_gb_s' and 'allreduce_latency_s' in hardware "
                    f"config '{hardware.name}'"
                )
            self._ar_step = 2.0 * hardware.allreduce_latency_s
            self._ar_tok = 2.0 * 2.0 * (tp - 1) / tp * model.hidden_size * 2 / hardware.interconnect_bandwidth
        else:
            self._ar_step = 0.0
            self._ar_tok = 0.0
        # step_time_s's batch-independent prefill head term and memos (floats as computed inline)
        x, y = self._head_row, self._head_read
        if x < y:
            x, y = y, x
        self._head1 = x * (1.0 + (y / x) ** self._p) ** self._inv_p
        self._gemm_memo: dict = {}
        self._decode_memo: dict = {}
        # hardware.speed_factor: x / 1.0 is x, so the default changes no float
        self._speed = float(hardware.speed_factor)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model_cfg: Any, hardware_cfg: Any) -> "StepCostModel":
        """Build from `conf/model/<m>.yaml` and `conf/hardware/<g>.yaml` (dicts or DictConfigs)."""
        model = model_spec_from_config(model_cfg)
        hardware = hardware_spec_from_config(hardware_cfg)
        return cls(model, hardware, coefficients_from_config(model_cfg, model))

    def __repr__(self) -> str:
        return f"StepCostModel(model={self.model.name!r}, hardware={self.hardware.name!r})"

    @property
    def name(self) -> str:
        return f"{self.model.name}@{self.hardware.name}"

    # ------------------------------------------------------------------ building blocks
    def _smax(self, x: float, y: float) -> float:
        if x < y:
            x, y = y, x
        if y <= 0.0:
            return x
        return x * (1.0 + (y / x) ** self._p) ** self._inv_p

    def expected_distinct_experts(self, tokens: float) -> float:
        """E (1 - (1 - k/E)^t): expected number of experts a batch of t tokens touches (0 if dense)."""
        if not self._moe or tokens <= 0:
            return 0.0
        return self._num_experts * (1.0 - self._expert_keep**tokens)

    def _weights_s(self, tokens: float) -> float:
        """Dense GEMMs (+ expert GEMMs) for `tokens` tokens, one layer."""
        t = self._smax(tokens * self._gemm_tok, self._gemm_read)
        if self._moe:
            distinct = self._num_experts * (1.0 - self._expert_keep**tokens)
            t += self._smax(tokens * self._exp_tok, distinct * self._exp_read)
        return t

    def layer_prefill_s(self, new_tokens: float, attn_work: float, has_cached_prefix: bool | None = None) -> float:
        """One layer of a prefill forward over `new_tokens` with attention work `attn_work`.

        `has_cached_prefix`: whether a prefilled request attends to a cached prefix (None: derived,
        attn_work > new_tokens^2 / 2; see the module docstring).
        """
        if has_cached_prefix is None:
            has_cached_prefix = attn_work > 0.5 * new_tokens * new_tokens
        host = self._t_cpu_with_prefix if has_cached_prefix else self._t_cpu
        gpu = (
            self._t_floor
            + self._weights_s(new_tokens)
            + attn_work * self._attn_work
            + self._ar_step
            + new_tokens * self._ar_tok
        )
        return self._smax(host, gpu)

    def layer_decode_s(self, batch: float, context_tokens: float) -> float:
        """One layer of a decode step: `batch` requests holding `context_tokens` KV tokens in total."""
        return (
            self._t_floor
            + self._weights_s(batch)
            + context_tokens * self._attn_ctx
            + self._ar_step
            + batch * self._ar_tok
        )

    def head_s(self, rows: float) -> float:
        """LM head on `rows` sampled rows."""
        return self._smax(rows * self._head_row, self._head_read)

    # ------------------------------------------------------------------ the contract
    def step_time_s(
        self,
        prefill_tokens: float,
        prefill_attn_work: float,
        decode_batch: float,
        decode_context_tokens: float,
        prefill_has_cached_prefix: bool | None = None,
    ) -> float:
        """Seconds of one scheduler step: a prefill forward and/or a decode forward (summed).

        `prefill_attn_work` = sum over the prefilled requests of n (c + n/2) (n new, c cached);
        `decode_context_tokens` = KV tokens held by the whole decode batch;
        `prefill_has_cached_prefix` = whether any prefilled request has c > 0 (None: derived from
        the attention work, exact for one request; see the module docstring).
        """
        if prefill_tokens < 0 or prefill_attn_work < 0 or decode_batch < 0 or decode_context_tokens < 0:
            raise ValueError(
                f"step_time_s: negative input ({prefill_tokens}, {prefill_attn_work}, {decode_batch}, "
                f"{decode_context_tokens})"
            )
        p = self._p
        inv_p = self._inv_p
        total = 0.0
        if prefill_tokens > 0:
            # Inlined layer_prefill_s + head_s(1) (hot path); the dense GEMM term of a token
            # count is memoised (the same expression, so the same float)
            gpu = self._gemm_memo.get(prefill_tokens)
            if gpu is None:
                x = prefill_tokens * self._gemm_tok
                y = self._gemm_read
                if x < y:
                    x, y = y, x
                gpu = x * (1.0 + (y / x) ** p) ** inv_p
                if len(self._gemm_memo) < 65536:
                    self._gemm_memo[prefill_tokens] = gpu
            if self._moe:
                x = prefill_tokens * self._exp_tok
                y = self._num_experts * (1.0 - self._expert_keep**prefill_tokens) * self._exp_read
                if x < y:
                    x, y = y, x
                gpu += x * (1.0 + (y / x) ** p) ** inv_p
            gpu += self._t_floor + prefill_attn_work * self._attn_work + self._ar_step + prefill_tokens * self._ar_tok
            if prefill_has_cached_prefix is None:
                prefill_has_cached_prefix = prefill_attn_work + prefill_attn_work > prefill_tokens * prefill_tokens
            x = self._t_cpu_with_prefix if prefill_has_cached_prefix else self._t_cpu
            if x < gpu:
                x, gpu = gpu, x
            layer = x * (1.0 + (gpu / x) ** p) ** inv_p if gpu > 0.0 else x
            total = self._layers * layer + self._head1
        if decode_batch > 0:
            gemms, head = self._decode_terms(decode_batch)
            layer = gemms + (
                self._t_floor + decode_context_tokens * self._attn_ctx + self._ar_step + decode_batch * self._ar_tok
            )
            total += self._layers * layer + head
        return total / self._speed

    def decode_step_time_s(self, decode_batch: int, decode_context_tokens: float) -> float:
        """`step_time_s(0, 0.0, decode_batch, decode_context_tokens)`, float for float, with the
        batch-size-only terms (weight GEMMs, LM head) memoised per batch size (the simulator's
        decode steps)."""
        terms = self._decode_memo.get(decode_batch)
        if terms is None:
            if not decode_batch > 0 or decode_context_tokens < 0:
                return self.step_time_s(0, 0.0, decode_batch, decode_context_tokens)
            terms = self._decode_memo[decode_batch] = self._decode_terms(decode_batch)
        if decode_context_tokens < 0:
            return self.step_time_s(0, 0.0, decode_batch, decode_context_tokens)
        layer = terms[0] + (
            self._t_floor + decode_context_tokens * self._attn_ctx + self._ar_step + decode_batch * self._ar_tok
        )
        return (0.0 + (self._layers * layer + terms[1])) / self._speed

    def _decode_terms(self, decode_batch: int) -> tuple[float, float]:
        """step_time_s's decode terms that depend on the batch size only: (GEMMs of a layer, LM head)."""
        p = self._p
        inv_p = self._inv_p
        x = decode_batch * self._gemm_tok
        y = self._gemm_read
        if x < y:
            x, y = y, x
        layer = x * (1.0 + (y / x) ** p) ** inv_p
        if self._moe:
            x = decode_batch * self._exp_tok
            y = self._num_experts * (1.0 - self._expert_keep**decode_batch) * self._exp_read
            if x < y:
                x, y = y, x
            layer += x * (1.0 + (y / x) ** p) ** inv_p
        x = decode_batch * self._head_row
        y = self._head_read
        if x < y:
            x, y = y, x
        return layer, x * (1.0 + (y / x) ** p) ** inv_p

    def prefill_time_s(self, new_tokens: float, cached_tokens: float = 0) -> float:
        """One request prefilled alone: `new_tokens` on top of `cached_tokens` already in the cache."""
        if cached_tokens < 0:
            raise ValueError(f"prefill_time_s: cached_tokens={cached_tokens} < 0")
        return self.step_time_s(new_tokens, new_tokens * (cached_tokens + new_tokens / 2.0), 0, 0, cached_tokens > 0)

    def decode_time_s(self, batch: float, context_tokens: float) -> float:
        """One decode step of `batch` requests holding `context_tokens` KV tokens in total."""
        return self.step_time_s(0, 0, batch, context_tokens)
