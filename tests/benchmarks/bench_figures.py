"""The whole paper from scratch: `python -m repro.figures --run-missing` into empty temp dirs
(results, figures, workload cache), default tracking, timed until every file is written.

Two lines, as issue 20 asks: the paper's experiments from scratch (target <= 60 s on 2 cores),
then the ones beyond the paper (rule comparison, regime map, Mooncake replay: <= 120 s more) on
top of them, in the same folders, as `make figures` builds them (fig2_router_rules draws
fig2_main's cells beside its own, so it needs the paper's results; nothing else is reused). The machine's load average is
printed beside each time: on a shared machine it is the first thing to look at. So is the CPU
time of the build and its workers (and CPU / wall, the cores it kept busy): the build is CPU-bound,
so CPU time moves less than wall time when the machine's speed drifts.

    python tests/benchmarks/bench_figures.py [--paper-only] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEYOND = ["fig2_router_rules", "regime_map", "load_ladder", "mooncake_replay"]


def artefacts() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from repro.figures import ARTEFACTS

    return list(ARTEFACTS)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build(names: list[str], work: Path, fresh: bool) -> tuple[float, float, int]:
    if fresh:
        for d in ("results", "figures", "cache"):
            shutil.rmtree(work / d, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_CACHE_DIR": str(work / "cache" / "workloads")}
    cmd = [sys.executable, "-m", "repro.figures", *names, "--run-missing", "--results-dir", str(work / "results"),
           "--figures-dir", str(work / "figures"), "--reproduce-md", str(work / "REPRODUCE.md")]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)  # the build and its pool workers
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    return wall, cpu, proc.returncode


def cell_counts(results: Path, names: list[str]) -> tuple[int, int]:
    """(cells run, cells filled from a finished twin in another experiment) of these experiments."""
    import json

    run = taken = 0
    for name in names:
        for t in (results / name).glob("*/timings.json"):
            if "reused_from" in json.loads(t.read_text()).get("harness", {}):
                taken += 1
            else:
                run += 1
    return run, taken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paper-only", action="store_true", help="only the paper's experiments")
    ap.add_argument("--keep", type=Path, default=None, help="build here and keep it (default: a temp dir)")
    a = ap.parse_args(argv)
    every = artefacts()
    groups = [("paper", [n for n in every if n not in BEYOND], 60.0)]
    if not a.paper_only:
        groups.append(("beyond the paper", [n for n in every if n in BEYOND], 120.0))
    work = a.keep or Path(tempfile.mkdtemp(prefix="bench_figures_"))
    rc = 0
    print(f"{'build from scratch':<20} {'wall s':>8} {'target s':>9} {'ratio':>6} {'CPU s':>7} {'cores':>6}"
          "  load before -> after (1, 5, 15 min)")
    try:
        for label, names, target in groups:
            before = load()
            wall, cpu, code = build(names, work, fresh=label == "paper")
            rc |= code
            computed, taken = cell_counts(work / "results", names)
            print(f"{label:<20} {wall:8.1f} {target:9.0f} {wall / target:6.2f} {cpu:7.1f} {cpu / wall:6.2f}"
                  f"  {before} -> {load()}  cells: {computed} run, {taken} taken from a twin"
                  f"{'' if code == 0 else f'  (exit {code})'}", flush=True)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
