#!/usr/bin/env python3
"""Split an experiment's grid into one Slurm array per worker count, for hydra/launcher=slurm_gpu.

A Slurm job array has one resource shape for all its tasks, and Hydra resolves the launcher config once per
sweep, so a grid over `cluster.num_workers` (fig6: 2..10) cannot get the right GPU count per cell from a
single `-m` run. This prints one tab-separated line per distinct worker count N:

    N <TAB> NODES <TAB> GPUS_PER_NODE <TAB> OVERRIDES

with NODES = ceil(N / node_gpus) and GPUS_PER_NODE = ceil(N / NODES) (10 workers on 8-GPU nodes: 2 nodes x 5
GPUs), and OVERRIDES the Hydra overrides (space-free) that give the array that shape. launchers/slurm_sweep.sh
runs one multirun per line, pinned to cluster.num_workers=N.

A multi-node cell keeps submitit's `nodes` at 1 (submitit waits for one result per task, and a cell is one
task) and asks Slurm for the nodes through additional_parameters (`#SBATCH --nodes`), merged with the site's
additional_parameters; slurm_gpu.yaml's setup line makes `srun` start that one task on the first node.

node_gpus (GPUs on one node of the GPU partition), first found of: --node-gpus, $NODE_GPUS,
local.slurm.gpu.node_gpus in conf/local/slurm.yaml, the largest gpu gres count `sinfo` reports for the
partition.

Usage: plan_gpu_arrays.py [--node-gpus N] [--app "python -m repro.run"] -- exp=NAME [overrides...]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import subprocess
import sys
from typing import Iterable

WORKERS_KEY = "cluster.num_workers"


def cell_shape(num_workers: int, node_gpus: int) -> tuple[int, int]:
    """(nodes, gpus_per_node) for a cell with one GPU per worker on nodes of node_gpus GPUs."""
    if num_workers < 1 or node_gpus < 1:
        raise ValueError(f"need num_workers >= 1 and node_gpus >= 1, got {num_workers}, {node_gpus}")
    nodes = math.ceil(num_workers / node_gpus)
    return nodes, math.ceil(num_workers / nodes)


def sweep_values(key_value: str) -> list[str]:
    """Values of one Hydra override, sweep or not: 'k=1,2' / 'k=range(2,11,2)' / 'k=choice(2,4)' / 'k=3'."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_overrides([key_value])[0]
    if override.is_sweep_override():
        return [str(v) for v in override.sweep_string_iterator()]
    return [override.get_value_element_as_str()]


def worker_counts(sweeper_params: dict, overrides: Iterable[str], default: int) -> list[int]:
    """Distinct worker counts of the grid: the command line wins over the experiment's sweeper params."""
    spec = None
    if WORKERS_KEY in (sweeper_params or {}):
        spec = f"{WORKERS_KEY}={sweeper_params[WORKERS_KEY]}"
    for ov in overrides:
        if ov.split("=", 1)[0].lstrip("+~") == WORKERS_KEY:
            spec = ov.lstrip("+")
    values = sweep_values(spec) if spec else [str(default)]
    return sorted({int(v) for v in values})


def is_sweep(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([override])[0].is_sweep_override()


def composed_config(app: list[str], overrides: list[str]) -> dict:
    """The app's composed config (without the sweep overrides), as a plain dict."""
    import yaml

    cmd = app + [o for o in overrides if not is_sweep(o)] + ["hydra/launcher=slurm_gpu", "--cfg", "all", "--resolve"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"plan_gpu_arrays: could not compose the config ({shlex.join(cmd)}):\n{out.stderr}")
    return yaml.safe_load(out.stdout)


def gres_gpus(gres: str) -> int:
    """'gpu:8', 'gpu:a100:4(S:0-1)', 'gpu:h100:8,shard:2' -> GPU count (0 if none)."""
    best = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            best = max(best, int(m.group(1)))
    return best


def node_gpus_from_sinfo(partition: str | None) -> int:
    cmd = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"plan_gpu_arrays: cannot ask sinfo for the GPUs per node ({exc})", file=sys.stderr)
        return 0
    return max((gres_gpus(line) for line in out.split()), default=0)


def select(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node-gpus", type=int, default=None)
    ap.add_argument("--app", default=os.environ.get("REPRO_RUN", f"{sys.executable} -m repro.run"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    cfg = composed_config(shlex.split(args.app), args.overrides)
    params = select(cfg, "hydra.sweeper.params") or {}
    counts = worker_counts(params, args.overrides, int(select(cfg, WORKERS_KEY)))
    node_gpus = (
        args.node_gpus
        or (int(os.environ["NODE_GPUS"]) if os.environ.get("NODE_GPUS") else None)
        or select(cfg, "local.slurm.gpu.node_gpus")
        or node_gpus_from_sinfo(select(cfg, "hydra.launcher.partition"))
    )
    if not node_gpus:
        raise SystemExit(
            "plan_gpu_arrays: no GPU count per node: set local.slurm.gpu.node_gpus in conf/local/slurm.yaml, "
            "NODE_GPUS, or --node-gpus (sinfo reports no gpu gres for the partition)"
        )
    site_params = select(cfg, "hydra.launcher.additional_parameters") or {}
    for n in counts:
        nodes, per_node = cell_shape(n, int(node_gpus))
        print(n, nodes, per_node, " ".join(shape_overrides(n, nodes, per_node, site_params)), sep="\t")
    return 0


def _hydra_value(v) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def shape_overrides(num_workers: int, nodes: int, gpus_per_node: int, site_params: dict) -> list[str]:
    """Hydra overrides giving one array of cells with num_workers workers its shape."""
    out = [f"cluster.num_workers={num_workers}", f"hydra.launcher.gpus_per_node={gpus_per_node}"]
    if nodes > 1:
        params = {**site_params, "nodes": nodes}
        if any(" " in str(k) or " " in str(v) for k, v in params.items()):
            raise SystemExit(f"plan_gpu_arrays: spaces in additional_parameters are not supported: {params}")
        body = ",".join(f"{k}:{_hydra_value(v)}" for k, v in params.items())
        out.append("++hydra.launcher.additional_parameters={" + body + "}")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
