"""A tiny Hydra app with the harness's shape, used to test the Slurm launchers without the simulator.

Like `python -m repro.run`: one grid cell per Hydra job; the cell's folder is results/<exp>/<run signature>/;
a finished cell (summary.json present) is skipped; files are written atomically, summary.json last; the
numbers depend only on the config (seeded numpy), so a cell gives the same bytes on any launcher.
Unlike it, it also records where it ran (launch.json: Slurm job/array ids, node, GPUs) and has fault knobs
under `run.fault` (never part of a result: `run` is not in the signature):
  sleep_s / sleep_task_ids  sleep inside the cell, once per results dir, in these array tasks (to be
                            scancelled, signalled or timed out): the first attempt leaves a marker
                            <results_dir>/.sleeping-<task> holding its job id <array>_<task>, and an attempt that
                            finds the marker (requeued job, resubmitted sweep) does not sleep
  probe_nodes               run `srun -N1 -n1 -w <node> hostname` on every other node of the job, the way
                            the SGLang backend starts servers on the other nodes of a multi-node cell
Run from the repository root:  python tests/slurm/fixture_app/app.py -m +exp=toy_grid hydra/launcher=slurm
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
os.environ.setdefault("REPRO_ROOT", str(REPO))  # conf/toy.yaml puts $REPRO_ROOT/conf on Hydra's search path
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import hydra  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from repro.metrics import RECORD_COLUMNS  # noqa: E402
from repro.metrics.summary import summarize  # noqa: E402
from repro.results import CellStore, run_signature  # noqa: E402

SLURM_ENV = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "SLURMD_NODENAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_GPUS_PER_NODE",
    "CUDA_VISIBLE_DEVICES",
)


def fake_records(cfg: DictConfig) -> pd.DataFrame:
    """Deterministic per-request records for this cell (stand-in for a simulator run)."""
    rng = np.random.default_rng([cfg.seed, cfg.cluster.num_workers, cfg.toy.num_requests])
    n = int(cfg.toy.num_requests)
    arrival = np.cumsum(rng.exponential(1.0 / cfg.toy.rate_rps, n))
    ttft = rng.gamma(2.0, 0.05, n)
    prompt = rng.integers(100, 2000, n)
    worker = rng.integers(0, cfg.cluster.num_workers, n).astype(np.int64)
    decode = rng.gamma(2.0, 0.01, n)
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "worker": worker,
            "arrival_s": arrival,
            "first_token_s": arrival + ttft,
            "finish_s": arrival + ttft + decode,
            "queue_wait_s": np.full(n, np.nan),
            "prefill_s": np.full(n, np.nan),
            "decode_s": decode,
            "prompt_tokens": prompt.astype(np.int64),
            "cached_tokens": (prompt * rng.uniform(0, 1, n)).astype(np.int64),
            "output_tokens": np.full(n, 4, dtype=np.int64),
            "group": rng.integers(0, 8, n).astype(np.int64),
            "failed": np.zeros(n, dtype=bool),
        },
        columns=list(RECORD_COLUMNS),
    )


def where_am_i(cfg: DictConfig) -> dict:
    info = {k: os.environ.get(k) for k in SLURM_ENV}
    info["hostname"] = socket.gethostname()
    if cfg.run.fault.probe_nodes and os.environ.get("SLURM_JOB_ID"):
        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        here = os.environ.get("SLURMD_NODENAME")
        info["probes"] = {}
        for node in nodes:
            if node == here:
                continue
            out = subprocess.run(
                ["srun", f"--jobid={os.environ['SLURM_JOB_ID']}", "-N1", "-n1", "-w", node,
                 "--gpus-per-node", os.environ.get("SLURM_GPUS_PER_NODE", "0"),
                 "bash", "-c", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"],
                capture_output=True, text=True, timeout=60,
            )
            info["probes"][node] = out.stdout.strip() or out.stderr.strip()
    return info


def maybe_sleep(cfg: DictConfig) -> None:
    fault = cfg.run.fault
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if not fault.sleep_s or task is None or int(task) not in list(fault.sleep_task_ids):
        return
    marker = Path(cfg.results_dir) / f".sleeping-{task}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    # the id scancel takes for this one task (a bare SLURM_JOB_ID may be the whole array's id)
    marker.write_text(f"{os.environ.get('SLURM_ARRAY_JOB_ID')}_{task}")
    time.sleep(fault.sleep_s)


@hydra.main(version_base="1.3", config_path="conf", config_name="toy")
def main(cfg: DictConfig) -> str:
    sig = run_signature(cfg)
    store = CellStore(cfg.results_dir, cfg.exp_name, sig)
    if store.is_finished():
        print(f"cell {sig} already finished: skipped")
        return "skipped"
    maybe_sleep(cfg)
    records = fake_records(cfg)
    store.write_text("config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    store.write_parquet("requests.parquet", records)
    store.write_json("launch.json", where_am_i(cfg))
    store.write_json("summary.json", summarize(records, {"backend": "fixture", "seed": int(cfg.seed)}))
    print(f"cell {sig} done")
    return "done"


if __name__ == "__main__":
    main()
