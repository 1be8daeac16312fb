"""Online linear regressors for LBGR's per-worker residual model r_i = theta_i . phi.

All workers' parameters live in one (M, d) array (`theta`), mirrored as Python lists
(`theta_rows`) for the per-decision loop, where M small dot products in plain Python beat
numpy's per-call overhead at small M.
"""

from __future__ import annotations

import math

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
        self.version = 0  # bumped whenever theta changes
        self.P = np.tile(np.eye(dim) * float(init_var), (num_workers, 1, 1))

    def predict(self, phi: np.ndarray) -> np.ndarray:
        """phi: (M, d), one feature row per worker -> (M,) residuals."""
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi, y: float) -> None:
        phi = np.asarray(phi, dtype=float)
        P = self.P[worker]
        theta = self.theta[worker]
        p_phi = P @ phi
        gain = p_phi / (self.lam + phi @ p_phi)
        theta += gain * (y - theta @ phi)
        self.theta_rows[worker] = theta.tolist()
        self.version += 1
        P_new = P - np.outer(gain, p_phi)
        P_new = 0.5 * (P_new + P_new.T)  # keep it symmetric against rounding drift
        if np.trace(P_new) / self.lam <= self.max_trace:
            P_new /= self.lam
        self.P[worker] = P_new


# 4 x 4 symmetric matrices as 10-tuples, the upper triangle row by row:
# (a00, a01, a02, a03, a11, a12, a13, a22, a23, a33).
_EYE10 = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0)
# From this many workers on, theta's rows K_i (c_i + delta prior) are one numpy call instead of a
# Python loop (measured, plain loop vs numpy per update: equal at 16 workers, numpy 20 % faster at 24).
NUMPY_MIN_WORKERS = 20


def _chol4(a, shift: float):
    """Cholesky factor of the SPD 4 x 4 matrix a + shift I (a a 10-tuple): (l10, l20, l21, l30,
    l31, l32, i0, i1, i2, i3), the strict lower part of L and the reciprocals of its diagonal."""
    sqrt = math.sqrt
    a00, a01, a02, a03, a11, a12, a13, a22, a23, a33 = a
    i0 = 1.0 / sqrt(a00 + shift)
    l10, l20, l30 = a01 * i0, a02 * i0, a03 * i0
    i1 = 1.0 / sqrt(a11 + shift - l10 * l10)
    l21 = (a12 - l20 * l10) * i1
    l31 = (a13 - l30 * l10) * i1
    i2 = 1.0 / sqrt(a22 + shift - l20 * l20 - l21 * l21)
    l32 = (a23 - l30 * l20 - l31 * l21) * i2
    i3 = 1.0 / sqrt(a33 + shift - l30 * l30 - l31 * l31 - l32 * l32)
    return l10, l20, l21, l30, l31, l32, i0, i1, i2, i3


def _inv4(a, shift: float):
    """(a + shift I)^-1 as a 10-tuple, a SPD (Cholesky: K = L^-T L^-1)."""
    l10, l20, l21, l30, l31, l32, i0, i1, i2, i3 = _chol4(a, shift)
    # m = L^-1 (lower triangular, diagonal i0..i3)
    m10 = -l10 * i0 * i1
    m21 = -l21 * i1 * i2
    m20 = -(l20 * i0 + l21 * m10) * i2
    m32 = -l32 * i2 * i3
    m31 = -(l31 * i1 + l32 * m21) * i3
    m30 = -(l30 * i0 + l31 * m10 + l32 * m20) * i3
    return (
        i0 * i0 + m10 * m10 + m20 * m20 + m30 * m30,
        m10 * i1 + m20 * m21 + m30 * m31,
        m20 * i2 + m30 * m32,
        m30 * i3,
        i1 * i1 + m21 * m21 + m31 * m31,
        m21 * i2 + m31 * m32,
        m31 * i3,
        i2 * i2 + m32 * m32,
        m32 * i3,
        i3 * i3,
    )


