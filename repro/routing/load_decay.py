"""LBGR's queue-load decay: how P_i shrinks between dispatches (decay; docs/ALGORITHMS.md §3).

Both variants update the router's load array in place, lazily at each call with the driver's
clock `now_s` (an idle stretch decays exactly as if a timer had fired), and keep P_i >= 0.
"""

from __future__ import annotations

import math

import numpy as np

DECAYS = ("exponential", "drain")
_TICK_EPS = 1e-9  # absorbs float error in now_s / interval (e.g. 0.3 / 0.1)


class ExponentialDecay:
    """P_i *= factor once per elapsed interval_s, intervals counted on the grid k * interval_s."""

    def __init__(self, factor: float, interval_s: float) -> None:
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"decay_factor must be in (0, 1], got {factor}")
        if not interval_s > 0:
            raise ValueError(f"decay_interval_s must be > 0, got {interval_s}")
        self.factor = float(factor)
        self.interval_s = float(interval_s)
        self._last_tick: int | None = None

    def reset(self, num_workers: int) -> None:
        self._last_tick = None

    def advance(self, load: np.ndarray, now_s: float) -> None:
        tick = math.floor(float(now_s) / self.interval_s + _TICK_EPS)
        if self._last_tick is None:
            self._last_tick = tick
        elif tick > self._last_tick:
            load *= self.factor ** (tick - self._last_tick)
            self._last_tick = tick

    def completed(self, worker: int, service_s: float) -> None:
        pass


class DrainDecay:
    """P_i -= elapsed time x the worker's service rate: the estimated work (sum of S) completed in
    an exponentially weighted window of time_constant_s, per second, at least min_rate."""

    def __init__(self, time_constant_s: float, min_rate: float) -> None:
        if not time_constant_s > 0:
            raise ValueError(f"drain_time_constant_s must be > 0, got {time_constant_s}")
        if min_rate < 0:
            raise ValueError(f"drain_min_rate must be >= 0, got {min_rate}")
        self.time_constant_s = float(time_constant_s)
        self.min_rate = float(min_rate)
        self._last_now: float | None = None
        self.work_done = np.zeros(0)

    def reset(self, num_workers: int) -> None:
        self._last_now = None
        self.work_done = np.zeros(num_workers)  # exponentially weighted completed estimated work

    def advance(self, load: np.ndarray, now_s: float) -> None:
        now_s = float(now_s)
        if self._last_now is None:
            self._last_now = now_s
            return
        dt = now_s - self._last_now
        if dt <= 0:
            return
        tau = self.time_constant_s
        rate = np.maximum(self.work_done / tau, self.min_rate)
        np.maximum(load - dt * rate, 0.0, out=load)
        self.work_done *= math.exp(-dt / tau)
        self._last_now = now_s

    def completed(self, worker: int, service_s: float) -> None:
        self.work_done[worker] += service_s
