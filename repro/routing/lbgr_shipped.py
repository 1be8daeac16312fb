"""LBGR as its authors shipped it: policy `eta_online_3d` of their sgl-router (GitHub
fzwark/KVRouting, commit fc3b2a1), re-implemented from the facts of their code.

Not our reconstruction (`lbgr.py`, which stays): every rule here was read from their
`router.rs`, `lib.rs` and `tree.rs`; docs/ALGORITHMS.md §3 "LBGR as shipped" lists each with
the file it comes from and where it departs from the paper's text. In short, in the units of
their code ("ms": one unit per character of the request text, E2E in milliseconds):

- base = max(1, 1000 * (uncached / 1000)) with uncached = characters of the text beyond the
  worker's match in the shared prefix index (cached characters cost 0);
- per worker an integer load: += round(base) at dispatch, floor(load * 31 / 32) every 20 ms
  (their timer thread), -= the request's decayed remainder round(inc * (31/32)^k),
  k = whole 20 ms since its dispatch, on completion or failure (saturating at 0);
- per worker an RLS on phi = [1, 0, 0, 0] (only the intercept learns), lambda 0.992,
  P0 = 1e6, target max(1, E2E_ms - (base + load at dispatch)); their 4x4 update is kept
  literally, rows of the unlearned weights included (they overflow after ~86,650 updates);
- pred_i = max(1, base_i + load_i + theta_i . phi) (Rust's max: NaN -> 1); scan workers in
  order, a later one replaces the best only if pred + 1 < best;
- prefix index: one multi-tenant tree (sglang-router 0.1.4's), the text inserted for the
  chosen worker at dispatch and again at completion, trimmed to 2^24 characters per worker
  every 60 s; a worker's match walks only nodes it holds and never touches timestamps; no
  knowledge of the worker's KV capacity.

Time: only the driver's `now_s` (simulated or wall). The 20 ms timer is applied lazily: ticks
sit at k * 20 ms of now_s (k >= 1, counted from the clock's origin: the start of the
simulation or of the router service, where their timer thread starts), and before anything
reads or changes a load every tick up to now is applied one by one, exactly as the thread
would have. The 60 s trim runs the same way at the first call at or after each k * 60 s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from repro.kvcache.keys import common_prefix_len
from repro.routing.approx_tree import ApproximateTree
from repro.routing.base import Router, WorkerView, check_choice, request_text
from repro.routing.cache_aware import ids_key

if TYPE_CHECKING:  # pragma: no cover
    from repro.workloads.request import Request

__all__ = ["LBGRShippedRouter", "MaskedRLS", "ShippedPrefixIndex", "base_units", "decayed_remainder", "whole_ms"]

# their cost line: intercept 0, 0 per cached and 1000 per 1000 uncached characters, queue weight 1
LEN_SCALE = 1000.0
SLOPE_UNCACHED = 1000.0
NUM_FEATURES = 4
PHI_BIAS = (1.0, 0.0, 0.0, 0.0)
_NS_EPS_MS = 1e-6  # 1 ns: absorbs float error when seconds become whole milliseconds


def whole_ms(seconds: float) -> int:
    """Whole milliseconds in `seconds` (Rust's `Duration::as_millis`, truncating), >= 0."""
    if seconds <= 0:
        return 0
    return math.floor(seconds * 1000.0 + _NS_EPS_MS)


def rust_max1(x: float) -> float:
    """Rust's `x.max(1.0)`: a NaN gives 1.0 (Python's max would keep the NaN)."""
    return x if x > 1.0 else 1.0


def round_half_away(x: float) -> int:
    """Rust's `f64::round` for x >= 0: halves go up (Python's round goes to even)."""
    f = math.floor(x)
    return int(f) + 1 if x - f >= 0.5 else int(f)


def powi(a: float, n: int) -> float:
    """Rust's `f64::powi` (compiler-builtins' __powidf2): square and multiply, in this order."""
    recip = n < 0
    n = abs(n)
    r = 1.0
    while True:
        if n & 1:
            r *= a
        n >>= 1
        if n == 0:
            break
        a *= a
    return 1.0 / r if recip else r


def base_units(cached: int, uncached: int) -> float:
    """The request's cost base on a worker ("ms"): their formula, float for float."""
    return rust_max1(0.0 + 0.0 * (cached / LEN_SCALE) + SLOPE_UNCACHED * (uncached / LEN_SCALE))


def decayed_remainder(inc: int, elapsed_ms: int, num: int = 31, den: int = 32, interval_ms: int = 20) -> int:
    """What a completion takes off the load: round(inc * (num/den)^k), k = elapsed_ms // interval_ms."""
    ticks = elapsed_ms // interval_ms
    if ticks <= 0:
        return inc
    return round_half_away(float(inc) * powi(num / den, ticks))


class MaskedRLS:
    """Their 4-weight RLS with a learn mask, as written (`Rls4`): P = p0 * I, theta = 0.

    Only masked-in weights move, but every row of P is divided by lambda at each update, so the
    unlearned diagonal grows as p0 / lambda^n, overflows to inf (n = 86,648 at 0.992) and the
    next update turns theta into NaN (inf * 0); a NaN prediction then reads as 1 (rust_max1).
    """

    __slots__ = ("theta", "p", "lam", "mask")

    def __init__(self, lam: float, p0: float, mask: Sequence[bool] = (True, False, False, False)) -> None:
        self.lam = float(lam)
        self.theta = [0.0] * NUM_FEATURES
        self.p = [[float(p0) if i == j else 0.0 for j in range(NUM_FEATURES)] for i in range(NUM_FEATURES)]
        self.mask = tuple(bool(m) for m in mask)

    def predict(self, phi: Sequence[float] = PHI_BIAS) -> float:
        t = self.theta
        return t[0] * phi[0] + t[1] * phi[1] + t[2] * phi[2] + t[3] * phi[3]

    def update(self, y: float, phi: Sequence[float] = PHI_BIAS) -> None:
        p, lam, mask = self.p, self.lam, self.mask
        r = range(NUM_FEATURES)
        pphi = [p[i][0] * phi[0] + p[i][1] * phi[1] + p[i][2] * phi[2] + p[i][3] * phi[3] for i in r]
        denom = lam + phi[0] * pphi[0] + phi[1] * pphi[1] + phi[2] * pphi[2] + phi[3] * pphi[3]
        k = [pphi[i] / denom if mask[i] else 0.0 for i in r]
        err = y - self.predict(phi)
        for i in r:
            if mask[i]:
                self.theta[i] += k[i] * err
        kphi_p = [
            [
                k[i] * (phi[0] * p[0][j] + phi[1] * p[1][j] + phi[2] * p[2][j] + phi[3] * p[3][j]) if mask[i] else 0.0
                for j in r
            ]
            for i in r
        ]
        self.p = [[(p[i][j] - kphi_p[i][j]) / lam for j in r] for i in r]


class ShippedPrefixIndex:
    """Their prefix index: sglang-router 0.1.4's multi-tenant tree, on our ApproximateTree.

    The tree's structure, sizes and per-tenant trim are ApproximateTree's (0.3.2's tree, the
    same in these respects). Two things of 0.1.4 differ and are added here, outside it:
    an insert stamps the tenant with the insert's time (whole ms) on EVERY node of the key's
    path, root included (0.3.2: a joined node gets 0, only the end node an epoch); and
    `match_len(key, tenant)` (their `prefix_len_tenant_no_touch`) walks only nodes the tenant
    holds, counts a partial match inside the last one and stamps nothing.
    """

    def __init__(self, tenants: Sequence[int]) -> None:
        self.tree = ApproximateTree(unit=1)
        for t in tenants:  # their constructor: every worker inserted with the empty text
            self.insert("", t, 0)

    def insert(self, key: str, tenant: int, stamp_ms: int) -> None:
        tree = self.tree
        tree.insert(key, tenant)
        node = tree.root  # the key now ends on a node boundary: restamp its whole path
        node.tenants[tenant] = stamp_ms
        pos, n = 0, len(key)
        children = node.children
        while pos < n:
            node = children[key[pos]]
            node.tenants[tenant] = stamp_ms
            pos += len(node.key)
            children = node.children

    def match_len(self, key: str, tenant: int) -> int:
        node = self.tree.root
        pos, n = 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None or tenant not in child.tenants:
                break
            ck = child.key
            if key.startswith(ck, pos):
                pos += len(ck)
                node = child
            else:
                pos += common_prefix_len(key, pos, ck, 1)
                break
        return pos

    def trim(self, max_chars: int) -> int:
        return self.tree.evict_tenant_by_size(max_chars)

    def size(self, tenant: int) -> int:
        return self.tree.tenant_size.get(tenant, 0)


class LBGRShippedRouter(Router):
    """The authors' `eta_online_3d` (module docstring; docs/ALGORITHMS.md "LBGR as shipped")."""

    name = "lbgr_shipped"

    def __init__(
        self,
        name: str = "lbgr_shipped",
        forgetting_factor: float = 0.992,
        initial_covariance: float = 1.0e6,
        decay_numerator: int = 31,
        decay_denominator: int = 32,
        decay_interval_ms: int = 20,
        eviction_interval_secs: float = 60.0,
        max_tree_size: int = 2**24,
        match_on: str = "text",
    ) -> None:
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor}")
        if not initial_covariance > 0:
            raise ValueError(f"initial_covariance must be > 0, got {initial_covariance}")
        for key, value in (
            ("decay_numerator", decay_numerator),
            ("decay_denominator", decay_denominator),
            ("decay_interval_ms", decay_interval_ms),
            ("max_tree_size", max_tree_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key} must be an integer, got {value!r}")
        if not 0 <= decay_numerator <= decay_denominator or decay_denominator < 1:
            raise ValueError(
                f"decay must be numerator/denominator in [0, 1], got {decay_numerator}/{decay_denominator}"
            )
        if decay_interval_ms < 1:
            raise ValueError(f"decay_interval_ms must be >= 1, got {decay_interval_ms}")
        if max_tree_size < 0:
            raise ValueError(f"max_tree_size must be >= 0, got {max_tree_size}")
        self.name = name
        self.forgetting_factor = float(forgetting_factor)
        self.initial_covariance = float(initial_covariance)
        self.decay_numerator = decay_numerator
        self.decay_denominator = decay_denominator
        self.decay_interval_ms = decay_interval_ms
        self.eviction_interval_secs = float(eviction_interval_secs)
        # the trim grid in whole ms (<= 0: never trim)
        self._trim_ms = round(self.eviction_interval_secs * 1000.0) if self.eviction_interval_secs > 0 else 0
        if self.eviction_interval_secs > 0 and self._trim_ms < 1:
            raise ValueError(f"eviction_interval_secs must be >= 0.001 (or <= 0: never), got {eviction_interval_secs}")
        self.max_tree_size = max_tree_size
        self.match_on = check_choice("match_on", match_on, ("text", "tokens"))
        self.uses_text = self.match_on == "text"

    # ------------------------------------------------------------------ lifecycle
    def reset(self, workers: Sequence[WorkerView], seed: int) -> None:
        super().reset(workers, seed)  # (their policy draws no random number)
        m = self.num_workers
        self.loads = [0] * m  # their AtomicU64 per worker, in "ms"
        self.models = [MaskedRLS(self.forgetting_factor, self.initial_covariance) for _ in range(m)]
        self.index = ShippedPrefixIndex(range(m))
        self.ticks_applied = 0  # timer ticks applied so far (ticks at k * decay_interval_ms)
        self.trims_due = 0  # trim slots passed so far (at k * eviction_interval)
        self.trims_run = 0
        # request id -> (worker, key, cached, uncached, load at dispatch, inc, dispatch now_s)
        self.pending: dict[int, tuple] = {}
        self.last_predictions: list[float] = []

    # ------------------------------------------------------------------ the clock
    def advance(self, now_s: float) -> None:
        """Apply every 20 ms tick and every 60 s trim the timers would have run by now_s."""
        ms = whole_ms(now_s)
        tick = ms // self.decay_interval_ms
        n = tick - self.ticks_applied
        if n > 0:
            self.ticks_applied = tick
            num, den = self.decay_numerator, self.decay_denominator
            loads = self.loads
            for i, v in enumerate(loads):
                k = n
                while k and v:  # one floor per tick, as the thread does; a zero load stays zero
                    v = v * num // den
                    k -= 1
                loads[i] = v
        if self._trim_ms:
            due = ms // self._trim_ms
            if due > self.trims_due:  # a trim is idempotent: several missed slots trim once
                self.trims_due = due
                self.index.trim(self.max_tree_size)
                self.trims_run += 1

    def _now(self, now_s: float | None, what: str) -> float:
        if now_s is None:
            raise ValueError(f"lbgr_shipped: {what} needs now_s (the load decays with the clock)")
        return float(now_s)

    def _key(self, request: "Request") -> str:
        if self.match_on == "tokens":
            return ids_key(request.prompt_tokens)
        text = request_text(request)
        if text is None:
            raise ValueError(
                f"request {request.id} has no text; lbgr_shipped matches on the request text like the "
                "authors' router (match_on: tokens matches on the token ids instead)"
            )
        return text

    # ------------------------------------------------------------------ routing
    def select_worker(self, request: "Request", workers: Sequence[WorkerView], now_s: float) -> int:
        now = self._now(now_s, "select_worker")
        self.advance(now)
        key = self._key(request)
        total = len(key)
        index, loads, models = self.index, self.loads, self.models
        preds = []
        best = -1
        best_pred = 0.0
        chosen = (0, 0, 0.0)
        for i in range(self.num_workers):
            cached = index.match_len(key, i) if total else 0
            uncached = max(0, total - cached)
            cur = float(loads[i])
            pred = rust_max1((base_units(cached, uncached) + 1.0 * cur) + models[i].predict())
            preds.append(pred)
            if best < 0 or pred + 1.0 < best_pred:  # a later worker must win by more than 1 ms
                best, best_pred, chosen = i, pred, (cached, uncached, cur)
        cached, uncached, cur = chosen
        inc = round_half_away(base_units(cached, uncached))
        loads[best] += inc
        if key:
            index.insert(key, best, whole_ms(now))
        self.pending[request.id] = (best, key, cached, uncached, cur, inc, now)
        self.last_predictions = preds
        return best

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        record = self.pending.get(request.id)
        if record is None:
            return  # not dispatched by this router
        worker, key, cached, uncached, cur, inc, t0 = record
        if worker != worker_id:
            raise ValueError(f"request {request.id} was dispatched to worker {worker} but completed on {worker_id}")
        now = self._now(now_s, "on_request_complete")
        del self.pending[request.id]
        self.advance(now)
        e2e_ms = float(latency_s) * 1000.0
        self.models[worker].update(rust_max1(e2e_ms - (base_units(cached, uncached) + 1.0 * cur)))
        if key:
            self.index.insert(key, worker, whole_ms(now))  # the prompt text again, never the output
        self._release(worker, inc, t0, now)

    def on_request_abandoned(self, request, worker_id, now_s=None):
        """Their failure paths: the remainder leaves the load; nothing learned, nothing inserted."""
        record = self.pending.pop(request.id, None)
        if record is None:
            return
        now = self._now(now_s, "on_request_abandoned")
        self.advance(now)
        self._release(record[0], record[5], record[6], now)

    def _release(self, worker: int, inc: int, t0: float, now: float) -> None:
        rem = decayed_remainder(
            inc, whole_ms(now - t0), self.decay_numerator, self.decay_denominator, self.decay_interval_ms
        )
        self.loads[worker] = max(0, self.loads[worker] - rem)
