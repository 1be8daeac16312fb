"""LBGR — Learning-Based Greedy Routing (paper §4.2, Algorithm 2), a reconstruction.

Per arriving query q_j and every worker i:

    h_ij  = tracked cached-prefix length of q_j on worker i        (global cache tracker)
    u_ij  = |q_j| - h_ij                                           (miss tokens)
    S_ij  = service-time estimate from worker i's step-cost model (see service_model)
    P_i   = queue-load estimate: += S on dispatch, x gamma every Delta t
    phi   = [1, h_ij / token_scale, u_ij / token_scale, P_i / load_scale_s]
    E_ij  = S_ij + P_i + r_ij,   r_ij = theta_i . phi                (residual model per worker)

route to argmin_i E_ij (ties: lowest P_i, then lowest worker id); then P_i += S_ij. On the
completion of q_j with realised end-to-end latency E, theta_i is updated online on the
sample (phi, E - S_ij - P_i) — i.e. it minimises (E - E_hat)^2.

Every choice the paper leaves open is a constructor argument = a key of conf/router/lbgr.yaml.
The defaults were chosen on tuning cells only and checked on the evaluation cells (protocol,
numbers and the ablations: REPRODUCE.md "LBGR reconstruction", repro/routing/lbgr_diagnostics.py).

- tracker: "approximate" (default; the paper's rows) = router-side radix trees, no access to
  the workers. Per worker: a RadixCache (repro.kvcache.make_cache) of the worker's capacity
  B_i (view.kv_capacity_tokens) and eviction policy (view.eviction_policy, at
  `tracker_granularity`, default "node" like SGLang), plus, with tracker_update "inflight"
  (default), an unbounded tree of the prompts in flight on that worker (dispatched, not yet
  completed). h = max(hit in the cache tree, hit in the in-flight tree).
  * inflight (default): a prompt enters the in-flight tree on dispatch and leaves it on
    completion, when prompt + generated tokens become an access of the cache tree (match_prefix,
    lock the matched path, evict what the new tokens need, unlock, insert: SGLang's order).
    Why: a worker caches a prompt only once it is ADMITTED, and under a queue that is long
    after the dispatch; a request queued behind a same-prefix one will hit (lpm scheduling
    even batches them). The cache tree therefore sees accesses in completion order (~ the
    worker's admission order) and is never polluted by queued prompts.
  * dispatch (ablation, the first reconstruction): the prompt is an access of the cache tree
    on dispatch. With queues longer than the cache (overload, LooGLE) queued prompts evict, in
    the tracker, prefixes the worker still holds: the tracker loses a prefix's home, LBGR
    spreads its queries and the hit rate collapses.
  A path longer than B_i is cut to its first B_i tokens. The trackers do not model the
  worker's locks. Lookups change no tree: all M workers' hits come from one walk of a shared
  index whose nodes carry the workers holding them (repro.routing.trackers: the per-worker
  caches keep the eviction state, the index mirrors their content), not from M peeks.
  "exact" (labelled ablation; simulator only) reads the workers' real caches through
  WorkerView.peek_prefix (never match_prefix: routing must not disturb eviction state).
- Expected output length o: mean output length of the requests completed so far (all
  workers), `output_len_prior` (default 1 token) before the first completion. Never the
  request's true output_len unless `oracle_output_len: true` (labelled ablation).
- service_model: what S is. Both: prefill of u new tokens on top of h cached ones (the
  request alone) + its decode steps (o - 1; the first token comes out of the prefill step).
  * kv_batch (default): its 1/b share of (o - 1) decode steps of a batch of b requests like it,
    b = floor(B_i / (|q| + o)) (>= 1): the worker time the request takes when the worker runs
    the batch its KV cache allows -- what a continuous-batching worker does under load, the
    only time P matters. Uses only the worker's capacity, not its momentary queue.
  * batch1 (ablation, the first reconstruction): (o - 1) decode steps at batch 1, i.e. the
    request served alone. For long answers this charges P with decode work a batched worker
    shares (o = 128: ~3.8 s per request on L40): P then swamps the cache term, LBGR routes by
    load alone and loses the cache.
  Decode context: |q| tokens per request.
- decay: "exponential" (default): P_i is multiplied by decay_factor (gamma, 0.6) once per
  elapsed decay_interval_s (Delta t, 0.1 s) of `now_s`; intervals are counted on the grid
  k * Delta t (k = floor(now_s / Delta t + 1e-9), the 1e-9 absorbing float error in
  e.g. 0.3 / 0.1) and applied lazily at each call, so an idle stretch decays exactly as
  if a timer had fired. "drain" (extra row): P_i -= elapsed time * service rate_i, where
  rate_i = the estimated work (sum of S) completed on worker i in an exponentially
  weighted window of drain_time_constant_s (5 s), divided by that time constant, but at
  least drain_min_rate (1.0: a worker finishes at least one second of estimated service
  per second while busy). P_i is clamped at >= 0 in both variants.
- Features are scaled to O(1) on typical prompts: tokens by token_scale (1024), load by
  load_scale_s (1 s). Fixed scales (a running-mean scaling was tried and tuned worse).
- learner "rls" (default) with rls_regularization > 0 (default 500): exponentially weighted
  ridge regression per worker (forgetting_factor 0.99) whose prior is the same regression
  pooled over all workers (rls_pooled, prior worth rls_pool_regularization = 3 samples) --
  repro.routing.learners.RidgeRLSLearner. Why: the samples are few, delayed by one latency
  and selection-biased (a worker only learns when it wins the argmin); a free per-worker
  model (the first reconstruction) drifts on a few unlucky samples, its intercept then keeps
  the worker out of the argmin, the others pile up, and the run oscillates (GSP, LooGLE). A
  systematic bias (P overestimates the real wait at moderate load; S misses the decode
  latency of long answers) is common to identical workers and is learned by the pool.
  rls_regularization 0: plain RLS with forgetting per worker (initial covariance
  rls_init_var * I, bounded trace rls_max_trace; ablation). "sgd": plain SGD
  (sgd_learning_rate). "none": no residual (ablation). theta starts at 0 (E = S + P).
- min_load_weight (default 0.25): the residual may rescale the load term but not invert it:
  at prediction, theta3 is raised to -(1 - min_load_weight) * load_scale_s when below, so
  that dE/dP >= min_load_weight. Why: a learned dE/dP <= 0 (seen at 128-token answers) makes
  the most loaded worker look the cheapest and every query piles onto it. null = no floor.
- A completion the router did not dispatch (unknown request id) is ignored.

Information used, all available to a live router (repro.backends.sglang.router_service): the
request's prompt tokens, its own dispatch/completion events (latency, generated tokens), and
from WorkerView only kv_capacity_tokens, eviction_policy and cost_model (peek_prefix only
with tracker "exact"). Never the workers' queues, never a request's true output length.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from repro.kvcache import as_key
from repro.routing.base import Router, WorkerView, check_choice
from repro.routing.learners import RidgeRLSLearner, RLSLearner, SGDLearner
from repro.routing.trackers import ApproximateTracker, tracker_access

__all__ = ["LBGRRouter", "tracker_access"]  # tracker_access: the live router service's import

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

_TICK_EPS = 1e-9
NUM_FEATURES = 4
# From this many workers on, a decision evaluates E with numpy arrays (a few calls whatever M),
# below with a plain loop (M small float expressions beat numpy's per-call overhead). Both
# compute the same IEEE expression per worker: bit-identical (tests/routing/test_lbgr_speed.py).
VECTOR_MIN_WORKERS = 28  # measured crossover (bench_routing, 4k prompts): loop faster at 24, numpy at 32


def _default_cache_factory(capacity_tokens: int, eviction_cfg: dict, seed: int):
    from repro.kvcache import make_cache  # lazy: only the approximate tracker needs it

    return make_cache(capacity_tokens, eviction_cfg, seed)


class LBGRRouter(Router):
    name = "lbgr"

    def __init__(
        self,
        name: str = "lbgr",
        tracker: str = "approximate",
        tracker_granularity: str = "node",
        tracker_update: str = "inflight",
        service_model: str = "kv_batch",
        decay: str = "exponential",
        decay_factor: float = 0.6,
        decay_interval_s: float = 0.1,
        drain_time_constant_s: float = 5.0,
        drain_min_rate: float = 1.0,
        learner: str = "rls",
        forgetting_factor: float = 0.99,
        rls_regularization: float = 500.0,
        rls_pooled: bool = True,
        rls_pool_regularization: float = 3.0,
        rls_init_var: float = 1.0,
        rls_max_trace: float = 1.0e4,
        sgd_learning_rate: float = 0.01,
        token_scale: float = 1024.0,
        load_scale_s: float = 1.0,
        min_load_weight: float | None = 0.25,
        output_len_prior: float = 1.0,
        oracle_output_len: bool = False,
        cache_factory: Callable | None = None,
    ) -> None:
        self.name = name
        self.tracker = check_choice("tracker", tracker, ("approximate", "exact"))
        self.tracker_granularity = check_choice("tracker_granularity", tracker_granularity, ("node", "token"))
        self.tracker_update = check_choice("tracker_update", tracker_update, ("inflight", "dispatch"))
        self.service_model = check_choice("service_model", service_model, ("kv_batch", "batch1"))
        self.decay = check_choice("decay", decay, ("exponential", "drain"))
        self.learner_kind = check_choice("learner", learner, ("rls", "sgd", "none"))
        if not 0.0 < decay_factor <= 1.0:
            raise ValueError(f"decay_factor must be in (0, 1], got {decay_factor}")
        for key, value in (
            ("decay_interval_s", decay_interval_s),
            ("drain_time_constant_s", drain_time_constant_s),
            ("token_scale", token_scale),
            ("load_scale_s", load_scale_s),
            ("rls_pool_regularization", rls_pool_regularization),
        ):
            if not value > 0:
                raise ValueError(f"{key} must be > 0, got {value}")
        if rls_regularization < 0:
            raise ValueError(f"rls_regularization must be >= 0, got {rls_regularization}")
        if min_load_weight is not None and not 0.0 <= min_load_weight <= 1.0:
            raise ValueError(f"min_load_weight must be in [0, 1] or null, got {min_load_weight}")
        if drain_min_rate < 0:
            raise ValueError(f"drain_min_rate must be >= 0, got {drain_min_rate}")
        if output_len_prior < 1:
            raise ValueError(f"output_len_prior must be >= 1 token, got {output_len_prior}")
        self.decay_factor = float(decay_factor)
        self.decay_interval_s = float(decay_interval_s)
        self.drain_time_constant_s = float(drain_time_constant_s)
        self.drain_min_rate = float(drain_min_rate)
        self.forgetting_factor = float(forgetting_factor)
        self.rls_regularization = float(rls_regularization)
        self.rls_pooled = bool(rls_pooled)
        self.rls_pool_regularization = float(rls_pool_regularization)
        self.rls_init_var = float(rls_init_var)
        self.rls_max_trace = float(rls_max_trace)
        self.sgd_learning_rate = float(sgd_learning_rate)
        self.token_scale = float(token_scale)
        self.load_scale_s = float(load_scale_s)
        self.min_load_weight = None if min_load_weight is None else float(min_load_weight)
        # Lowest theta3 used in a prediction: dE/dP = 1 + theta3 / load_scale_s >= min_load_weight.
        self._theta3_min = (
            -math.inf if min_load_weight is None else -(1.0 - self.min_load_weight) * self.load_scale_s
        )
        self.output_len_prior = float(output_len_prior)
        self.oracle_output_len = bool(oracle_output_len)
        self.cache_factory = cache_factory or _default_cache_factory
        # Fail on a bad learner setting now, not at the first reset.
        self._make_learner(1)

    # ------------------------------------------------------------------ lifecycle
    def _make_learner(self, num_workers: int):
        if self.learner_kind == "rls" and self.rls_regularization > 0:
            return RidgeRLSLearner(
                num_workers,
                NUM_FEATURES,
                self.forgetting_factor,
                self.rls_regularization,
                self.rls_pooled,
                self.rls_pool_regularization,
            )
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
        # request id -> (worker, phi, S + P, S, prompt key)
        self.pending: dict[int, tuple] = {}
        self.output_sum = 0.0
        self.output_count = 0
        self._last_tick: int | None = None
        self._last_now: float | None = None
        self.work_done = np.zeros(m)  # drain: exponentially weighted completed estimated work
        self.capacity = [max(1, int(w.kv_capacity_tokens)) for w in workers]
        # Cost models are read once here; workers with the same (cost model, capacity) form a
        # class that shares S for equal hits (one S per class for all the non-holders).
        self._cost_models = [w.cost_model for w in workers]
        classes: dict[tuple, list[int]] = {}
        for i, (cm, cap) in enumerate(zip(self._cost_models, self.capacity)):
            classes.setdefault((id(cm), cap), []).append(i)
        self._classes = [(self._cost_models[idx[0]], cap, idx) for (_, cap), idx in classes.items()]
        self._class_of = [0] * m
        for c, (_, _, idx) in enumerate(self._classes):
            for i in idx:
                self._class_of[i] = c
        self._vector = m >= VECTOR_MIN_WORKERS
        self._columns = None  # (learner, version, theta columns) of the numpy path
        self._zeros, self._ones = np.zeros(m), np.ones(m)
        # (class, hit, prompt length) -> prefill seconds; (class, -b, prompt length) -> decode step
        self._step_memo: dict[tuple, float] = {}
        self.caches = None
        self.tracker_state: ApproximateTracker | None = None
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
            self.tracker_state = ApproximateTracker(self.caches, self.tracker_update == "inflight")

    @property
    def index(self):
        """The shared prefix index of the approximate tracker (None with tracker "exact")."""
        return None if self.tracker_state is None else self.tracker_state.index

    # ------------------------------------------------------------------ routing
    def expected_output_len(self, request: "Request") -> float:
        if self.oracle_output_len:
            return float(request.output_len)
        if self.output_count == 0:
            return self.output_len_prior
        return self.output_sum / self.output_count

    def tracked_hits(self, key: bytes, workers: Sequence[WorkerView]) -> list[int]:
        """h_i for every worker: the tracker's cached prefix of `key` (see the module docstring)."""
        if self.tracker_state is None:
            return [w.peek_prefix(key) for w in workers]
        return self.tracker_state.index.hits(key)

    def decode_batch(self, worker: int, prompt_len: int, out_len: float) -> int:
        """b of service_model kv_batch: requests like this one that fit in the worker's KV (>= 1)."""
        if self.service_model == "batch1":
            return 1
        return max(1, int(self.capacity[worker] // (prompt_len + out_len)))

    def _decode_shares(self, prompt_len: int, out_len: float) -> list[float]:
        """Per worker class: the request's 1/b share of (o - 1) decode steps at batch b."""
        decode_steps = max(out_len - 1.0, 0.0)
        if not decode_steps > 0:
            return [0.0] * len(self._classes)
        batch1 = self.service_model == "batch1"
        per = prompt_len + out_len
        memo = self._step_memo
        out = []
        for c, (cm, cap, _) in enumerate(self._classes):
            b = 1 if batch1 else max(1, int(cap // per))  # decode_batch(), inlined
            dt = memo.get((c, -b, prompt_len))
            if dt is None:
                dt = self._memo_put((c, -b, prompt_len), cm.decode_time_s(b, b * prompt_len))
            out.append(decode_steps * dt / b)
        return out

    def _prefill(self, c: int, prompt_len: int, hit: int) -> float:
        """Prefill of the prompt's miss on top of `hit` cached tokens on class c (memoised)."""
        pf = self._step_memo.get((c, hit, prompt_len))
        if pf is None:
            pf = self._memo_put((c, hit, prompt_len), self._classes[c][0].prefill_time_s(prompt_len - hit, hit))
        return pf

    def _memo_put(self, key: tuple, value: float) -> float:
        memo = self._step_memo
        if len(memo) >= 1 << 16:  # bounded: prompt lengths and hits vary on long-context workloads
            memo.clear()
        memo[key] = value
        return value

    def _predict_loop(self, hits: list[int], prompt_len: int, out_len: float):
        """S and E per worker as Python lists: a plain loop (small M)."""
        shares = self._decode_shares(prompt_len, out_len)
        loads = self.load_est.tolist()
        ts, ls = self.token_scale, self.load_scale_s
        prefill = self._prefill
        if len(shares) == 1:  # one class: S depends on the hit only
            d = shares[0]
            by_hit: dict[int, float] = {}
            service = []
            for hit in hits:
                s = by_hit.get(hit)
                if s is None:
                    s = by_hit[hit] = prefill(0, prompt_len, hit) + d
                service.append(s)
        else:
            cls = self._class_of
            service = [prefill(cls[i], prompt_len, hit) + shares[cls[i]] for i, hit in enumerate(hits)]
        if self.learner is None:
            return service, [s + p for s, p in zip(service, loads)]
        t3_min = self._theta3_min
        predicted = []
        for hit, s, p, (t0, t1, t2, t3) in zip(hits, service, loads, self.learner.theta_rows):
            if t3 < t3_min:
                t3 = t3_min
            predicted.append(s + p + (t0 + t1 * (hit / ts) + t2 * ((prompt_len - hit) / ts) + t3 * (p / ls)))
        return service, predicted

    def _predict_vector(self, key: bytes, workers: Sequence[WorkerView], prompt_len: int, out_len: float):
        """(E, S, h) per worker as numpy arrays (large M): a fixed number of numpy calls plus one
        per holder level of the shared index; the same IEEE expression per worker as _predict_loop."""
        shares = self._decode_shares(prompt_len, out_len)
        prefill = self._prefill
        single = len(shares) == 1
        cls = self._class_of
        if self.tracker_state is not None:
            index = self.tracker_state.index
            h = self._zeros.copy()
            if single:
                s_arr = self._ones * (prefill(0, prompt_len, 0) + shares[0])
            else:
                s_arr = np.array([prefill(c, prompt_len, 0) + shares[c] for c in cls])
            for t, mask in index.levels(key):
                idx = index.holders(mask)
                h[idx] = t
                if single:
                    s_arr[idx] = prefill(0, prompt_len, t) + shares[0]
                else:
                    s_arr[idx] = [prefill(cls[i], prompt_len, t) + shares[cls[i]] for i in idx.tolist()]
        else:
            hits = [w.peek_prefix(key) for w in workers]
            h = np.array(hits, dtype=float)
            s_arr = np.array([prefill(cls[i], prompt_len, x) + shares[cls[i]] for i, x in enumerate(hits)])
        load = self.load_est
        e = s_arr + load
        if self.learner is not None:
            t0, t1, t2, t3 = self._theta_columns()
            ts, ls = self.token_scale, self.load_scale_s
            r = t0 + t1 * (h / ts)
            r += t2 * ((prompt_len - h) / ts)
            r += t3 * (load if ls == 1.0 else load / ls)  # p / 1.0 == p exactly
            e += r
        return e, s_arr, h

    def _theta_columns(self):
        """theta's columns as contiguous arrays, theta3 floored (cached per learner version)."""
        learner = self.learner
        version = getattr(learner, "version", None)
        cached = self._columns
        if version is not None and cached is not None and cached[0] is learner and cached[1] == version:
            return cached[2]
        theta = learner.theta
        cols = (
            np.ascontiguousarray(theta[:, 0]),
            np.ascontiguousarray(theta[:, 1]),
            np.ascontiguousarray(theta[:, 2]),
            np.maximum(theta[:, 3], self._theta3_min),
        )
        self._columns = (learner, version, cols)
        return cols

    def _evaluate(self, request: "Request", workers: Sequence[WorkerView], now_s: float):
        """Decay, then (key, hits, S, E) per worker as Python lists (either evaluation path)."""
        self._advance(now_s)
        key = as_key(request.prompt_tokens)
        prompt_len = len(key) >> 2
        out_len = self.expected_output_len(request)
        if not self._vector:
            hits = self.tracked_hits(key, workers)
            service, predicted = self._predict_loop(hits, prompt_len, out_len)
            return key, hits, service, predicted
        e, s_arr, h = self._predict_vector(key, workers, prompt_len, out_len)
        return key, [int(x) for x in h.tolist()], s_arr.tolist(), e.tolist()

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
        self._advance(now_s)
        key = as_key(request.prompt_tokens)
        prompt_len = len(key) >> 2
        out_len = self.expected_output_len(request)
        load = self.load_est
        if self._vector:
            e, s_arr, h = self._predict_vector(key, workers, prompt_len, out_len)
            worker = int(e.argmin())
            tied = e == e[worker]
            if np.count_nonzero(tied) > 1:  # ties -> lower load, then lower id
                worker = min(np.flatnonzero(tied).tolist(), key=lambda i: (load[i], i))
            s, p, hit = float(s_arr[worker]), float(load[worker]), int(h[worker])
        else:
            hits = self.tracked_hits(key, workers)
            service, predicted = self._predict_loop(hits, prompt_len, out_len)
            loads = load.tolist()
            worker = 0
            for i in range(1, len(predicted)):  # argmin; ties -> lower load, then lower id
                if predicted[i] < predicted[worker] or (
                    predicted[i] == predicted[worker] and loads[i] < loads[worker]
                ):
                    worker = i
            s, p, hit = service[worker], loads[worker], hits[worker]
        ts = self.token_scale
        phi = (1.0, hit / ts, (prompt_len - hit) / ts, p / self.load_scale_s)
        if self.tracker_state is not None:
            self.tracker_state.dispatched(key, worker)
        self.pending[request.id] = (worker, phi, s + p, s, key)
        load[worker] = p + s
        return worker

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        record = self.pending.get(request.id)
        if record is None:
            return
        worker, phi, base, service, key = record
        if worker != worker_id:
            raise ValueError(
                f"request {request.id} was dispatched to worker {worker} but completed on {worker_id}"
            )
        del self.pending[request.id]
        if now_s is not None:
            self._advance(now_s)
        self.output_sum += float(request.output_len)
        self.output_count += 1
        if self.learner is not None:
            self.learner.update(worker, phi, float(latency_s) - base)
        if self.decay == "drain":
            self.work_done[worker] += service
        if self.tracker_state is not None:
            self.tracker_state.completed(key, key + as_key(request.generated_tokens), worker)

    def on_request_abandoned(self, request, worker_id, now_s=None):
        """Forget a request that will not complete on its worker: its in-flight prompt leaves
        the tracker, nothing is learned, its cache tree is not touched (it produced no reply)."""
        record = self.pending.pop(request.id, None)
        if record is None:
            return
        if self.tracker_state is not None:
            self.tracker_state.abandoned(record[4], record[0])

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
