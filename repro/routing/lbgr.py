"""LBGR, Learning-Based Greedy Routing (paper §4.2, Algorithm 2): a reconstruction.

Per arrival, every worker i gets E_i = S_i + P_i + r_i (service estimate + decayed queue load +
learned residual) and the request goes to argmin E (ties: lower P, then lower id). The full
description, every open choice (each a key of conf/router/lbgr.yaml) and why each default was
chosen: docs/ALGORITHMS.md §3 "LBGR" (numbers: REPRODUCE.md "LBGR reconstruction").

Pieces: trackers.py (h, the tracked cached prefix), service_time.py (S), load_decay.py (P's
decay), learners.py (r). This module holds the decision and the bookkeeping around it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from repro.kvcache import as_key, make_cache
from repro.routing.base import Router, WorkerView, check_choice, request_key
from repro.routing.learners import LEARNERS, make_learner
from repro.routing.load_decay import DECAYS, DrainDecay, ExponentialDecay
from repro.routing.service_time import SERVICE_MODELS, ServiceTime
from repro.routing.trackers import ApproximateTracker

__all__ = ["LBGRRouter"]

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

NUM_FEATURES = 4
# From this many workers on, a decision evaluates E with numpy arrays (a few calls whatever M),
# below with a plain loop (M small float expressions beat numpy's per-call overhead). Both
# compute the same IEEE expression per worker: bit-identical (tests/routing/test_lbgr_speed.py).
VECTOR_MIN_WORKERS = 28  # measured crossover (bench_routing, 4k prompts): loop faster at 24, numpy at 32


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
        self.service_model = check_choice("service_model", service_model, SERVICE_MODELS)
        self.decay = check_choice("decay", decay, DECAYS)
        self.learner_kind = check_choice("learner", learner, LEARNERS)
        # Both variants are built (and so checked) whatever `decay` says: a bad key fails now.
        decays = {
            "exponential": ExponentialDecay(decay_factor, decay_interval_s),
            "drain": DrainDecay(drain_time_constant_s, drain_min_rate),
        }
        self._decay = decays[self.decay]
        for key, value in (
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
        if output_len_prior < 1:
            raise ValueError(f"output_len_prior must be >= 1 token, got {output_len_prior}")
        self.decay_factor = float(decay_factor)
        self.decay_interval_s = float(decay_interval_s)
        self.drain_time_constant_s = float(drain_time_constant_s)
        self.drain_min_rate = float(drain_min_rate)
        self.learner_keys = {  # make_learner's keyword arguments
            "forgetting_factor": float(forgetting_factor),
            "rls_regularization": float(rls_regularization),
            "rls_pooled": bool(rls_pooled),
            "rls_pool_regularization": float(rls_pool_regularization),
            "rls_init_var": float(rls_init_var),
            "rls_max_trace": float(rls_max_trace),
            "sgd_learning_rate": float(sgd_learning_rate),
        }
        self.token_scale = float(token_scale)
        self.load_scale_s = float(load_scale_s)
        self.min_load_weight = None if min_load_weight is None else float(min_load_weight)
        # Lowest theta3 used in a prediction: dE/dP = 1 + theta3 / load_scale_s >= min_load_weight.
        self._theta3_min = -math.inf if min_load_weight is None else -(1.0 - self.min_load_weight) * self.load_scale_s
        self.output_len_prior = float(output_len_prior)
        self.oracle_output_len = bool(oracle_output_len)
        self.cache_factory = cache_factory or make_cache  # (capacity, eviction_cfg, seed)
        # Fail on a bad learner setting now, not at the first reset.
        self._make_learner(1)

    # ------------------------------------------------------------------ lifecycle
    def _make_learner(self, num_workers: int):
        return make_learner(self.learner_kind, num_workers, NUM_FEATURES, **self.learner_keys)

    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)
        m = self.num_workers
        self.load_est = np.zeros(m)  # P_i, seconds
        self.learner = self._make_learner(m)
        # request id -> (worker, phi, S + P, S, prompt key)
        self.pending: dict[int, tuple] = {}
        self.output_sum = 0.0
        self.output_count = 0
        self._decay.reset(m)
        self.service = ServiceTime(workers, self.service_model)  # S, per class of alike workers
        self._vector = m >= VECTOR_MIN_WORKERS
        self._columns = None  # (learner, version, theta columns) of the numpy path
        self._zeros, self._ones = np.zeros(m), np.ones(m)
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
        """h_i for every worker: the tracker's cached prefix of `key` (docs/ALGORITHMS.md §3)."""
        if self.tracker_state is None:
            return [w.peek_prefix(key) for w in workers]
        return self.tracker_state.index.hits(key)

    def decode_batch(self, worker: int, prompt_len: int, out_len: float) -> int:
        """b of service_model kv_batch: requests like this one that fit in the worker's KV (>= 1)."""
        return self.service.decode_batch(worker, prompt_len, out_len)

    def _predict_loop(self, hits: list[int], prompt_len: int, out_len: float, loads: list[float]):
        """S and E per worker as Python lists: a plain loop (small M). S, hit / ts and miss / ts
        are computed once per distinct hit (workers mostly share a few hits)."""
        svc = self.service
        shares = svc.decode_shares(prompt_len, out_len)
        ts, ls = self.token_scale, self.load_scale_s
        prefill = svc.prefill
        terms: dict[int, tuple] = {}
        per_worker = []
        if len(shares) == 1:  # one class: S depends on the hit only
            d = shares[0]
            for hit in hits:
                t = terms.get(hit)
                if t is None:
                    t = terms[hit] = (prefill(0, prompt_len, hit) + d, hit / ts, (prompt_len - hit) / ts)
                per_worker.append(t)
        else:
            cls = svc.class_of
            for i, hit in enumerate(hits):
                c = cls[i]
                t = terms.get((c, hit))
                if t is None:
                    t = terms[(c, hit)] = (prefill(c, prompt_len, hit) + shares[c], hit / ts, (prompt_len - hit) / ts)
                per_worker.append(t)
        service = [t[0] for t in per_worker]
        if self.learner is None:
            return service, [s + p for s, p in zip(service, loads)]
        t3_min = self._theta3_min
        predicted = []
        if ls == 1.0:  # p / 1.0 == p exactly
            for (s, h, u), p, (t0, t1, t2, t3) in zip(per_worker, loads, self.learner.theta_rows):
                if t3 < t3_min:
                    t3 = t3_min
                predicted.append(s + p + (t0 + t1 * h + t2 * u + t3 * p))
        else:
            for (s, h, u), p, (t0, t1, t2, t3) in zip(per_worker, loads, self.learner.theta_rows):
                if t3 < t3_min:
                    t3 = t3_min
                predicted.append(s + p + (t0 + t1 * h + t2 * u + t3 * (p / ls)))
        return service, predicted

    def _predict_vector(self, key: bytes, workers: Sequence[WorkerView], prompt_len: int, out_len: float):
        """(E, S, h) per worker as numpy arrays (large M): a fixed number of numpy calls plus one
        per holder level of the shared index; the same IEEE expression per worker as _predict_loop."""
        svc = self.service
        shares = svc.decode_shares(prompt_len, out_len)
        prefill = svc.prefill
        single = len(shares) == 1
        cls = svc.class_of
        if self.tracker_state is not None:
            index = self.tracker_state.index
            ts = self.token_scale
            h = self._zeros.copy()
            us = np.empty(len(cls))  # (L - h) / ts, per level as a Python float (the same division)
            us.fill(prompt_len / ts)
            if single:
                s_arr = self._ones * (prefill(0, prompt_len, 0) + shares[0])
            else:
                s_arr = np.array([prefill(c, prompt_len, 0) + shares[c] for c in cls])
            for t, mask in index.levels(key):
                idx = index.holders(mask)
                h[idx] = t
                us[idx] = (prompt_len - t) / ts
                if single:
                    s_arr[idx] = prefill(0, prompt_len, t) + shares[0]
                else:
                    s_arr[idx] = [prefill(cls[i], prompt_len, t) + shares[cls[i]] for i in idx.tolist()]
        else:
            hits = [w.peek_prefix(key) for w in workers]
            h = np.array(hits, dtype=float)
            us = None
            s_arr = np.array([prefill(cls[i], prompt_len, x) + shares[cls[i]] for i, x in enumerate(hits)])
        load = self.load_est
        e = s_arr + load
        if self.learner is not None:
            t0, t1, t2, t3 = self._theta_columns()
            ts, ls = self.token_scale, self.load_scale_s
            r = t0 + t1 * (h / ts)
            r += t2 * (((prompt_len - h) / ts) if us is None else us)
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
        self._decay.advance(self.load_est, now_s)
        key = request_key(request)
        prompt_len = len(key) >> 2
        out_len = self.expected_output_len(request)
        if not self._vector:
            hits = self.tracked_hits(key, workers)
            service, predicted = self._predict_loop(hits, prompt_len, out_len, self.load_est.tolist())
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
        self._decay.advance(self.load_est, now_s)
        key = request_key(request)
        prompt_len = len(key) >> 2
        out_len = self.expected_output_len(request)
        load = self.load_est
        if self._vector:
            e, s_arr, h = self._predict_vector(key, workers, prompt_len, out_len)
            worker = int(e.argmin())
            best = e[worker]
            e[worker] = math.inf  # a tie: another worker at the minimum (rare)
            if e[int(e.argmin())] == best:  # ties -> lower load, then lower id
                e[worker] = best
                worker = min(np.flatnonzero(e == best).tolist(), key=lambda i: (load[i], i))
            s, p, hit = float(s_arr[worker]), float(load[worker]), int(h[worker])
        else:
            hits = self.tracked_hits(key, workers)
            loads = load.tolist()
            service, predicted = self._predict_loop(hits, prompt_len, out_len, loads)
            worker = 0
            for i in range(1, len(predicted)):  # argmin; ties -> lower load, then lower id
                if predicted[i] < predicted[worker] or (predicted[i] == predicted[worker] and loads[i] < loads[worker]):
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
            raise ValueError(f"request {request.id} was dispatched to worker {worker} but completed on {worker_id}")
        del self.pending[request.id]
        if now_s is not None:
            self._decay.advance(self.load_est, now_s)
        self.output_sum += float(request.output_len)
        self.output_count += 1
        if self.learner is not None:
            self.learner.update(worker, phi, float(latency_s) - base)
        self._decay.completed(worker, service)
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
