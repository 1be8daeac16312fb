"""The simulator judged by the real SGLang server: the same trace (+exp=live_cpu_gsp) through real CPU servers
and through the simulator, side by side.

    python -m repro.analysis.sim_vs_real run --root results_sim_vs_real --rates 2,12 --repeats 3 \\
        --python /work/main/.venv-sglang/bin/python          # real cells (repeats) + simulator cells
    python -m repro.analysis.sim_vs_real table --root results_sim_vs_real   # -> <root>/table.md
    python -m repro.analysis.sim_vs_real cache --python .venv-sglang/bin/python --out DIR   # check (a)
    python -m repro.analysis.sim_vs_real cell <live cell folder>                         # check (b)

`cache` and `cell` are the part-by-part checks (sim_vs_real_cache.py): (a) the cache alone, one
real server per KV size, requests one at a time, exact request by request; (b) a live cell's own
trace and server assignments replayed through the simulator, every difference exact or attributed.

`run` calls `python -m repro.run +exp=live_cpu_gsp workload.request_rate=R` once per rate into
<root>/sim (backend=sim) and `--repeats` times into <root>/real/rep<i> (backend=sglang, real servers);
`--skip-real` / `--skip-sim` leave one side out; `--sim-slowdown F` runs the simulator with every step F times
longer (time coefficients x F, efficiencies / F) into <root>/sim_slow<F> (`table --sim sim_slow<F>`). `table` reads every cell's summary.json and requests.parquet
under those folders and writes the markdown table: per rate and system, the real runs' mean and range
(min-max over repeats) and the simulator's value, for hit rate, P50/P95 latency and TTFT, and requests per
worker (busiest / least busy server), with the targets checked: hit rate within 3 points, requests per
worker within the real range, P50 latency and TTFT within 25 % of the real mean.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from repro.analysis.sim_vs_real_cache import (
    DEFAULT_CAPACITIES,
    cache_table_markdown,
    compare_cache,
    compare_cell,
    replay_cell,
    run_cache_check,
)

EXP = "live_cpu_gsp"
SYSTEMS = ("RoundRobin+LRU", "CacheAware+LRU", "CacheAware+RLT", "LBGR+RLT")  # the cells' policy_name, in order
METRICS = (  # (column, label, scale, unit)
    ("hit_rate", "hit rate", 100.0, "%"),
    ("latency_p50_s", "P50 latency", 1e3, "ms"),
    ("latency_p95_s", "P95 latency", 1e3, "ms"),
    ("ttft_p50_s", "P50 TTFT", 1e3, "ms"),
    ("ttft_p95_s", "P95 TTFT", 1e3, "ms"),
)
HIT_TOLERANCE = 0.03  # absolute (3 points)
TIME_TOLERANCE = 0.25  # relative, P50 latency and TTFT


class TableError(ValueError):
    pass


@dataclass(frozen=True)
class Cell:
    side: str  # real | sim
    repeat: str
    system: str
    rate: float
    metrics: dict
    workers: tuple[int, ...]  # requests per worker, busiest first (completed requests)
    failed: int
    path: Path


def read_cell(path: Path, side: str, repeat: str) -> Cell:
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise TableError(f"{path}: no summary.json (an unfinished cell?)")
    summary = json.loads(summary_path.read_text())
    import yaml

    if not (path / "config.yaml").is_file():
        raise TableError(f"{path}: no config.yaml")
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    rate = float(cfg["workload"]["request_rate"])
    req_path = path / "requests.parquet"
    if not req_path.is_file():
        raise TableError(f"{path}: no requests.parquet (requests per worker need it)")
    req = pd.read_parquet(req_path, columns=["worker", "failed"])
    done = req[~req["failed"].astype(bool)]
    counts = done["worker"].value_counts()
    workers = tuple(sorted((int(v) for v in counts.to_numpy()), reverse=True))
    num_workers = int(cfg["cluster"]["num_workers"])
    workers = workers + (0,) * max(0, num_workers - len(workers))
    metrics = {m: float(summary[m]) for m, *_ in METRICS}
    return Cell(
        side,
        repeat,
        str(summary["provenance"]["policy_name"]),
        rate,
        metrics,
        workers,
        int(summary["num_failed"]),
        path,
    )


def collect(root: Path, exp: str = EXP, sim: str = "sim") -> list[Cell]:
    """Every finished cell of `exp` under <root>/<sim> and <root>/real/<repeat>."""
    cells: list[Cell] = []
    for summary in sorted((root / sim / exp).glob("*/summary.json")):
        cells.append(read_cell(summary.parent, "sim", sim))
    for rep in sorted(p for p in (root / "real").glob("*") if p.is_dir()):
        for summary in sorted((rep / exp).glob("*/summary.json")):
            cells.append(read_cell(summary.parent, "real", rep.name))
    if not cells:
        raise TableError(f"no finished {exp} cells under {root}/{sim} or {root}/real/*")
    return cells


def compare(cells: Iterable[Cell]) -> pd.DataFrame:
    """One row per (rate, system, metric): real mean/min/max/n, sim value, within target or not."""
    cells = list(cells)
    rows = []
    keys = sorted(
        {(c.rate, c.system) for c in cells}, key=lambda k: (k[0], SYSTEMS.index(k[1]) if k[1] in SYSTEMS else 99)
    )
    for rate, system in keys:
        real = [c for c in cells if c.side == "real" and (c.rate, c.system) == (rate, system)]
        sim = [c for c in cells if c.side == "sim" and (c.rate, c.system) == (rate, system)]
        if len(sim) > 1:
            raise TableError(f"{len(sim)} simulator cells for {system} at {rate} req/s: {[str(c.path) for c in sim]}")
        simc = sim[0] if sim else None
        for m, label, scale, unit in METRICS:
            vals = [c.metrics[m] * scale for c in real]
            simv = simc.metrics[m] * scale if simc else math.nan
            mean = sum(vals) / len(vals) if vals else math.nan
            if m == "hit_rate":
                ok = abs(simv - mean) <= HIT_TOLERANCE * 100 if vals and simc else None
            elif m in ("latency_p50_s", "ttft_p50_s"):
                ok = abs(simv / mean - 1) <= TIME_TOLERANCE if vals and simc and mean > 0 else None
            else:
                ok = None
            rows.append(
                dict(
                    rate=rate,
                    system=system,
                    metric=label,
                    unit=unit,
                    real_n=len(vals),
                    real_mean=mean,
                    real_min=min(vals) if vals else math.nan,
                    real_max=max(vals) if vals else math.nan,
                    sim=simv,
                    within=ok,
                )
            )
        for k, label in ((0, "requests, busiest worker"), (-1, "requests, least busy worker")):
            vals = [c.workers[k] for c in real]
            simv = simc.workers[k] if simc else math.nan
            ok = (min(vals) <= simv <= max(vals)) if vals and simc else None
            rows.append(
                dict(
                    rate=rate,
                    system=system,
                    metric=label,
                    unit="",
                    real_n=len(vals),
                    real_mean=sum(vals) / len(vals) if vals else math.nan,
                    real_min=min(vals) if vals else math.nan,
                    real_max=max(vals) if vals else math.nan,
                    sim=simv,
                    within=ok,
                )
            )
        rows.append(
            dict(
                rate=rate,
                system=system,
                metric="failed requests",
                unit="",
                real_n=len(real),
                real_mean=sum(c.failed for c in real) / len(real) if real else math.nan,
                real_min=min((c.failed for c in real), default=math.nan),
                real_max=max((c.failed for c in real), default=math.nan),
                sim=simc.failed if simc else math.nan,
                within=None,
            )
        )
    return pd.DataFrame(rows)


def _num(x: float, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def format_markdown(table: pd.DataFrame) -> str:
    """A markdown table per rate: rows = metric, columns per system 'real mean [min-max] | sim (ok?)'."""
    out = []
    for rate, part in table.groupby("rate", sort=True):
        systems = [s for s in SYSTEMS if s in set(part["system"])] + sorted(set(part["system"]) - set(SYSTEMS))
        n = int(part["real_n"].max()) if len(part) else 0
        real = f"real: mean [min–max] over {n} run{'s' if n != 1 else ''}" if n else "no real runs"
        out.append(f"**{rate:g} req/s** ({real}; sim: one run; ✓/✗: within target, blank: no target)\n")
        out.append("| metric | " + " | ".join(f"{s} real | {s} sim" for s in systems) + " |")
        out.append("|---|" + "---|---|" * len(systems))
        for metric in dict.fromkeys(part["metric"]):
            cells = []
            for s in systems:
                r = part[(part["system"] == s) & (part["metric"] == metric)]
                if r.empty:
                    cells += ["–", "–"]
                    continue
                r = r.iloc[0]
                digits = 0 if "requests" in metric else 1
                real = (
                    f"{_num(r.real_mean, digits)} [{_num(r.real_min, digits)}–{_num(r.real_max, digits)}]"
                    if r.real_n
                    else "–"
                )
                if 0 < r.real_n < n:  # fewer repeats of this system than of others
                    real += f" (n={int(r.real_n)})"
                mark = {True: " ✓", False: " ✗"}.get(r.within, "")
                cells += [real, _num(r.sim, digits) + mark]
            unit = part[part["metric"] == metric]["unit"].iloc[0]
            out.append(f"| {metric}{' (' + unit + ')' if unit else ''} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


TIME_COEFS = ("t_cpu_s", "t_cpu_prefix_s", "t_floor_s")
ETA_COEFS = ("eta_gemm", "eta_weights", "eta_attn", "eta_kv", "eta_head")


def slowdown_overrides(cost_model: dict, factor: float) -> list[str]:
    """Hydra overrides that make every step `factor` times longer: time coefficients x factor, efficiencies
    / factor (p unchanged: each soft-max term scales alike)."""
    out = [f"model.cost_model.{k}={float(cost_model[k]) * factor:.8g}" for k in TIME_COEFS]
    return out + [f"model.cost_model.{k}={float(cost_model[k]) / factor:.8g}" for k in ETA_COEFS]


def sim_folder(slowdown: float) -> str:
    return "sim" if slowdown == 1 else f"sim_slow{slowdown:g}"


def run_cells(
    root: Path,
    rates: Sequence[float],
    repeats: int,
    python: str | None,
    skip_real: bool,
    skip_sim: bool,
    extra: Sequence[str],
    slowdown: float = 1.0,
) -> None:
    base = [sys.executable, "-m", "repro.run", f"+exp={EXP}"]
    sim_extra: list[str] = []
    if slowdown != 1:
        import yaml

        from repro.confutil import CONF_DIR

        model = yaml.safe_load((CONF_DIR / "model" / "tiny_llama.yaml").read_text())
        sim_extra = slowdown_overrides(model["cost_model"], slowdown)
    for rate in rates:
        common = [f"workload.request_rate={rate:g}", *extra]
        if not skip_sim:
            cmd = base + ["backend=sim", f"results_dir={root / sim_folder(slowdown)}", *common, *sim_extra]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
        if not skip_real:
            for i in range(1, repeats + 1):
                cmd = base + [f"backend.server.python={python}", f"results_dir={root / 'real' / f'rep{i}'}", *common]
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates: comma-separated numbers, got {text!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--rates: positive numbers, got {text!r}")
    return rates


def _capacities(text: str) -> list[int]:
    try:
        caps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--capacities: comma-separated integers, got {text!r}") from None
    if not caps or any(c < 16 for c in caps):
        raise argparse.ArgumentTypeError(f"--capacities: integers >= 16, got {text!r}")
    return caps


def _check_main(args: argparse.Namespace) -> int:
    """Checks (a) `cache` and (b) `cell` (sim_vs_real_cache.py): print the table; exit 1 unless exact
    (for (b): every difference attributed)."""
    if args.cmd == "cache":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table = compare_cache(run_cache_check(args.python, args.capacities, out))
        ok = bool(table["exact"].all())
        text = cache_table_markdown(table)
        (out / "cache_table.md").write_text(text)
    else:
        import yaml

        cell = Path(args.cell)
        trace, config = cell / "logs" / "trace.jsonl", cell / "config.yaml"
        for f in (trace, config):
            if not f.is_file():
                raise SystemExit(f"sim_vs_real cell: {f} not found (a live cell's folder has both)")
        table = compare_cell(replay_cell(trace, yaml.safe_load(config.read_text())))
        ok = bool(table["exact or attributed"].all())
        text = cache_table_markdown(table)
    print(text)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.analysis.sim_vs_real", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the real and simulated cells")
    r.add_argument("--root", required=True)
    r.add_argument("--rates", type=_rates, required=True, help="req/s, comma-separated (e.g. 2,12)")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--python", default=None, help="the SGLang servers' interpreter (backend.server.python)")
    r.add_argument("--skip-real", action="store_true")
    r.add_argument("--skip-sim", action="store_true")
    r.add_argument(
        "--sim-slowdown",
        type=float,
        default=1.0,
        help="simulator cells with every step this many times longer, into <root>/sim_slow<F>",
    )
    r.add_argument("overrides", nargs="*", help="more Hydra overrides for every cell (e.g. policy=lbgr_rlt)")
    t = sub.add_parser("table", help="write <root>/table.md from the cells")
    t.add_argument("--root", required=True)
    t.add_argument("--sim", default="sim", help="the simulator's folder under root (e.g. sim_slow3)")
    t.add_argument("--out", default=None, help="default: <root>/table.md")
    c = sub.add_parser("cache", help="(a) one real server per KV size, requests one at a time, vs the simulator")
    c.add_argument("--python", required=True, help="the SGLang server's interpreter")
    c.add_argument("--capacities", type=_capacities, default=list(DEFAULT_CAPACITIES), help="KV tokens, e.g. 1000,1200")
    c.add_argument("--out", required=True, help="folder for the servers' logs and cache_table.md")
    e = sub.add_parser("cell", help="(b) a live cell's trace (logs/trace.jsonl) replayed with its assignments")
    e.add_argument("cell", help="the live cell's folder (config.yaml, logs/trace.jsonl)")
    args = ap.parse_args(argv)
    if args.cmd in ("cache", "cell"):
        return _check_main(args)
    root = Path(args.root)
    if args.cmd == "run":
        if args.repeats < 1:
            ap.error("--repeats must be >= 1")
        if not args.sim_slowdown > 0:
            ap.error("--sim-slowdown must be > 0")
        if not args.skip_real and not args.python:
            ap.error("--python (the SGLang servers' interpreter) is needed for the real cells (or --skip-real)")
        run_cells(
            root,
            args.rates,
            args.repeats,
            args.python,
            args.skip_real,
            args.skip_sim,
            args.overrides,
            args.sim_slowdown,
        )
        return 0
    try:
        table = compare(collect(root, sim=args.sim))
    except TableError as exc:
        raise SystemExit(f"sim_vs_real: {exc}") from None
    text = format_markdown(table)
    out = Path(args.out) if args.out else root / "table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    table.to_csv(out.with_suffix(".csv"), index=False)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
