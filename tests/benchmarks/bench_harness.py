"""Harness overheads, measured side by side in one run (not collected by pytest).

    PYTHONPATH=. python tests/benchmarks/bench_harness.py [--cells 8] [--queries 1024]

1. Per-cell cost of the harness around a backend (fake backend, `--queries` requests per cell,
   one process): write config / parquet / timings / summary, with W&B disabled vs offline
   (offline = init, live progress, summary, per-request table, finish and service teardown).
   Prints seconds per cell and the offline / disabled ratio.
2. Planning a whole experiment grid before it runs (expand, compose, sign, validate — with
   the workloads built, cached on disk after the first time): seconds per cell for fig2_main.
The whole paper grid (~420 cells) must fit in ~10 minutes on 2 cores with the simulator, so
these numbers are the harness's share of that budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def per_cell(mode: str, cells: int, queries: int) -> list[float]:
    from repro.harness.cell import run_cell_spec
    from tests.harness.helpers import tiny_spec

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(cells):
            spec = tiny_spec(
                Path(tmp), f"seed={seed}", f"tracking={mode}", f"workload.num_queries={queries}", exp="tiny_fake"
            )
            t0 = time.perf_counter()
            out = run_cell_spec(spec)
            times.append(time.perf_counter() - t0)
            assert out.status == "ran", out.error
    return times


def plan_fig2() -> tuple[int, float]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer
    from repro.harness.sweep import plan_cells

    extra: list[str] = []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        head = compose("config", overrides=["exp=fig2_main", *extra], return_hydra_config=True)
        params = OmegaConf.to_container(head.hydra.sweeper.params)
        ov = ["exp=fig2_main", *extra]
        plan_cells(params, ov, GridComposer("config"))  # warm the workload disk cache
        t0 = time.perf_counter()
        cells = plan_cells(params, ov, GridComposer("config"))
        return len(cells), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--queries", type=int, default=1024)
    args = ap.parse_args()

    per_cell("disabled", 1, args.queries)  # imports, first workload build
    per_cell("offline", 1, args.queries)
    res = {}
    for rnd in range(2):  # interleaved rounds: a noisy shared machine hits both alike
        for mode in ("disabled", "offline"):
            res.setdefault(mode, []).extend(per_cell(mode, args.cells // 2, args.queries))
    med = {m: statistics.median(v) for m, v in res.items()}
    print(f"per cell ({args.queries} requests, fake backend, 1 process, median of {len(res['disabled'])}):")
    for m in ("disabled", "offline"):
        print(f"  tracking={m:8s} {med[m] * 1e3:8.1f} ms")
    print(f"  offline / disabled = {med['offline'] / med['disabled']:.1f}x "
          f"(W&B adds {1e3 * (med['offline'] - med['disabled']):.0f} ms per cell)")
    n, secs = plan_fig2()
    print(f"planning fig2_main: {n} cells in {secs:.1f} s ({1e3 * secs / n:.0f} ms per cell; workloads cached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