def _solve4(a, shift: float, b):
    """x with (a + shift I) x = b (a SPD 10-tuple, b a 4-sequence), by Cholesky."""
    l10, l20, l21, l30, l31, l32, i0, i1, i2, i3 = _chol4(a, shift)
    b0, b1, b2, b3 = b
    z0 = b0 * i0
    z1 = (b1 - l10 * z0) * i1
    z2 = (b2 - l20 * z0 - l21 * z1) * i2
    z3 = ((b3 - l30 * z0 - l31 * z1 - l32 * z2) * i3) * i3
    z2 = (z2 - l32 * z3) * i2
    z1 = (z1 - l21 * z2 - l31 * z3) * i1
    return ((z0 - l10 * z1 - l20 * z2 - l30 * z3) * i0, z1, z2, z3)


def _full4(k) -> list[list[float]]:
    """A 10-tuple as the full 4 x 4 matrix (nested lists)."""
    k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = k
    return [[k00, k01, k02, k03], [k01, k11, k12, k13], [k02, k12, k22, k23], [k03, k13, k23, k33]]


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
    theta_i = K_i (c_i + delta prior), K_i = (D_i + delta I)^-1, prior = (D + pool_delta I)^-1 c
    over the pooled D, c.

    Cost (docs/ALGORITHMS.md "LBGR cost"): LBGR has d = 4 features, so everything is plain
    Python floats on 4 x 4 symmetric matrices (10-tuples): per sample the rank-one update of
    D_i, c_i (and the pool's), K_i by a Cholesky factorisation, the prior by a Cholesky solve,
    then theta's rows K_j (c_j + delta prior) for every worker j (the prior moved; one numpy
    call from NUMPY_MIN_WORKERS workers on). Not the same rounding as the numpy inverse it
    replaced (LAPACK getrf / getri): theta agrees with it to ~1e-13 relative; the accepted
    tolerance and the decision flips measured on the paper's cells (none): tests/routing/
    test_lbgr_speed.py, tests/benchmarks/bench_learner_flips.py. With `lazy=True` the solve waits until
    theta is next read (one solve for all the samples since). Why not Sherman-Morrison on K_i:
    the prior term delta I does not fade while D_i does, so D_i + delta I changes by
    phi phi' + (lambda - 1) D_i per sample, not by a rank-one term.
    """

    def __init__(
        self,
        num_workers: int,
        dim: int,
        forgetting_factor: float = 0.99,
        regularization: float = 500.0,
        pooled: bool = True,
        pool_regularization: float = 3.0,
        lazy: bool = False,
    ) -> None:
        if dim != 4:
            raise ValueError(f"RidgeRLSLearner is written for LBGR's 4 features, got dim={dim}")
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor}")
        if not regularization > 0 or not pool_regularization > 0:
            raise ValueError(
                f"regularization and pool_regularization must be > 0, got {regularization}, {pool_regularization}"
            )
        m = num_workers
        self.dim = dim
        self.num_workers = m
        self.lam = float(forgetting_factor)
        self.delta = float(regularization)
        self.pooled = bool(pooled)
        self.pool_delta = float(pool_regularization)
        self.pool_lam = self.lam ** (1.0 / m)
        zero10, zero4 = (0.0,) * 10, (0.0,) * 4
        self._D = [zero10] * m  # 10-tuples (immutable: shared until first written)
        self._c = [zero4] * m
        self._pool_D, self._pool_c = zero10, zero4
        self._K = [tuple(x / self.delta for x in _EYE10)] * m  # (D_i + delta I)^-1
        self._prior = zero4
        self._rows = [[0.0] * 4 for _ in range(m)]
        self._theta_np = None  # numpy copy of the rows, built when read
        self._numpy = m >= NUMPY_MIN_WORKERS
        if self._numpy:
            self._K_np = np.array([_full4(k) for k in self._K])
            self._c_np = np.zeros((m, 4))
        self._version = 0  # bumped whenever theta changes (not when set by hand through theta[...])
        self._dirty: list[int] = []  # workers updated since the last solve (distinct)
        self._stale = False
        # lazy: solve when theta is next read (batches the completions between two decisions);
        # else at every update (keeps the solve off the routing path: LBGR's default).
        self.lazy = bool(lazy)

    @property
    def D(self) -> np.ndarray:
        return np.array([_full4(d) for d in self._D])

    @property
    def c(self) -> np.ndarray:
        return np.array(self._c)

    @property
    def K(self) -> np.ndarray:
        if self._stale:
            self._solve()
        return np.array([_full4(k) for k in self._K])

    @property
    def prior(self) -> np.ndarray:
        if self._stale:
            self._solve()
        return np.array(self._prior)

    @property
    def version(self) -> int:
        """Bumped whenever theta changes (solves a pending lazy update first)."""
        if self._stale:
            self._solve()
        return self._version

    @property
    def theta(self) -> np.ndarray:
        """(M, d) coefficients, solved for the samples so far (a numpy copy of `theta_rows`,
        kept until the next change: tests may write into it)."""
        if self._stale:
            self._solve()
        if self._theta_np is None:
            self._theta_np = np.array(self._rows, dtype=float).reshape(-1, self.dim)
        return self._theta_np

    @property
    def theta_rows(self) -> list[list[float]]:
        """`theta` as Python lists (the routing hot path)."""
        if self._stale:
            self._solve()
        return self._rows

    @theta_rows.setter
    def theta_rows(self, rows) -> None:  # tests set coefficients by hand
        self._rows = rows

    def predict(self, phi: np.ndarray) -> np.ndarray:
        """phi: (M, d), one feature row per worker -> (M,) residuals."""
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi, y: float) -> None:
        """One sample (phi, y) of `worker`: D = lambda D + phi phi', c = lambda c + y phi (and the pool's)."""
        f0, f1, f2, f3 = phi
        f0, f1, f2, f3, y = float(f0), float(f1), float(f2), float(f3), float(y)
        lam = self.lam
        d00, d01, d02, d03, d11, d12, d13, d22, d23, d33 = self._D[worker]
        o00, o01, o02, o03 = f0 * f0, f0 * f1, f0 * f2, f0 * f3
        o11, o12, o13, o22, o23, o33 = f1 * f1, f1 * f2, f1 * f3, f2 * f2, f2 * f3, f3 * f3
        self._D[worker] = (
            d00 * lam + o00, d01 * lam + o01, d02 * lam + o02, d03 * lam + o03, d11 * lam + o11,
            d12 * lam + o12, d13 * lam + o13, d22 * lam + o22, d23 * lam + o23, d33 * lam + o33,
        )  # fmt: skip
        y0, y1, y2, y3 = y * f0, y * f1, y * f2, y * f3
        c0, c1, c2, c3 = self._c[worker]
        self._c[worker] = (c0 * lam + y0, c1 * lam + y1, c2 * lam + y2, c3 * lam + y3)
        if self.pooled:
            pl = self.pool_lam
            d00, d01, d02, d03, d11, d12, d13, d22, d23, d33 = self._pool_D
            self._pool_D = (
                d00 * pl + o00, d01 * pl + o01, d02 * pl + o02, d03 * pl + o03, d11 * pl + o11,
                d12 * pl + o12, d13 * pl + o13, d22 * pl + o22, d23 * pl + o23, d33 * pl + o33,
            )  # fmt: skip
            c0, c1, c2, c3 = self._pool_c
            self._pool_c = (c0 * pl + y0, c1 * pl + y1, c2 * pl + y2, c3 * pl + y3)
        if worker not in self._dirty:
            self._dirty.append(worker)
        self._stale = True
        if not self.lazy:
            self._solve()

    def _solve(self) -> None:
        """theta for the current D, c: K_i for the updated workers, the prior, theta's rows."""
        delta = self.delta
        dirty = self._dirty
        theta = None
        K, C = self._K, self._c
        for w in dirty:
            K[w] = _inv4(self._D[w], delta)
        if self._numpy:
            for w in dirty:
                self._K_np[w] = _full4(K[w])
                self._c_np[w] = C[w]
        if self.pooled:
            self._prior = p = _solve4(self._pool_D, self.pool_delta, self._pool_c)
            q0, q1, q2, q3 = delta * p[0], delta * p[1], delta * p[2], delta * p[3]
            if self._numpy:
                b = self._c_np + (q0, q1, q2, q3)
                theta = np.matmul(self._K_np, b[:, :, None])[:, :, 0]
                self._rows = theta.tolist()
            else:
                rows = []
                for (k00, k01, k02, k03, k11, k12, k13, k22, k23, k33), (c0, c1, c2, c3) in zip(K, C):
                    b0, b1, b2, b3 = c0 + q0, c1 + q1, c2 + q2, c3 + q3
                    rows.append([
                        k00 * b0 + k01 * b1 + k02 * b2 + k03 * b3,
                        k01 * b0 + k11 * b1 + k12 * b2 + k13 * b3,
                        k02 * b0 + k12 * b1 + k22 * b2 + k23 * b3,
                        k03 * b0 + k13 * b1 + k23 * b2 + k33 * b3,
                    ])  # fmt: skip
                self._rows = rows
        else:
            rows = self._rows
            for w in dirty:
                k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = K[w]
                b0, b1, b2, b3 = C[w]
                rows[w] = [
                    k00 * b0 + k01 * b1 + k02 * b2 + k03 * b3,
                    k01 * b0 + k11 * b1 + k12 * b2 + k13 * b3,
                    k02 * b0 + k12 * b1 + k22 * b2 + k23 * b3,
                    k03 * b0 + k13 * b1 + k23 * b2 + k33 * b3,
                ]  # fmt: skip
        self._theta_np = theta  # None: built from the rows when read
        self._version += 1
        dirty.clear()
        self._stale = False


