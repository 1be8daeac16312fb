"""Online linear regressors for LBGR's per-worker residual model r_i = theta_i . phi.

All workers' parameters live in one (M, d) array (`theta`), mirrored as Python lists
(`theta_rows`) for the per-decision loop, where M small dot products in plain Python beat
numpy's per-call overhead at small M.
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


try:  # the gufunc behind np.linalg.inv, without its per-call errstate context (same LAPACK call)
    from numpy.linalg._umath_linalg import inv as _inv_gufunc

    def _inv(a: np.ndarray) -> np.ndarray:
        return _inv_gufunc(a, signature="d->d")

except ImportError:  # pragma: no cover - a numpy without the private module
    _inv = np.linalg.inv


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
    theta_i = K_i (c_i + delta prior), K_i = (D_i + delta I)^-1.

    Cost (docs/ALGORITHMS.md "LBGR cost"): `update` is the rank-one information-form update
    of D_i, c_i (and the pool's) in plain floats, O(d^2), then one inverse call for the updated
    worker and the pool (a single gufunc call, no errstate context). With `lazy=True` theta is
    solved when it is next read instead, one batched inverse for every worker updated since and
    the pool (fewer solves when completions come in bursts, but the solve then lands on the
    routing path; LBGR keeps the default). Why not Sherman-Morrison on K_i: the
    prior term delta I does not fade while D_i does, so D_i + delta I changes by
    phi phi' + (lambda - 1) D_i per sample, not by a rank-one term; an exact K_i update is not
    rank-one. Either way the solve computes exactly what np.linalg.inv after every update
    computed (same operations on the same D_i, c_i): results are bit-identical to it.
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
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor}")
        if not regularization > 0 or not pool_regularization > 0:
            raise ValueError(
                f"regularization and pool_regularization must be > 0, got {regularization}, {pool_regularization}"
            )
        self.dim = dim
        self.lam = float(forgetting_factor)
        self.delta = float(regularization)
        self.pooled = bool(pooled)
        self.pool_delta = float(pool_regularization)
        self.pool_lam = self.lam ** (1.0 / num_workers)
        # Information form in plain floats (row-major d x d lists): the update is ~d^2 float ops,
        # cheaper than numpy calls on 4 x 4 arrays; the same IEEE operations numpy did.
        self._D = [[0.0] * (dim * dim) for _ in range(num_workers)]
        self._c = [[0.0] * dim for _ in range(num_workers)]
        self._pool_D = [0.0] * (dim * dim)
        self._pool_c = [0.0] * dim
        self._delta_eye = np.eye(dim) * self.delta
        self._pool_delta_eye = np.eye(dim) * self.pool_delta
        self.prior = np.zeros(dim)
        self.K = np.tile(np.eye(dim) / self.delta, (num_workers, 1, 1))  # (D_i + delta I)^-1
        self.Kc = np.zeros((num_workers, dim))  # K_i c_i
        self._theta = np.zeros((num_workers, dim))
        self._rows = self._theta.tolist()
        self._version = 0  # bumped whenever theta changes (not when set by hand through theta[...])
        self._eyes = np.stack([self._delta_eye, self._pool_delta_eye])  # one worker + the pool
        # (flat index of (j, k), of (k, j), j, k) over the upper triangle, row by row
        self._pairs = [(j * dim + k, k * dim + j, j, k) for j in range(dim) for k in range(j, dim)]
        self._dirty: list[int] = []  # workers updated since the last solve (distinct)
        self._stale = False
        # lazy: solve when theta is next read (batches the completions between two decisions);
        # else at every update (keeps the solve off the routing path: LBGR's default).
        self.lazy = bool(lazy)

    def _eye_stack(self, k: int) -> np.ndarray:
        return np.concatenate([np.broadcast_to(self._delta_eye, (k, self.dim, self.dim)), self._pool_delta_eye[None]])

    @property
    def D(self) -> np.ndarray:
        d = self.dim
        return np.array(self._D).reshape(-1, d, d)

    @property
    def c(self) -> np.ndarray:
        return np.array(self._c)

    @property
    def version(self) -> int:
        """Bumped whenever theta changes (solves a pending lazy update first)."""
        if self._stale:
            self._solve()
        return self._version

    @property
    def theta(self) -> np.ndarray:
        """(M, d) coefficients, solved for the samples so far."""
        if self._stale:
            self._solve()
        return self._theta

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
        phi = [float(x) for x in phi]
        y = float(y)
        lam = self.lam
        D = self._D[worker]
        if self.pooled:
            pD = self._pool_D
            plam = self.pool_lam
            for a, b, j, k in self._pairs:  # upper triangle; mirrored: exactly symmetric
                o = phi[j] * phi[k]
                D[a] = D[b] = D[a] * lam + o
                pD[a] = pD[b] = pD[a] * plam + o
            c, pc = self._c[worker], self._pool_c
            for j, p in enumerate(phi):
                yp = y * p
                c[j] = c[j] * lam + yp
                pc[j] = pc[j] * plam + yp
        else:
            for a, b, j, k in self._pairs:
                D[a] = D[b] = D[a] * lam + phi[j] * phi[k]
            c = self._c[worker]
            for j, p in enumerate(phi):
                c[j] = c[j] * lam + y * p
        if worker not in self._dirty:
            self._dirty.append(worker)
        self._stale = True
        if not self.lazy:
            self._solve()

    def _solve(self) -> None:
        """theta for the current D, c: one batched inverse for the updated workers (+ the pool)."""
        d = self.dim
        dirty = self._dirty
        if self.pooled:
            mats = np.array([self._D[w] for w in dirty] + [self._pool_D]).reshape(-1, d, d)
            np.add(mats, self._eyes if len(dirty) == 1 else self._eye_stack(len(dirty)), out=mats)
        else:
            mats = np.array([self._D[w] for w in dirty]).reshape(-1, d, d)
            np.add(mats, self._delta_eye, out=mats)
        inv = _inv(mats)
        K, Kc = self.K, self.Kc
        cs = np.array([self._c[w] for w in dirty] + ([self._pool_c] if self.pooled else []))
        for i, w in enumerate(dirty):
            K[w] = inv[i]
            Kc[w] = inv[i] @ cs[i]
        if self.pooled:
            self.prior = inv[-1] @ cs[-1]
            self._theta = Kc + self.delta * (K @ self.prior)
        else:
            self._theta[dirty] = Kc[dirty]
        self._rows = self._theta.tolist()
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
