"""Online linear regressors for LBGR's per-worker residual model r_i = theta_i . phi.

All workers' parameters live in one (M, d) array (`theta`), mirrored as Python lists
(`theta_rows`, refreshed on every update) for the per-decision loop, where M small dot
products in plain Python beat numpy's per-call overhead.
"""

from __future__ import annotations

import numpy as np


class RLSLearner:
    """Recursive least squares with exponential forgetting, one model per worker.

    Minimises sum_k lambda^(n-k) (y_k - theta . phi_k)^2 (+ a vanishing prior theta = 0 with
    covariance init_var * I). Update for one sample (phi, y):
        k = P phi / (lambda + phi' P phi);  theta += k (y - theta . phi);  P = (P - k phi' P) / lambda.
    Choice not in the paper: with forgetting, P grows without bound along directions the
    features never excite (e.g. hit + miss = prompt length is nearly constant), so the
    division by lambda is skipped while trace(P) would exceed max_trace (bounded-trace RLS).
    """

    def __init__(
        self,
        num_workers: int,
        dim: int,
        forgetting_factor: float = 0.99,
        init_var: float = 1.0,
        max_trace: float = 1.0e4,
    ) -> None:
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor}")
        if init_var <= 0 or max_trace <= 0:
            raise ValueError("init_var and max_trace must be > 0")
        self.lam = float(forgetting_factor)
        self.max_trace = float(max_trace)
        self.theta = np.zeros((num_workers, dim))
        self.theta_rows = self.theta.tolist()  # Python copy for the routing hot path
        self.P = np.tile(np.eye(dim) * float(init_var), (num_workers, 1, 1))

    def predict(self, phi: np.ndarray) -> np.ndarray:
        """phi: (M, d), one feature row per worker -> (M,) residuals."""
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi: np.ndarray, y: float) -> None:
        P = self.P[worker]
        theta = self.theta[worker]
        p_phi = P @ phi
        gain = p_phi / (self.lam + phi @ p_phi)
        theta += gain * (y - theta @ phi)
        self.theta_rows[worker] = theta.tolist()
        P_new = P - np.outer(gain, p_phi)
        P_new = 0.5 * (P_new + P_new.T)  # keep it symmetric against rounding drift
        if np.trace(P_new) / self.lam <= self.max_trace:
            P_new /= self.lam
        self.P[worker] = P_new


class SGDLearner:
    """Plain stochastic gradient descent on the squared error: theta += lr * (y - theta . phi) * phi."""

    def __init__(self, num_workers: int, dim: int, learning_rate: float = 0.01) -> None:
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        self.lr = float(learning_rate)
        self.theta = np.zeros((num_workers, dim))
        self.theta_rows = self.theta.tolist()  # Python copy for the routing hot path

    def predict(self, phi: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi: np.ndarray, y: float) -> None:
        theta = self.theta[worker]
        theta += self.lr * (y - theta @ phi) * phi
        self.theta_rows[worker] = theta.tolist()
