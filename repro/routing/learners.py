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


class RidgeRLSLearner:
    """Exponentially weighted ridge regression per worker, recursive (information form).

    Worker i minimises  sum_k lambda^(n_i-k) (y_k - theta_i . phi_k)^2 + delta |theta_i - prior|^2
    over its own samples: the least-squares target of RLS with forgetting, plus a prior worth
    `delta` samples that, unlike RLS's initial covariance, never fades. The prior is 0
    (`pooled=False`), or (`pooled=True`) the same regression fitted on the samples of ALL
    workers (prior 0 worth `pool_delta` samples, forgetting lambda^(1/M) per sample so that its
    memory spans about as much time as one worker's): each worker's model is then the
    cluster-wide model plus a deviation its own samples must earn -- on identical workers a
    worker's model cannot drift on a few unlucky samples, while a genuinely different worker
    still gets its own coefficients given enough samples.

    Choices not in the paper. Kept as D_i = sum lambda^.. phi phi', c_i = sum lambda^.. y phi;
    theta_i = K_i (c_i + delta prior), K_i = (D_i + delta I)^-1 (inverted for the updated worker
    only; the moving prior updates every theta_i through one batched mat-vec). Runs on
    completions, off the routing path.
    """

    def __init__(
        self,
        num_workers: int,
        dim: int,
        forgetting_factor: float = 0.99,
        regularization: float = 500.0,
        pooled: bool = True,
        pool_regularization: float = 3.0,
    ) -> None:
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor}")
        if not regularization > 0 or not pool_regularization > 0:
            raise ValueError(
                f"regularization and pool_regularization must be > 0, got {regularization}, {pool_regularization}"
            )
        self.lam = float(forgetting_factor)
        self.delta = float(regularization)
        self.pooled = bool(pooled)
        self.pool_delta = float(pool_regularization)
        self.pool_lam = self.lam ** (1.0 / num_workers)
        self.D = np.zeros((num_workers, dim, dim))
        self.c = np.zeros((num_workers, dim))
        self.pool_D = np.zeros((dim, dim))
        self.pool_c = np.zeros(dim)
        self._delta_eye = np.eye(dim) * self.delta
        self._pool_delta_eye = np.eye(dim) * self.pool_delta
        self._stack = np.zeros((2, dim, dim))  # both systems, inverted in one call
        self.prior = np.zeros(dim)
        self.K = np.tile(np.eye(dim) / self.delta, (num_workers, 1, 1))  # (D_i + delta I)^-1
        self.Kc = np.zeros((num_workers, dim))  # K_i c_i
        self.theta = np.zeros((num_workers, dim))
        self.theta_rows = self.theta.tolist()  # Python copy for the routing hot path

    def predict(self, phi: np.ndarray) -> np.ndarray:
        """phi: (M, d), one feature row per worker -> (M,) residuals."""
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi: np.ndarray, y: float) -> None:
        outer = np.outer(phi, phi)
        D = self.D[worker]
        D *= self.lam
        D += outer
        c = self.c[worker]
        c *= self.lam
        c += y * phi
        # theta_i = K_i (c_i + delta prior), K_i = (D_i + delta I)^-1: only worker i's K changes
        # here; the prior moves every worker's theta through one batched mat-vec.
        if self.pooled:
            pD = self.pool_D
            pD *= self.pool_lam
            pD += outer
            pc = self.pool_c
            pc *= self.pool_lam
            pc += y * phi
            stack = self._stack
            np.add(D, self._delta_eye, out=stack[0])
            np.add(pD, self._pool_delta_eye, out=stack[1])
            K, pool_K = np.linalg.inv(stack)
            self.K[worker] = K
            self.Kc[worker] = K @ c
            self.prior = pool_K @ pc
            self.theta = self.Kc + self.delta * (self.K @ self.prior)
            self.theta_rows = self.theta.tolist()
        else:
            K = np.linalg.inv(D + self._delta_eye)
            self.K[worker] = K
            self.Kc[worker] = K @ c
            self.theta[worker] = self.Kc[worker]
            self.theta_rows[worker] = self.theta[worker].tolist()


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
