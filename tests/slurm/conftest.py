"""Slurm tests: they need a running cluster (.ci/slurm_up.sh) and SLURM_CONF exported.

Without a cluster they skip, with the reason; under CI=true that skip fails the run (tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

@dataclass(frozen=True)
class SlurmCluster:
    conf: str
    nodes: tuple[str, ...]
    gpus_per_node: int  # smallest gpu gres count over the nodes (0: no GPUs)


def _run(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The running test cluster; skips (fails under CI=true) with the reason when there is none."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        pytest.skip("SLURM_CONF is not exported: start a cluster with `.ci/slurm_up.sh` and `source $BASE/env.sh`")
    if not os.path.isfile(conf):
        pytest.skip(f"SLURM_CONF={conf} does not exist (cluster torn down?)")
    for tool in ("sbatch", "sacct", "sinfo", "squeue", "scancel"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH")
    info = _run(["sinfo", "-h", "-N", "-o", "%N %T %G"])
    if info.returncode != 0:
        pytest.skip(f"sinfo failed (controller down?): {info.stderr.strip()}")
    rows = sorted({tuple(line.split()) for line in info.stdout.splitlines() if line.strip()})
    usable = [r for r in rows if r[1].rstrip("*~#") in {"idle", "mixed", "allocated", "completing"}]
    if not usable:
        pytest.skip(f"no usable node: {rows}")
    acct = _run(["sacct", "-n", "-X", "-S", "now-1minutes"])
    if acct.returncode != 0:
        # without accounting submitit cannot see a hard-killed job and a sweep hangs (SLURM_RECIPE.md pitfall 4)
        pytest.skip(f"sacct does not work (slurmdbd needed): {acct.stderr.strip()}")

    def gpus(gres: str) -> int:
        n = 0
        for part in gres.split(","):
            bits = part.split("(")[0].split(":")
            if bits[0] == "gpu" and bits[-1].isdigit():
                n = max(n, int(bits[-1]))
        return n

    return SlurmCluster(
        conf=conf,
        nodes=tuple(r[0] for r in usable),
        gpus_per_node=min(gpus(r[2]) if len(r) > 2 else 0 for r in usable),
    )