class SGDLearner:
    """Plain stochastic gradient descent on the squared error: theta += lr * (y - theta . phi) * phi."""

    def __init__(self, num_workers: int, dim: int, learning_rate: float = 0.01) -> None:
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        self.lr = float(learning_rate)
        self.theta = np.zeros((num_workers, dim))
        self.theta_rows = self.theta.tolist()  # Python copy for the routing hot path
        self.version = 0  # bumped whenever theta changes

    def predict(self, phi: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", self.theta, phi)

    def update(self, worker: int, phi, y: float) -> None:
        phi = np.asarray(phi, dtype=float)
        theta = self.theta[worker]
        theta += self.lr * (y - theta @ phi) * phi
        self.theta_rows[worker] = theta.tolist()
        self.version += 1


LEARNERS = ("rls", "sgd", "none")


def make_learner(
    kind: str,
    num_workers: int,
    dim: int,
    *,
    forgetting_factor: float,
    rls_regularization: float,
    rls_pooled: bool,
    rls_pool_regularization: float,
    rls_init_var: float,
    rls_max_trace: float,
    sgd_learning_rate: float,
):
    """LBGR's residual learner from its config keys (docs/ALGORITHMS.md §3): "rls" with
    rls_regularization > 0 -> RidgeRLSLearner (pooled prior), = 0 -> plain RLSLearner; "sgd";
    "none" -> None (no residual)."""
    if kind == "rls" and rls_regularization > 0:
        return RidgeRLSLearner(
            num_workers, dim, forgetting_factor, rls_regularization, rls_pooled, rls_pool_regularization
        )
    if kind == "rls":
        return RLSLearner(num_workers, dim, forgetting_factor, rls_init_var, rls_max_trace)
    if kind == "sgd":
        return SGDLearner(num_workers, dim, sgd_learning_rate)
    if kind == "none":
        return None
    raise ValueError(f"learner must be one of {list(LEARNERS)}, got {kind!r}")
