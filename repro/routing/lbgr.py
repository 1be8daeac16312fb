"""LBGR — Learning-Based Greedy Routing (paper §4.2, Algorithm 2), a reconstruction.

Per arriving query q_j and every worker i:

    h_ij  = tracked cached-prefix length of q_j on worker i        (global cache tracker)
    u_ij  = |q_j| - h_ij                                           (miss tokens)
    S_ij  = worker i's step-cost model: prefill of u_ij new tokens on top of h_ij cached ones
            + (o - 1) decode steps at batch 1 with |q_j| tokens of context, o = expected output
            length (the first output token comes out of the prefill step)
    P_i   = queue-load estimate (seconds of estimated service queued on worker i)
    phi   = [1, h_ij / token_scale, u_ij / token_scale, P_i / load_scale_s]
    E_ij  = S_ij + P_i + theta_i . phi                              (residual model per worker)

route to argmin_i E_ij (ties: lowest P_i, then lowest worker id); then P_i += S_ij. On the
completion of q_j with realised end-to-end latency E, theta_i is updated online on the
sample (phi, E - S_ij - P_i) — i.e. it minimises (E - E_hat)^2 — with recursive least
squares with forgetting (`learner: rls`) or plain SGD (`learner: sgd`); `learner: none`
drops the residual (ablation).

Every choice the paper leaves open is a constructor argument = a key of conf/router/lbgr.yaml:

- tracker: "approximate" (default; the paper's rows) = one router-side RadixCache per worker
  (repro.kvcache.make_cache) with the worker's capacity B_i (view.kv_capacity_tokens) and
  eviction policy (view.eviction_policy, at `tracker_granularity`, default "node" like
  SGLang). On dispatch the prompt is an access of the chosen worker's tracker (match_prefix,
  lock the matched path, evict what the new tokens need, unlock, insert: SGLang's order); on
  completion the full path prompt + generated tokens is inserted the same way. A path longer
  than B_i is cut to its first B_i tokens. The tracker does not model the worker's in-flight
  locks. Hits are read with peek_prefix, so evaluating all M workers changes no tracker.
  "exact" (labelled ablation; simulator only) reads the workers' real caches through
  WorkerView.peek_prefix (never match_prefix: routing must not disturb eviction state).
- Expected output length o: mean output length of the requests completed so far (all
  workers), `output_len_prior` (default 1 token) before the first completion. Never the
  request's true output_len unless `oracle_output_len: true` (labelled ablation).
- decay: "exponential" (default): P_i is multiplied by decay_factor (gamma, 0.9) once per
  elapsed decay_interval_s (Delta t, 0.1 s) of `now_s`; intervals are counted on the grid
  k * Delta t (k = floor(now_s / Delta t + 1e-9), the 1e-9 absorbing float error in
  e.g. 0.3 / 0.1) and applied lazily at each call, so an idle stretch decays exactly as
  if a timer had fired. "drain" (extra row): P_i -= elapsed time * service rate_i, where
  rate_i = the estimated work (sum of S) completed on worker i in an exponentially
  weighted window of drain_time_constant_s (5 s), divided by that time constant, but at
  least drain_min_rate (1.0: a worker finishes at least one second of estimated service
  per second while busy). P_i is clamped at >= 0 in both variants.
- Features are scaled to O(1): tokens by token_scale (1024), load by load_scale_s (1 s).
- RLS: forgetting_factor 0.99, initial covariance rls_init_var * I (1.0), bounded trace
  rls_max_trace (1e4) — see repro.routing.learners.RLSLearner. SGD: sgd_learning_rate 0.01.
  theta starts at 0, so the first decisions use E = S + P.
- A completion the router did not dispatch (unknown request id) is ignored.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from repro.routing.base import Router, WorkerView, check_choice, token_key
from repro.routing.learners import RLSLearner, SGDLearner

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

_TICK_EPS = 1e-9
NUM_FEATURES = 4


def _default_cache_factory(capacity_tokens: int, eviction_cfg: dict, seed: int):
    from repro.kvcache import make_cache  # lazy: only the approximate tracker needs it

    return make_cache(capacity_tokens, eviction_cfg, seed)


def tracker_access(cache, key: bytes) -> int:
    """Access `key` (packed int32) in a tracker cache the way an SGLang worker would.

    match_prefix (an access), lock the matched path, evict what the new tokens need, unlock,
    insert whatever fits. Returns the number of tokens inserted (the path, cut to capacity).
    """
    n = min(len(key) // 4, cache.capacity_tokens)
    key = key[: 4 * n]
    match = cache.match_prefix(key)
    cache.inc_lock_ref(match.last_node)
    need = (n - match.length) - cache.free_tokens()
    if need > 0:
        cache.evict(need)
    cache.dec_lock_ref(match.last_node)
    fit = min(n, match.length + cache.free_tokens())
    cache.insert(key[: 4 * fit])
    return fit


class LBGRRouter(Router):
    name = "lbgr"

    def __init__(
        self,
        name: str = "lbgr",
        tracker: str = "approximate",
        tracker_granularity: str = "node",
        decay: str = "exponential",
        decay_factor: float = 0.9,
        decay_interval_s: float = 0.1,
        drain_time_constant_s: float = 5.0,
        drain_min_rate: float = 1.0,
        learner: str = "rls",
        forgetting_factor: float = 0.99,
        rls_init_var: float = 1.0,
        rls_max_trace: float = 1.0e4,
        sgd_learning_rate: float = 0.01,
        token_scale: float = 1024.0,
        load_scale_s: float = 1.0,
        output_len_prior: float = 1.0,
        oracle_output_len: bool = False,
        cache_factory: Callable | None = None,
    ) -> None:
        self.name = name
        self.tracker = check_choice("tracker", tracker, ("approximate", "exact"))
        self.tracker_granularity = check_choice("tracker_granularity", tracker_granularity, ("node", "token"))
        self.decay = check_choice("decay", decay, ("exponential", "drain"))
        self.learner_kind = check_choice("learner", learner, ("rls", "sgd", "none"))
        if not 0.0 < decay_factor <= 1.0:
            raise ValueError(f"decay_factor must be in (0, 1], got {decay_factor}")
        for key, value in (
            ("decay_interval_s", decay_interval_s),
            ("drain_time_constant_s", drain_time_constant_s),
            ("token_scale", token_scale),
            ("load_scale_s", load_scale_s),
        ):
            if not value > 0:
                raise ValueError(f"{key} must be > 0, got {value}")
        if drain_min_rate < 0:
            raise ValueError(f"drain_min_rate must be >= 0, got {drain_min_rate}")
        if output_len_prior < 1:
            raise ValueError(f"output_len_prior must be >= 1 token, got {output_len_prior}")
        self.decay_factor = float(decay_factor)
        self.decay_interval_s = float(decay_interval_s)
        self.drain_time_constant_s = float(drain_time_constant_s)
        self.drain_min_rate = float(drain_min_rate)
        self.forgetting_factor = float(forgetting_factor)
        self.rls_init_var = float(rls_init_var)
        self.rls_max_trace = float(rls_max_trace)
        self.sgd_learning_rate = float(sgd_learning_rate)
        self.token_scale = float(token_scale)
        self.load_scale_s = float(load_scale_s)
        self.output_len_prior = float(output_len_prior)
        self.oracle_output_len = bool(oracle_output_len)
        self.cache_factory = cache_factory or _default_cache_factory
        # Fail on a bad learner setting now, not at the first reset.
        self._make_learner(1)

    # ------------------------------------------------------------------ lifecycle
    def _make_learner(self, num_workers: int):
        if self.learner_kind == "rls":
            return RLSLearner(
                num_workers, NUM_FEATURES, self.forgetting_factor, self.rls_init_var, self.rls_max_trace
            )
        if self.learner_kind == "sgd":
            return SGDLearner(num_workers, NUM_FEATURES, self.sgd_learning_rate)
        return None

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        m = self.num_workers
        self.load_est = np.zeros(m)  # P_i, seconds
        self.learner = self._make_learner(m)
        self.pending: dict[int, tuple[int, np.ndarray, float, float]] = {}
        self.output_sum = 0.0
        self.output_count = 0
        self._last_tick: int | None = None
        self._last_now: float | None = None
        self.work_done = np.zeros(m)  # drain: exponentially weighted completed estimated work
        self.caches = None
        if self.tracker == "approximate":
            seeds = np.random.SeedSequence(seed).spawn(m)
            self.caches = [
                self.cache_factory(
                    int(w.kv_capacity_tokens),
                    {"name": w.eviction_policy, "granularity": self.tracker_granularity},
                    int(s.generate_state(1)[0]),
                )
                for w, s in zip(workers, seeds)
            ]

    # ------------------------------------------------------------------ routing
    def expected_output_len(self, request: "Request") -> float:
        if self.oracle_output_len:
            return float(request.output_len)
        if self.output_count == 0:
            return self.output_len_prior
        return self.output_sum / self.output_count

    def _evaluate(self, request: "Request", workers: Sequence[WorkerView], now_s: float):
        """Hot path: decay, then (key, hits, S, E) per worker as Python lists.

        A plain loop over M workers: for M <= ~16 it beats building (M, 4) numpy arrays.
        """
        self._advance(now_s)
        key = token_key(request.prompt_tokens)
        prompt_len = len(key) // 4
        if self.caches is None:
            hits = [w.peek_prefix(key) for w in workers]
        else:
            hits = [c.peek_prefix(key) for c in self.caches]
        decode_steps = max(self.expected_output_len(request) - 1.0, 0.0)
        loads = self.load_est.tolist()
        rows = self.learner.theta_rows if self.learner is not None else None
        ts, ls = self.token_scale, self.load_scale_s
        service: list[float] = []
        predicted: list[float] = []
        memo: dict[tuple[int, int], float] = {}
        for i, w in enumerate(workers):
            hit = hits[i]
            cm = w.cost_model
            s = memo.get((id(cm), hit))
            if s is None:
                d = memo.get((id(cm), -1))
                if d is None:
                    d = decode_steps * cm.decode_time_s(1, prompt_len) if decode_steps > 0 else 0.0
                    memo[(id(cm), -1)] = d
                s = cm.prefill_time_s(prompt_len - hit, hit) + d
                memo[(id(cm), hit)] = s
            p = loads[i]
            e = s + p
            if rows is not None:
                t0, t1, t2, t3 = rows[i]
                e = e + (t0 + t1 * (hit / ts) + t2 * ((prompt_len - hit) / ts) + t3 * (p / ls))
            service.append(s)
            predicted.append(e)
        return key, hits, service, predicted

    def features(self, hit: int, prompt_len: int, load_s: float) -> np.ndarray:
        """phi = [1, hit / token_scale, miss / token_scale, load / load_scale_s]."""
        return np.array(
            [1.0, hit / self.token_scale, (prompt_len - hit) / self.token_scale, load_s / self.load_scale_s]
        )

    def estimate(self, request: "Request", workers: Sequence[WorkerView], now_s: float):
        """(key, hits, S, phi, E) for every worker at `now_s`, as numpy arrays (tests, diagnostics).

        Applies the decay up to now_s; changes nothing else.
        """
        key, hits, service, predicted = self._evaluate(request, workers, now_s)
        prompt_len = len(key) // 4
        phi = np.array([self.features(h, prompt_len, p) for h, p in zip(hits, self.load_est.tolist())])
        return key, hits, np.array(service), phi, np.array(predicted)

    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        key, hits, service, predicted = self._evaluate(request, workers, now_s)
        load = self.load_est
        loads = load.tolist()
        worker = 0
        for i in range(1, len(predicted)):  # argmin; ties -> lower load, then lower id
            if predicted[i] < predicted[worker] or (
                predicted[i] == predicted[worker] and loads[i] < loads[worker]
            ):
                worker = i
        s, p = service[worker], loads[worker]
        phi = self.features(hits[worker], len(key) // 4, p)
        self.pending[request.id] = (worker, phi, s + p, s)
        load[worker] = p + s
        if self.caches is not None:
            tracker_access(self.caches[worker], key)
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        record = self.pending.pop(request.id, None)
        if record is None:
            return
        worker, phi, base, service = record
        if worker != worker_id:
            raise ValueError(
                f"request {request.id} was dispatched to worker {worker} but completed on {worker_id}"
            )
        if now_s is not None:
            self._advance(now_s)
        self.output_sum += float(request.output_len)
        self.output_count += 1
        if self.learner is not None:
            self.learner.update(worker, phi, float(latency_s) - base)
        if self.decay == "drain":
            self.work_done[worker] += service
        if self.caches is not None:
            full = token_key(request.prompt_tokens) + token_key(request.generated_tokens)
            tracker_access(self.caches[worker], full)

    # ------------------------------------------------------------------ decay
    def _advance(self, now_s: float) -> None:
        now_s = float(now_s)
        if self.decay == "exponential":
            tick = math.floor(now_s / self.decay_interval_s + _TICK_EPS)
            if self._last_tick is None:
                self._last_tick = tick
            elif tick > self._last_tick:
                self.load_est *= self.decay_factor ** (tick - self._last_tick)
                self._last_tick = tick
            return
        if self._last_now is None:
            self._last_now = now_s
            return
        dt = now_s - self._last_now
        if dt <= 0:
            return
        tau = self.drain_time_constant_s
        rate = np.maximum(self.work_done / tau, self.drain_min_rate)
        np.maximum(self.load_est - dt * rate, 0.0, out=self.load_est)
        self.work_done *= math.exp(-dt / tau)
        self._last_now = now_s
