"""Sweeps through a real Slurm cluster (.ci/slurm_up.sh): every cell is an array task, results match the
local run byte for byte, finished cells are skipped on resubmission, killed / cancelled / timed-out cells are
reported (no hang) and a requeued or resubmitted cell completes.

The first two tests run `python -m repro.run` (the harness's tiny experiment) when the harness is in the
tree, else the fixture app (tests/slurm/fixture_app: the harness's result layout and run signatures); the
others run the fixture, which can sleep inside a cell on demand. Faults are injected from the outside (a
setup line in the batch script, scancel, a signal), so the checks hold for any Hydra app on these launchers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml

from slurm_helpers import (
    FIXTURE,
    REPO,
    cancel_by_name,
    cell_files,
    die_with_parent,
    file_ids,
    harness_app,
    multirun,
    sacct_rows,
    unique_name,
    wait_for,
)

pytestmark = pytest.mark.slurm

# the real `python -m repro.run` once the harness is in the tree, the fixture app before (the fault tests
# below use the fixture: it can sleep inside a cell on demand)
APPS = [harness_app() or FIXTURE]


def output(proc) -> str:
    return (proc.stdout or "") + (proc.stderr or "")


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory):
    """Result files of each app's grid run locally (Hydra's basic launcher), computed once."""
    cache: dict[str, dict] = {}

    def get(app):
        if app.name not in cache:
            root = tmp_path_factory.mktemp(f"local-{app.name}")
            proc = multirun(app, root / "results", root / "sweep", launcher=None)
            assert proc.returncode == 0, output(proc)
            cache[app.name] = cell_files(root / "results")
            assert len(cache[app.name]) == app.cells
        return cache[app.name]

    return get


def array_tasks(rows: list[dict]) -> dict[int, dict]:
    """{array task id: sacct row} for rows whose JobID is <array>_<task>; asserts one array."""
    arrays = {r["JobID"].split("_")[0] for r in rows}
    assert len(arrays) == 1, f"expected one job array, got {rows}"
    return {int(r["JobID"].split("_")[1]): r for r in rows}


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_sweep_runs_every_cell_as_an_array_task_and_matches_local(slurm_cluster, app, tmp_path, local_reference):
    name = unique_name()
    env = {
        "REPRO_RUN": " ".join(app.cmd),
        "REPRO_RESULTS_DIR": str(tmp_path / "results"),
        "SWEEP_DIR": str(tmp_path / "sweep"),
    }
    try:
        proc = subprocess.run(
            [str(REPO / "launchers" / "slurm_sweep.sh"), app.exp, *app.grid, f"hydra.launcher.name={name}"],
            cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
            preexec_fn=die_with_parent,
        )
        assert proc.returncode == 0, output(proc)
        rows = sacct_rows(name, app.cells)
        tasks = array_tasks(rows)
        assert sorted(tasks) == list(range(app.cells)), rows
        assert {r["State"] for r in rows} == {"COMPLETED"}, rows
        array_id = rows[0]["JobID"].split("_")[0]
        for i in range(app.cells):  # submitit's per-task log folder
            assert (tmp_path / "sweep" / ".submitit" / f"{array_id}_{i}").is_dir()
        assert cell_files(tmp_path / "results") == local_reference(app)
        if app is FIXTURE:  # the cells themselves saw the array ids
            seen = {
                (j["SLURM_ARRAY_JOB_ID"], int(j["SLURM_ARRAY_TASK_ID"]))
                for j in (json.loads(p.read_text()) for p in (tmp_path / "results").glob("*/*/launch.json"))
            }
            assert seen == {(array_id, i) for i in range(app.cells)}
    finally:
        cancel_by_name(name)


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_hard_killed_cell_is_reported_and_resubmission_completes_only_it(slurm_cluster, app, tmp_path,
                                                                          local_reference):
    """Of a 2-cell grid, array task 1 is SIGKILLed: the sweep fails with its state, without hanging; the
    resubmitted sweep skips the finished cell (files untouched) and completes the killed one."""
    results, marker = tmp_path / "results", tmp_path / "killed-once"
    # SIGKILL the batch script of array task 1, the first time only (a job killed by OOM / node failure /
    # scancel -s KILL looks the same to submitit: no result file, state FAILED in sacct)
    kill = f"if [ $SLURM_ARRAY_TASK_ID = 1 ] && [ ! -e {marker} ]; then touch {marker}; kill -9 $$; fi"
    name1, name2 = unique_name(), unique_name()
    try:
        t0 = time.monotonic()
        first = multirun(app, results, tmp_path / "sweep1", *app.fault_grid, f"hydra.launcher.name={name1}",
                         f'hydra.launcher.setup=["{kill}"]', timeout=240)
        elapsed = time.monotonic() - t0
        assert first.returncode != 0, output(first)
        assert "UncompletedJobError" in output(first) and "state: FAILED" in output(first), output(first)
        assert marker.exists()
        tasks = array_tasks(sacct_rows(name1, 2))
        assert tasks[1]["State"] == "FAILED" and tasks[1]["ExitCode"] == "0:9", tasks[1]
        assert all(tasks[i]["State"] == "COMPLETED" for i in tasks if i != 1), tasks
        print(f"killed cell reported after {elapsed:.1f}s")

        done_before = file_ids(results)
        assert len(cell_files(results)) == 1

        second = multirun(app, results, tmp_path / "sweep2", *app.fault_grid, f"hydra.launcher.name={name2}",
                          timeout=240)
        assert second.returncode == 0, output(second)
        assert {r["State"] for r in sacct_rows(name2, 2)} == {"COMPLETED"}  # both went through Slurm
        after = file_ids(results)
        # finished cells were skipped: their files were not rewritten (an atomic rewrite changes the inode)
        assert {k: after[k] for k in done_before} == done_before
        assert len(after) > len(done_before)
        reference = local_reference(app)
        assert len(cell_files(results)) == 2
        assert all(reference[k] == v for k, v in cell_files(results).items())
    finally:
        cancel_by_name(name1)
        cancel_by_name(name2)


def _sleeping_job_id(results, task: int, timeout: float = 90) -> str:
    marker = results / f".sleeping-{task}"
    return wait_for(lambda: marker.exists() and marker.read_text().strip(), timeout, f"{marker}")


def test_scancelled_cell_is_reported_not_waited_for(slurm_cluster, tmp_path):
    results, name = tmp_path / "results", unique_name()
    try:
        proc = multirun(FIXTURE, results, tmp_path / "sweep", "seed=0", f"hydra.launcher.name={name}",
                        "run.fault.sleep_s=600", "run.fault.sleep_task_ids=[1]", background=True)
        job = _sleeping_job_id(results, 1)
        subprocess.run(["scancel", job], check=True, timeout=30)
        out, _ = proc.communicate(timeout=120)  # a hang would time out here
        assert proc.returncode != 0, out
        assert "UncompletedJobError" in out and "CANCELLED" in out, out
        tasks = array_tasks(sacct_rows(name, 2))
        assert tasks[1]["State"].startswith("CANCELLED") and tasks[0]["State"] == "COMPLETED", tasks
    finally:
        cancel_by_name(name)
        if "proc" in locals() and proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("max_num_timeout", [1, 0])
def test_timed_out_cell_is_requeued_or_reported(slurm_cluster, tmp_path, max_num_timeout):
    """Slurm's pre-timeout signal (submitit's USR2, sent here with scancel --signal instead of waiting for the
    limit; with timeout_min <= 10 submitit counts any such signal as a time-out): with a requeue left the
    cell is requeued and completes, with none left the sweep reports it."""
    results, name = tmp_path / "results", unique_name()
    try:
        proc = multirun(FIXTURE, results, tmp_path / "sweep", "seed=0", f"hydra.launcher.name={name}",
                        "hydra.launcher.timeout_min=5", f"hydra.launcher.max_num_timeout={max_num_timeout}",
                        "run.fault.sleep_s=600", "run.fault.sleep_task_ids=[1]", background=True)
        job = _sleeping_job_id(results, 1)
        time.sleep(1.0)  # let submitit's signal handler be installed (it is, before the cell starts)
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        out, _ = proc.communicate(timeout=180)
        if max_num_timeout:
            assert proc.returncode == 0, out
            rows = sacct_rows(name, 3, duplicates=True)
            task1 = [r["State"] for r in rows if r["JobID"].endswith("_1")]
            assert task1[0] == "REQUEUED" and task1[-1] == "COMPLETED", rows
            restarts = sorted(json.loads(p.read_text())["SLURM_RESTART_COUNT"] for p in results.glob("*/*/launch.json")
                              if json.loads(p.read_text())["SLURM_ARRAY_TASK_ID"] == "1")
            assert restarts == ["1"]
            assert len(cell_files(results)) == 2
        else:
            assert proc.returncode != 0, out
            assert "timed-out too many times" in out, out
            assert len(cell_files(results)) == 1
    finally:
        cancel_by_name(name)
        if "proc" in locals() and proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_real_time_limit_requeues_the_cell(slurm_cluster, tmp_path):
    """The real thing: a 1-minute limit, Slurm signals 50 s before it (its timer may fire up to a minute
    early), submitit requeues, the second attempt finishes."""
    results, name = tmp_path / "results", unique_name()
    try:
        t0 = time.monotonic()
        proc = multirun(FIXTURE, results, tmp_path / "sweep", "seed=0", f"hydra.launcher.name={name}",
                        "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=50",
                        "hydra.launcher.max_num_timeout=1", "run.fault.sleep_s=600", "run.fault.sleep_task_ids=[1]",
                        timeout=300)
        assert proc.returncode == 0, output(proc)
        rows = sacct_rows(name, 3, duplicates=True)
        task1 = [r["State"] for r in rows if r["JobID"].endswith("_1")]
        assert task1 == ["REQUEUED", "COMPLETED"], rows
        assert len(cell_files(results)) == 2
        print(f"time-limited cell requeued and finished; sweep took {time.monotonic() - t0:.0f}s")
    finally:
        cancel_by_name(name)


def test_gpu_cells_get_one_gpu_per_worker_and_span_nodes_when_needed(slurm_cluster, tmp_path):
    """slurm_gpu through launchers/slurm_sweep.sh on the test cluster's fake GPUs: a cell that fits a node
    gets one node with one GPU per worker; a cell with one worker more than a node has GPUs spans two nodes,
    runs as one process on the first node and can start work on the second (as SGLang servers would)."""
    g = slurm_cluster.gpus_per_node
    if g < 1 or len(slurm_cluster.nodes) < 2:
        pytest.skip(f"needs >= 2 nodes with GPUs (fake ones will do), have {slurm_cluster}")
    small, big = 1, g + 1  # big: 2 nodes x ceil((g+1)/2) GPUs
    per_node_big = -(-big // 2)
    name = unique_name()
    env = {**os.environ, "REPRO_RUN": " ".join(FIXTURE.cmd),
           "REPRO_RESULTS_DIR": str(tmp_path / "results"), "SWEEP_DIR": str(tmp_path / "sweep")}
    try:
        proc = subprocess.run(
            [str(REPO / "launchers" / "slurm_sweep.sh"), FIXTURE.exp, "backend=sglang", "seed=0",
             f"cluster.num_workers={small},{big}", "run.fault.probe_nodes=true", f"hydra.launcher.name={name}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
            preexec_fn=die_with_parent,
        )
        assert proc.returncode == 0, output(proc) + "".join(
            p.read_text() for p in (tmp_path / "sweep").glob("*.log"))
        assert f"workers={big} -> 2 node(s) x {per_node_big} GPU(s)" in proc.stdout
        cells = {}
        for p in (tmp_path / "results").glob("*/*/launch.json"):
            workers = yaml.safe_load((p.parent / "config.yaml").read_text())["cluster"]["num_workers"]
            cells[workers] = json.loads(p.read_text())
        assert sorted(cells) == [small, big]
        one, two = cells[small], cells[big]
        for cell in (one, two):  # exactly one process per cell
            assert cell["SLURM_NTASKS"] == "1" and cell["SLURM_PROCID"] == "0", cell
        assert one["SLURM_JOB_NUM_NODES"] == "1" and one["CUDA_VISIBLE_DEVICES"].count(",") + 1 == small
        assert two["SLURM_JOB_NUM_NODES"] == "2", two
        assert two["CUDA_VISIBLE_DEVICES"].count(",") + 1 == per_node_big, two
        assert two["SLURM_STEP_NODELIST"] == two["SLURMD_NODENAME"]  # the cell runs on the first node only
        (other, probe), = two["probes"].items()
        node, gpus = probe.split()
        assert node == other != two["SLURMD_NODENAME"] and gpus.count(",") + 1 == per_node_big, two
        tres = {r["AllocTRES"] for r in sacct_rows(name, 2)}
        assert any(f"gres/gpu={2 * per_node_big}" in t and "node=2" in t for t in tres), tres
        assert any(f"gres/gpu={small}" in t and "node=1" in t for t in tres), tres
    finally:
        cancel_by_name(name)
