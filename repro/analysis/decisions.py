"""Routing decisions recorded: one simulated cell run with every decision and completion logged.

The router of the cell is wrapped in `DiagnosticRouter`, which asks an LBGRRouter for its
per-worker estimates (`LBGRRouter.estimate`, side-effect free apart from the decay it would
apply anyway) before every decision, and records, per decision and worker: tracked hit h~, the
worker's TRUE cached prefix at that moment (WorkerView.peek_prefix), S^, P~, r^ (= theta . phi),
E^, and the worker's real queue (waiting, running, in-flight); per completion: realised
latency, TTFT and cached tokens of the chosen worker, and the learner's coefficients after the
update; each request's realised queue wait (arrival to its first prefill step) from the cell's
records (`queue_wait_s`), and on simulated workers the time spent in prefill steps (a read-only
step observer). Other routers are recorded too (choice, true hits, realised latency) so that
their decisions can be compared with LBGR's.

`summarise_decisions` reduces that to the numbers the LBGR study reports (calibration of E^
against the realised latency, P~ against the realised wait, tracker error, how often the chosen
worker is not the one holding the longest prefix, and which term decided it).

The cell is built exactly as repro.backends.sim.run_cell builds it (same seeds, same parts),
so the summary equals the harness's summary.json for the same overrides (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from repro.kvcache import as_key
from repro.routing import LBGRRouter
from repro.routing.base import Router


class DiagnosticRouter(Router):
    """Wraps a router; records every decision and completion (see the module docstring)."""

    def __init__(self, inner: Router):
        self.inner = inner
        self.name = inner.name
        self.decisions: list[dict] = []
        self.per_worker: list[np.ndarray] = []  # (M, len(COLUMNS)) rows per decision
        self.completions: dict[int, dict] = {}
        self.thetas: list[tuple[float, int, np.ndarray]] = []

    COLUMNS = (
        "hit_tracked",
        "hit_true",
        "service_s",
        "load_s",
        "residual_s",
        "predicted_s",
        "waiting",
        "running",
        "in_flight",
        "waiting_prefill_tokens",
        "prefill_pred_s",
    )

    def reset(self, workers, seed):
        self.inner.reset(workers, seed)
        self.num_workers = len(workers)
        self.records: pd.DataFrame | None = None  # the cell's records, set by run_instrumented
        self.sim_workers = []
        self.prefill_busy_s = [0.0] * len(workers)  # simulated seconds in steps that prefill
        for view in workers:
            sim_worker = getattr(view, "_w", None)  # a SimWorkerView: watch its steps, change nothing
            if sim_worker is not None and hasattr(sim_worker, "observer"):
                sim_worker.observer = _chain(sim_worker.observer, self._on_step)
                self.sim_workers.append(sim_worker)

    def busy_s(self) -> list[float]:
        """Simulated seconds each worker spent in steps (empty off the simulator)."""
        return [float(w.busy_s) for w in self.sim_workers]

    def _on_step(self, event, worker, info):
        if event == "start" and info.prefill:
            self.prefill_busy_s[worker.worker_id] += info.duration_s

    def select_worker(self, request, workers, now_s):
        m = len(workers)
        rows = np.full((m, len(self.COLUMNS)), np.nan)
        key = as_key(request.prompt_tokens)
        rows[:, 1] = [w.peek_prefix(key) for w in workers]
        rows[:, 6] = [w.waiting for w in workers]
        rows[:, 7] = [w.running for w in workers]
        rows[:, 8] = [w.in_flight for w in workers]
        rows[:, 9] = [w.waiting_prefill_tokens for w in workers]
        if isinstance(self.inner, LBGRRouter):
            _, hits, service, _, predicted = self.inner.estimate(request, workers, now_s)
            loads = self.inner.load_est.copy()
            rows[:, 0] = hits
            rows[:, 2] = service
            rows[:, 3] = loads
            rows[:, 5] = predicted
            rows[:, 4] = predicted - service - loads
            svc, plen = self.inner.service, len(request.prompt_tokens)  # S's prefill part (the rest: decode)
            rows[:, 10] = [svc.prefill(svc.class_of[i], plen, int(h)) for i, h in enumerate(hits)]
        choice = self.inner.select_worker(request, workers, now_s)
        self.decisions.append(
            {
                "id": request.id,
                "now_s": now_s,
                "worker": int(choice),
                "prompt_tokens": len(request.prompt_tokens),
                "group": request.group_id,
            }
        )
        self.per_worker.append(rows)
        return choice

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.inner.on_request_complete(request, worker_id, latency_s, ttft_s, cached_tokens, now_s)
        self.completions[request.id] = {
            "latency_s": latency_s,
            "ttft_s": ttft_s,
            "cached_tokens": cached_tokens,
            "finish_s": now_s,
        }
        learner = getattr(self.inner, "learner", None)
        if learner is not None:
            self.thetas.append((now_s, worker_id, learner.theta[worker_id].copy()))

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.inner.on_request_abandoned(request, worker_id, now_s)

    # ------------------------------------------------------------------ tables
    def decision_table(self) -> pd.DataFrame:
        """One row per decision: its columns + `<col>_chosen`, `<col>_w<i>` per worker, realised outcome."""
        d = pd.DataFrame(self.decisions)
        arr = np.stack(self.per_worker)  # (n, M, C)
        idx = np.arange(len(d))
        ch = d["worker"].to_numpy()
        for c, name in enumerate(self.COLUMNS):
            d[f"{name}_chosen"] = arr[idx, ch, c]
            for i in range(arr.shape[1]):
                d[f"{name}_w{i}"] = arr[:, i, c]
        comp = pd.DataFrame.from_dict(self.completions, orient="index")
        comp.index.name = "id"
        d = d.join(comp, on="id")
        if self.records is not None:
            d["queue_wait_s"] = d["id"].map(self.records.set_index("id")["queue_wait_s"])
        return d

    def theta_table(self) -> pd.DataFrame:
        if not self.thetas:
            return pd.DataFrame()
        t = np.array([x[0] for x in self.thetas])
        w = np.array([x[1] for x in self.thetas])
        th = np.stack([x[2] for x in self.thetas])
        df = pd.DataFrame({"now_s": t, "worker": w})
        for k in range(th.shape[1]):
            df[f"theta{k}"] = th[:, k]
        return df


def _chain(first, second):
    """An observer calling `first` (if any), then `second`."""
    if first is None:
        return second

    def both(event, worker, info):
        first(event, worker, info)
        second(event, worker, info)

    return both


def run_instrumented(cfg) -> tuple[dict, DiagnosticRouter]:
    """Run the cell `cfg` exactly as the harness does, with the router wrapped; (summary dict, recorder)."""
    from repro.backends.sim import run_cell
    from repro.metrics.summary import summarize

    recorders: list[DiagnosticRouter] = []

    def wrap(router):
        recorders.append(DiagnosticRouter(router))
        return recorders[-1]

    result = run_cell(cfg, wrap_router=wrap)
    recorders[0].records = result.records
    return summarize(result.records, result.provenance), recorders[0]


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, correlation) of y on x; NaNs when degenerate."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan"), float("nan"), float("nan")
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept), float(np.corrcoef(x, y)[0, 1])


def summarise_decisions(d: pd.DataFrame, m: int) -> dict:
    """The numbers of the LBGR study from one decision table (see the module docstring)."""
    out: dict[str, Any] = {}
    lat = d["latency_s"].to_numpy()
    prompt = d["prompt_tokens"].to_numpy()
    out["decisions"] = len(d)
    # Tracker: tracked vs true cached prefix on the chosen worker at the decision, and vs the
    # tokens the worker really served from cache (admission may come much later).
    ht, hx = d["hit_tracked_chosen"].to_numpy(), d["hit_true_chosen"].to_numpy()
    if np.isfinite(ht).any():
        out["tracker_hit_rate_tracked"] = float(np.nansum(ht) / prompt.sum())
        out["tracker_abs_err_frac"] = float(np.nanmean(np.abs(ht - hx) / prompt))
        out["tracker_overestimates_frac"] = float(np.nanmean(ht > hx))
    out["hit_true_at_decision_chosen"] = float(np.nansum(hx) / prompt.sum())
    out["hit_served"] = float(d["cached_tokens"].sum() / prompt.sum())
    true_all = np.stack([d[f"hit_true_w{i}"].to_numpy() for i in range(m)], axis=1)
    best = true_all.max(axis=1)
    out["hit_true_best_worker"] = float(best.sum() / prompt.sum())
    # Spread: the chosen worker is not one holding the longest prefix (when some worker holds one).
    some = best > 0
    out["chose_shorter_prefix_frac"] = float(np.mean(hx[some] < best[some])) if some.any() else float("nan")
    # Queue balance: std/mean of in-flight at decisions.
    infl = np.stack([d[f"in_flight_w{i}"].to_numpy() for i in range(m)], axis=1)
    out["in_flight_mean"] = float(infl.mean())
    out["in_flight_imbalance"] = float(np.mean(infl.max(axis=1) - infl.min(axis=1)))
    out["latency_mean_s"] = float(np.mean(lat))
    if np.isfinite(d["predicted_s_chosen"]).any():
        e = d["predicted_s_chosen"].to_numpy()
        s = d["service_s_chosen"].to_numpy()
        p = d["load_s_chosen"].to_numpy()
        r = d["residual_s_chosen"].to_numpy()
        out["E_hat_mean_s"] = float(np.mean(e))
        out["S_hat_mean_s"] = float(np.mean(s))
        out["P_mean_s"] = float(np.mean(p))
        out["r_hat_mean_s"] = float(np.mean(r))
        out["E_err_mean_s"] = float(np.mean(lat - e))
        out["E_abs_err_mean_s"] = float(np.mean(np.abs(lat - e)))
        out["E_fit_slope_intercept_corr"] = fit_line(e, lat)
        # The realised wait beyond the predicted service vs the load estimate.
        out["P_vs_wait_slope_intercept_corr"] = fit_line(p, lat - s)
        # True queue (in-flight on the chosen worker) vs P~: is P~ tracking the queue?
        out["P_vs_in_flight_corr"] = fit_line(d["in_flight_chosen"].to_numpy(), p)[2]
        # Which term decided: for decisions where the chosen worker is not the longest-prefix one,
        # compare the chosen worker's terms with those of the best-prefix worker.
        tracked_all = np.stack([d[f"hit_tracked_w{i}"].to_numpy() for i in range(m)], axis=1)
        tbest = tracked_all.argmax(axis=1)
        idx = np.arange(len(d))
        ch = d["worker"].to_numpy()
        moved = (tbest != ch) & (tracked_all[idx, tbest] > tracked_all[idx, ch])
        out["moved_from_tracked_prefix_frac"] = float(moved.mean())
        if moved.any():

            def term(name):
                a = np.stack([d[f"{name}_w{i}"].to_numpy() for i in range(m)], axis=1)
                return a[idx, tbest][moved] - a[idx, ch][moved]

            out["moved_delta_S_mean_s"] = float(
                np.mean(term("service_s"))
            )  # > 0: prefix worker slower to serve?? (< 0 normally)
            out["moved_delta_P_mean_s"] = float(np.mean(term("load_s")))
            out["moved_delta_r_mean_s"] = float(np.mean(term("residual_s")))
            # How many moves the residual alone decided (without r the prefix worker would win).
            dS, dP, dR = term("service_s"), term("load_s"), term("residual_s")
            out["moved_decided_by_residual_frac"] = float(np.mean((dS + dP <= 0) & (dS + dP + dR > 0)))
            out["moved_decided_by_load_frac"] = float(np.mean(dS + dP > 0))
    return out
