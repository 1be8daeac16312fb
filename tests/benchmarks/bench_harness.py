"""Harness overheads, measured side by side in one run (not collected by pytest).

    PYTHONPATH=. python tests/benchmarks/bench_harness.py [--cells 8] [--queries 1024] [--sweeps fig5_request_rate,fig2_main] [--rounds 2]

1. Per-cell cost of the harness around a backend (fake backend, `--queries` requests per cell,
   one process): write config / parquet / timings / summary, with W&B disabled vs offline
   (offline = the cell's time series file + its W&B offline run, repro.tracking).
   Prints seconds per cell and the offline / disabled ratio.
3. Tracking overhead on whole sweeps (issue 16): `python -m repro.run +exp=X` of each of
   `--sweeps`, tracking=disabled and tracking=offline side by side (interleaved rounds, fresh
   results folders, all local cores), wall time until the process exits — every result and
   every W&B file written. Prints both, the ratio and the cost per simulated cell.
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

    times, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(cells):
            spec = tiny_spec(
                Path(tmp), f"seed={seed}", f"tracking={mode}", f"workload.num_queries={queries}", exp="tiny_fake"
            )
            t0, c0 = time.perf_counter(), time.process_time()
            out = run_cell_spec(spec)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            assert out.status == "ran", out.error
    return times, cpu


def plan_fig2() -> tuple[int, float]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer
    from repro.harness.sweep import plan_cells

    extra: list[str] = ["protocol=text"]  # the text protocol's 120 cells (the artifact's plan builds pools)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        head = compose("config", overrides=["exp=fig2_main", *extra], return_hydra_config=True)
        params = OmegaConf.to_container(head.hydra.sweeper.params, resolve=True)  # ${protocol.systems.X}
        ov = ["exp=fig2_main", *extra]
        plan_cells(params, ov, GridComposer("config"))  # warm the workload disk cache
        t0 = time.perf_counter()
        cells = plan_cells(params, ov, GridComposer("config"))
        return len(cells), time.perf_counter() - t0


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sweep_wall(exp: str, mode: str, root: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the sweep's whole process tree, cells) of one fresh sweep."""
    import os
    import subprocess

    results = root / mode
    c0 = _children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "repro.run", f"+exp={exp}", f"results_dir={results}", f"tracking={mode}",
         f"hydra.run.dir={root}/_hydra"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - c0  # the pool workers are reaped before the sweep exits
    assert res.returncode == 0, res.stderr[-2000:]
    cells = len(list((results / exp).glob("*/summary.json")))
    if mode == "offline":
        runs = len(list((results / exp).glob("*/wandb/offline-run-*/run-*.wandb")))
        assert runs == cells, f"{runs} W&B runs for {cells} cells"
    return wall, cpu, cells


def sweeps(names: list[str], rounds: int) -> None:
    print(f"whole sweeps, tracking=disabled vs offline (until every file is written; median of {rounds} "
          f"interleaved rounds; CPU = user+sys of the sweep's process tree, steadier on a shared machine):")
    for exp in names:
        walls: dict[str, list[float]] = {"disabled": [], "offline": []}
        cpus: dict[str, list[float]] = {"disabled": [], "offline": []}
        cells = 0
        for rnd in range(rounds):
            for mode in (("disabled", "offline") if rnd % 2 == 0 else ("offline", "disabled")):
                with tempfile.TemporaryDirectory() as tmp:
                    wall, cpu, cells = sweep_wall(exp, mode, Path(tmp))
                walls[mode].append(wall)
                cpus[mode].append(cpu)
        for what, vals in (("wall", walls), ("CPU ", cpus)):
            d, o = statistics.median(vals["disabled"]), statistics.median(vals["offline"])
            print(f"  {exp:18s} {cells:3d} cells, {what}: disabled {d:6.1f} s, offline {o:6.1f} s, "
                  f"offline / disabled = {o / d:.3f} ({1e3 * (o - d) / cells:+.0f} ms per cell)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--queries", type=int, default=1024)
    ap.add_argument("--sweeps", default="fig5_request_rate,fig2_main", help="experiments for part 3 ('' to skip)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    per_cell("disabled", 1, args.queries)  # imports, first workload build
    per_cell("offline", 1, args.queries)
    res: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for rnd in range(2):  # interleaved rounds: a noisy shared machine hits both alike
        for mode in ("disabled", "offline"):
            wall, c = per_cell(mode, args.cells // 2, args.queries)
            res.setdefault(mode, []).extend(wall)
            cpu.setdefault(mode, []).extend(c)
    med = {m: statistics.median(v) for m, v in res.items()}
    cmed = {m: statistics.median(v) for m, v in cpu.items()}
    print(f"per cell ({args.queries} requests, fake backend, 1 process, median of {len(res['disabled'])}):")
    for m in ("disabled", "offline"):
        print(f"  tracking={m:8s} {med[m] * 1e3:8.1f} ms wall, {cmed[m] * 1e3:8.1f} ms CPU")
    print(f"  offline / disabled = {med['offline'] / med['disabled']:.2f}x wall, "
          f"{cmed['offline'] / cmed['disabled']:.2f}x CPU "
          f"(tracking adds {1e3 * (med['offline'] - med['disabled']):.0f} ms wall, "
          f"{1e3 * (cmed['offline'] - cmed['disabled']):.0f} ms CPU per cell)")
    n, secs = plan_fig2()
    print(f"planning fig2_main: {n} cells in {secs:.1f} s ({1e3 * secs / n:.0f} ms per cell; workloads cached)")
    if args.sweeps:
        sweeps([e for e in args.sweeps.split(",") if e], args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
