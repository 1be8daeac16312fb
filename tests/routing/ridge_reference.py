"""LBGR's ridge learner as it computed before issue 20 (the reference of the plain-float solve).

np.linalg.inv of (D_i + delta I) and of the pool's matrix after every sample, theta = K_i c_i +
delta K_i prior. This is what RidgeRLSLearner computed, bit for bit, until its solve became
plain-Python Cholesky (tested then: tests/routing/test_lbgr_speed.py, git history). Used by the
tolerance test and by tests/benchmarks/bench_learner_flips.py (decision flips on the paper's cells).
"""

from __future__ import annotations

import numpy as np


class InverseEveryUpdate:
    """The pre-issue-20 learner: a numpy inverse of the updated worker's and the pool's matrix per sample."""

    def __init__(self, m, d, lam, delta, pooled, pool_delta):
        self.lam, self.delta, self.pooled, self.pool_delta = lam, delta, pooled, pool_delta
        self.pool_lam = lam ** (1.0 / m)
        self.D, self.c = np.zeros((m, d, d)), np.zeros((m, d))
        self.pool_D, self.pool_c = np.zeros((d, d)), np.zeros(d)
        self.K = np.tile(np.eye(d) / delta, (m, 1, 1))
        self.Kc, self.theta = np.zeros((m, d)), np.zeros((m, d))
        self.eye, self.pool_eye = np.eye(d) * delta, np.eye(d) * pool_delta
        self.version = 0

    @property
    def theta_rows(self):
        return self.theta.tolist()

    def update(self, w, phi, y):
        phi = np.asarray(phi, dtype=float)
        outer = np.outer(phi, phi)
        self.D[w] *= self.lam
        self.D[w] += outer
        self.c[w] *= self.lam
        self.c[w] += y * phi
        if self.pooled:
            self.pool_D *= self.pool_lam
            self.pool_D += outer
            self.pool_c *= self.pool_lam
            self.pool_c += y * phi
            K, pool_K = np.linalg.inv(np.stack([self.D[w] + self.eye, self.pool_D + self.pool_eye]))
            self.K[w] = K
            self.Kc[w] = K @ self.c[w]
            self.theta = self.Kc + self.delta * (self.K @ (pool_K @ self.pool_c))
        else:
            K = np.linalg.inv(self.D[w] + self.eye)
            self.K[w] = K
            self.Kc[w] = K @ self.c[w]
            self.theta[w] = self.Kc[w]
        self.version += 1
