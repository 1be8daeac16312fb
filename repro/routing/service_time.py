"""LBGR's service-time estimate S_ij (service_model; docs/ALGORITHMS.md §3, "LBGR").

S = prefill of the prompt's miss on top of the tracked hit (the request alone) + its share of
(o - 1) decode steps, from the worker's step-cost model. Workers with the same (cost model,
capacity) form a class that shares S for equal hits, and step times are memoised per
(class, hit, prompt length) / (class, -batch, prompt length): S is a few dict lookups per
decision.
"""

from __future__ import annotations

from typing import Sequence

from repro.routing.base import WorkerView, check_choice

SERVICE_MODELS = ("kv_batch", "batch1")
_MEMO_MAX = 1 << 16  # bounded: prompt lengths and hits vary on long-context workloads


class ServiceTime:
    """S per worker class for one run (built at the router's reset)."""

    def __init__(self, workers: Sequence[WorkerView], service_model: str) -> None:
        self.service_model = check_choice("service_model", service_model, SERVICE_MODELS)
        self.capacity = [max(1, int(w.kv_capacity_tokens)) for w in workers]
        cost_models = [w.cost_model for w in workers]  # read once: fixed for the run
        classes: dict[tuple, list[int]] = {}
        for i, (cm, cap) in enumerate(zip(cost_models, self.capacity)):
            classes.setdefault((id(cm), cap), []).append(i)
        # (cost model, capacity, worker ids) per class; class_of[i] = worker i's class
        self.classes = [(cost_models[idx[0]], cap, idx) for (_, cap), idx in classes.items()]
        self.class_of = [0] * len(workers)
        for c, (_, _, idx) in enumerate(self.classes):
            for i in idx:
                self.class_of[i] = c
        self._memo: dict[tuple, float] = {}
        self._shares: dict[tuple, list[float]] = {}

    def decode_batch(self, worker: int, prompt_len: int, out_len: float) -> int:
        """b of service_model kv_batch: requests like this one that fit in the worker's KV (>= 1)."""
        if self.service_model == "batch1":
            return 1
        return max(1, int(self.capacity[worker] // (prompt_len + out_len)))

    def decode_shares(self, prompt_len: int, out_len: float) -> list[float]:
        """Per worker class: the request's 1/b share of (o - 1) decode steps at batch b (memoised
        per (prompt length, o): the returned list is shared, never modify it)."""
        shares = self._shares.get((prompt_len, out_len))
        if shares is None:
            if len(self._shares) >= _MEMO_MAX:
                self._shares.clear()
            shares = self._shares[(prompt_len, out_len)] = self._decode_shares(prompt_len, out_len)
        return shares

    def _decode_shares(self, prompt_len: int, out_len: float) -> list[float]:
        decode_steps = max(out_len - 1.0, 0.0)
        if not decode_steps > 0:
            return [0.0] * len(self.classes)
        batch1 = self.service_model == "batch1"
        per = prompt_len + out_len
        memo = self._memo
        out = []
        for c, (cm, cap, _) in enumerate(self.classes):
            b = 1 if batch1 else max(1, int(cap // per))  # decode_batch(), inlined
            dt = memo.get((c, -b, prompt_len))
            if dt is None:
                dt = self._put((c, -b, prompt_len), cm.decode_time_s(b, b * prompt_len))
            out.append(decode_steps * dt / b)
        return out

    def prefill(self, c: int, prompt_len: int, hit: int) -> float:
        """Prefill of the prompt's miss on top of `hit` cached tokens on class c (memoised)."""
        pf = self._memo.get((c, hit, prompt_len))
        if pf is None:
            pf = self._put((c, hit, prompt_len), self.classes[c][0].prefill_time_s(prompt_len - hit, hit))
        return pf

    def _put(self, key: tuple, value: float) -> float:
        memo = self._memo
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = value
        return value
