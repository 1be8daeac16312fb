"""Launcher configs, the GPU array planner, the cluster scripts' safety checks and the CI-skip hook.
No Slurm cluster needed: sbatch is replaced by a stub that keeps the script submitit generated, and
srun by a stub (submitit checks it is on PATH), so these run on machines without Slurm (.ci/run checks)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_helpers import FIXTURE, REPO, harness_app

FIXTURE_CONF = REPO / "tests" / "slurm" / "fixture_app" / "conf"


def load_planner():
    spec = importlib.util.spec_from_file_location("plan_gpu_arrays", REPO / "launchers" / "plan_gpu_arrays.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


planner = load_planner()


# ---- launcher configs -------------------------------------------------------------------------------------------
def launcher_cfg(launcher: str, *overrides: str, site: Path | None = None, app: str = "fixture") -> dict:
    """hydra.launcher as the app resolves it: the fixture app (toy config + the repository's conf/ on the search
    path) or the harness (`python -m repro.run`'s conf/config.yaml + its tiny test experiment)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    paths = [f"file://{site}"] if site else []
    if app == "fixture":
        conf_dir, name, exp = FIXTURE_CONF, "toy", "exp=toy_grid"
        paths.append(f"file://{REPO}/conf")
    else:
        import repro.harness.schema  # noqa: F401  (registers the schema, as repro.run does)

        conf_dir, name, exp = REPO / "conf", "config", "exp=tiny"
        paths.append(f"file://{REPO}/tests/harness/conf")
    os.environ.setdefault("REPRO_ROOT", str(REPO))
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(name, overrides=[f"hydra/launcher={launcher}", exp, f"hydra.searchpath=[{','.join(paths)}]",
                                       *overrides], return_hydra_config=True)
        return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def write_site(tmp_path: Path, text: str) -> Path:
    (tmp_path / "site" / "local").mkdir(parents=True)
    (tmp_path / "site" / "local" / "slurm.yaml").write_text(textwrap.dedent(text))
    return tmp_path / "site"


@pytest.fixture(autouse=True)
def no_repo_site(monkeypatch):
    if (REPO / "conf" / "local" / "slurm.yaml").exists():
        pytest.skip("conf/local/slurm.yaml exists here: these checks assume the CI defaults")


def test_slurm_defaults_without_site_file():
    p = launcher_cfg("slurm")
    assert p["_target_"].endswith("SlurmLauncher")
    assert p["partition"] is None and p["account"] is None and p["qos"] is None
    assert (p["cpus_per_task"], p["nodes"], p["tasks_per_node"], p["timeout_min"]) == (1, 1, 1, 60)
    assert p["max_num_timeout"] == 0 and p["setup"] == [":"] and p["additional_parameters"] == {}
    assert p["name"] == "repro-toy_grid"
    assert p["submitit_folder"].endswith("/.submitit/%j")


def test_gpu_defaults_one_gpu_per_worker_one_task():
    p = launcher_cfg("slurm_gpu", "cluster.num_workers=6")
    assert p["gpus_per_node"] == 6 and p["nodes"] == 1 and p["tasks_per_node"] == 1
    assert p["max_num_timeout"] == 1 and p["timeout_min"] == 240
    assert p["setup"][0] == ":" and "SLURM_NTASKS=1" in p["setup"][1] and "SLURM_NNODES=1" in p["setup"][1]


def test_laptop_launcher():
    p = launcher_cfg("submitit_laptop")
    assert p["_target_"].endswith("LocalLauncher") and p["name"] == "repro-toy_grid"


def test_site_file_section_wins_over_top_level_over_default(tmp_path):
    site = write_site(tmp_path, """
        partition: shared
        account: acct
        qos: normal
        setup: |
          module load python
          source /shared/venv/bin/activate
        additional_parameters: {reservation: r1}
        cpu:
          partition: cpu
          mem_gb: 4
        gpu:
          partition: gpu
          qos: high
          cpus_per_task: 32
          additional_parameters: {exclusive: true}
        """)
    cpu = launcher_cfg("slurm", site=site)
    assert (cpu["partition"], cpu["account"], cpu["qos"], cpu["mem_gb"]) == ("cpu", "acct", "normal", 4)
    assert cpu["setup"] == ["module load python\nsource /shared/venv/bin/activate\n"]
    assert cpu["additional_parameters"] == {"reservation": "r1"}
    gpu = launcher_cfg("slurm_gpu", site=site)
    assert (gpu["partition"], gpu["account"], gpu["qos"], gpu["cpus_per_task"]) == ("gpu", "acct", "high", 32)
    assert gpu["additional_parameters"] == {"exclusive": True}
    assert gpu["setup"][0].startswith("module load python") and "SLURM_NTASKS=1" in gpu["setup"][1]
    # a command-line override still wins
    assert launcher_cfg("slurm", "hydra.launcher.timeout_min=7", site=site)["timeout_min"] == 7


def test_site_settings_are_not_part_of_the_run_signature(tmp_path):
    from hydra import compose, initialize_config_dir

    from repro.results import run_signature

    site = write_site(tmp_path, "partition: somewhere\n")
    sigs = []
    for launcher, paths in (("basic", f"file://{REPO}/conf"), ("slurm", f"file://{site},file://{REPO}/conf")):
        with initialize_config_dir(config_dir=str(FIXTURE_CONF), version_base="1.3"):
            cfg = compose("toy", overrides=[f"hydra/launcher={launcher}", "exp=toy_grid", f"hydra.searchpath=[{paths}]"])
        sigs.append(run_signature(cfg))
    assert cfg.local.slurm.partition == "somewhere"  # the site file was loaded in the second run
    assert sigs[0] == sigs[1]


if harness_app() is not None:

    @pytest.mark.parametrize("launcher", ["slurm", "slurm_gpu"])
    def test_site_file_reaches_the_launchers_of_repro_run(tmp_path, launcher):
        """The site file must survive repro.run's own config (its structured schema, conf/local/default.yaml)."""
        site = write_site(tmp_path, "account: acct\ncpu: {partition: cpu}\ngpu: {partition: gpu}\n")
        p = launcher_cfg(launcher, site=site, app="repro.run")
        assert (p["account"], p["partition"]) == ("acct", "cpu" if launcher == "slurm" else "gpu"), p
        if launcher == "slurm_gpu":
            assert p["gpus_per_node"] == 2  # cluster.num_workers of the tiny experiment


# ---- the sbatch script submitit writes (stub sbatch, no cluster) ---------------------------------------------------
@pytest.fixture
def stub_sbatch(tmp_path):
    bin_dir, capture = tmp_path / "bin", tmp_path / "captured.sh"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {capture}\necho "stub sbatch: not submitting" >&2\nexit 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    # submitit's SlurmExecutor refuses to start without `srun` on PATH (never called here)
    (bin_dir / "srun").write_text('#!/bin/sh\necho "stub srun: not running" >&2\nexit 1\n')
    (bin_dir / "srun").chmod(0o755)
    return bin_dir, capture


def submitted_script(stub_sbatch, tmp_path, launcher: str, *overrides: str, site: Path | None = None) -> str:
    bin_dir, capture = stub_sbatch
    paths = ([f"file://{site}"] if site else []) + [f"file://{REPO}/conf"]
    cmd = [*FIXTURE.cmd, "-m", "exp=toy_grid", f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           f"hydra.searchpath=[{','.join(paths)}]", *overrides]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REPRO_RESULTS_DIR": str(tmp_path / "res")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "stub sbatch" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return capture.read_text()


def test_sbatch_script_of_a_cpu_sweep(stub_sbatch, tmp_path):
    site = write_site(tmp_path, """
        account: acct
        cpu: {partition: cpu, qos: normal, setup: "source /shared/venv/bin/activate"}
        """)
    script = submitted_script(stub_sbatch, tmp_path, "slurm", site=site)
    for line in ("#SBATCH --array=0-3%4", "#SBATCH --partition=cpu", "#SBATCH --account=acct",
                 "#SBATCH --qos=normal", "#SBATCH --cpus-per-task=1", "#SBATCH --nodes=1",
                 "#SBATCH --time=60", "#SBATCH --job-name=repro-toy_grid", "source /shared/venv/bin/activate"):
        assert line in script.splitlines(), (line, script)
    assert "--gpus-per-node" not in script


def test_sbatch_script_of_a_two_node_gpu_cell(stub_sbatch, tmp_path):
    """What launchers/slurm_sweep.sh submits for 10 workers on 8-GPU nodes."""
    site = write_site(tmp_path, "gpu: {partition: gpu, additional_parameters: {exclusive: true}}\n")
    (line,) = [ln for ln in planner_lines(site, "cluster.num_workers=10", node_gpus=8)]
    n, nodes, per_node, shape = line.split("\t")
    assert (n, nodes, per_node) == ("10", "2", "5")
    script = submitted_script(stub_sbatch, tmp_path, "slurm_gpu", "seed=0", *shape.split(), site=site)
    lines = script.splitlines()
    for want in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=5", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --partition=gpu", "#SBATCH --exclusive"):
        assert want in lines, (want, script)
    assert "export SLURM_NTASKS=1 SLURM_NNODES=1 SLURM_NTASKS_PER_NODE=1" in lines
    assert lines.index("export SLURM_NTASKS=1 SLURM_NNODES=1 SLURM_NTASKS_PER_NODE=1") < next(
        i for i, ln in enumerate(lines) if ln.startswith("srun "))


# ---- the GPU array planner -----------------------------------------------------------------------------------------
def planner_lines(site: Path | None, *overrides: str, node_gpus: int) -> list[str]:
    app = " ".join(FIXTURE.cmd)
    env = {**os.environ, "REPRO_ROOT": str(REPO)}
    args = [sys.executable, str(REPO / "launchers" / "plan_gpu_arrays.py"), "--node-gpus", str(node_gpus), "--app", app,
            "--", "exp=toy_grid", *overrides]
    if site:
        args.append(f"hydra.searchpath=[file://{site},file://{REPO}/conf]")
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def reference_shape(n: int, g: int) -> tuple[int, int]:
    """Fewest nodes that hold n GPUs, then the fewest GPUs per node that still add up to n."""
    nodes = next(k for k in range(1, n + 1) if k * g >= n)
    per_node = next(p for p in range(1, g + 1) if nodes * p >= n)
    return nodes, per_node


@given(st.integers(1, 200), st.integers(1, 16))
def test_cell_shape_matches_reference(n, g):
    nodes, per_node = planner.cell_shape(n, g)
    assert (nodes, per_node) == reference_shape(n, g)
    assert nodes == math.ceil(n / g) and per_node <= g and nodes * per_node - n < nodes


def test_cell_shape_examples_and_bad_input():
    assert planner.cell_shape(10, 8) == (2, 5) and planner.cell_shape(8, 8) == (1, 8)
    assert planner.cell_shape(2, 8) == (1, 2) and planner.cell_shape(17, 8) == (3, 6)
    with pytest.raises(ValueError):
        planner.cell_shape(0, 8)


def test_worker_counts_command_line_wins_and_sweep_syntaxes():
    wc = planner.worker_counts
    assert wc({"cluster.num_workers": "2,4,6,8,10"}, [], 4) == [2, 4, 6, 8, 10]
    assert wc({"cluster.num_workers": "range(2,11,2)"}, [], 4) == [2, 4, 6, 8, 10]
    assert wc({"cluster.num_workers": "2,4"}, ["cluster.num_workers=choice(3,1,3)"], 4) == [1, 3]
    assert wc({"seed": "0,1"}, ["seed=5"], 4) == [4]
    assert wc({}, ["cluster.num_workers=7"], 4) == [7]


def test_gres_parsing():
    assert planner.gres_gpus("gpu:8") == 8
    assert planner.gres_gpus("gpu:a100:4(S:0-1)") == 4
    assert planner.gres_gpus("shard:2,gpu:h100:8") == 8
    assert planner.gres_gpus("(null)") == 0


def test_shape_overrides_parse_back_as_hydra_overrides():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    ovs = planner.shape_overrides(10, 2, 5, {"exclusive": True, "mail-type": "FAIL", "reservation": "it's"})
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(ovs)}
    assert parsed["cluster.num_workers"] == 10 and parsed["hydra.launcher.gpus_per_node"] == 5
    assert parsed["hydra.launcher.additional_parameters"] == {
        "exclusive": True, "mail-type": "FAIL", "reservation": "it's", "nodes": 2}
    assert len(planner.shape_overrides(4, 1, 4, {"exclusive": True})) == 2  # one node: nothing to add


def test_planner_reads_the_grid_from_the_experiment():
    assert planner_lines(None, node_gpus=8) == ["1\t1\t1\tcluster.num_workers=1 hydra.launcher.gpus_per_node=1",
                                                "2\t1\t2\tcluster.num_workers=2 hydra.launcher.gpus_per_node=2"]
    lines = planner_lines(None, "cluster.num_workers=2,9", "seed=3,4", node_gpus=8)
    assert [ln.split("\t")[:3] for ln in lines] == [["2", "1", "2"], ["9", "2", "5"]]


# ---- cluster scripts: refusals and teardown by PID ---------------------------------------------------------------
def run_script(name: str, env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / ".ci" / name)], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("script", [".ci/slurm_up.sh", ".ci/slurm_down.sh", "launchers/slurm_sweep.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="slurm_up.sh refuses non-root before anything else")
def test_slurm_up_refuses_to_wipe_foreign_or_relative_dirs(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "data").write_text("keep me")
    out = run_script("slurm_up.sh", {"BASE": str(tmp_path / "precious")})
    assert out.returncode != 0 and "refusing to wipe" in out.stderr
    assert (tmp_path / "precious" / "data").read_text() == "keep me"
    out = run_script("slurm_up.sh", {"BASE": "relative/dir"})
    assert out.returncode != 0 and "absolute" in out.stderr


def test_slurm_down_with_nothing_running_is_a_no_op(tmp_path):
    for base in (tmp_path / "never-made", tmp_path):
        out = run_script("slurm_down.sh", {"BASE": str(base)})
        assert out.returncode == 0 and "nothing to stop" in out.stdout, out


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_slurm_down_stops_recorded_pids_only_if_start_time_matches(tmp_path):
    base = tmp_path / "base"
    (base / "pids").mkdir(parents=True)
    victim = subprocess.Popen(["sleep", "300"])
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        (base / "pids" / "victim.pid").write_text(f"{victim.pid} {_start_time(victim.pid)}\n")
        # same PID as a live process but another start time: a recycled PID, must be left alone
        (base / "pids" / "bystander.pid").write_text(f"{bystander.pid} 1\n")
        (base / "pids" / "order").write_text("bystander\nvictim\n")
        out = run_script("slurm_down.sh", {"BASE": str(base)})
        assert out.returncode == 0, out
        assert victim.wait(timeout=10) == -15  # SIGTERM
        assert bystander.poll() is None
        assert not (base / "pids" / "victim.pid").exists()
        again = run_script("slurm_down.sh", {"BASE": str(base)})  # twice: still fine
        assert again.returncode == 0, again
    finally:
        for p in (victim, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


# ---- the CI=true hook -------------------------------------------------------------------------------------------
def test_skipped_slurm_test_fails_under_ci_only(tmp_path):
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "conftest.py").write_text((REPO / "tests" / "slurm" / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: x\n    sglang: y\n")
    (tmp_path / "inner" / "test_inner.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.slurm
        def test_needs_cluster(slurm_cluster):
            pass

        @pytest.mark.slurm
        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False

        def test_unmarked_skip():
            pytest.skip("fine")
        """))
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "CI")}

    def run(**extra):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                              cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=120)

    local = run()
    assert local.returncode == 0 and "2 skipped" in local.stdout and "1 xfailed" in local.stdout, local.stdout
    ci = run(CI="true")
    assert ci.returncode == 1, ci.stdout
    assert "must run, but it was skipped: SLURM_CONF is not exported" in ci.stdout
    assert "1 skipped" in ci.stdout and "1 xfailed" in ci.stdout, ci.stdout


# ---- the documented site template ----------------------------------------------------------------------------------
def test_site_template_composes_as_documented(tmp_path):
    site = write_site(tmp_path, (REPO / "conf" / "local.example" / "slurm.yaml").read_text())
    cpu = launcher_cfg("slurm", site=site)
    assert (cpu["partition"], cpu["account"], cpu["qos"], cpu["mem_gb"], cpu["max_num_timeout"]) == (
        "cpu", "my_project", "normal", 4, 0)
    assert cpu["setup"][0].startswith("module load")
    gpu = launcher_cfg("slurm_gpu", "cluster.num_workers=4", site=site)
    assert (gpu["partition"], gpu["cpus_per_task"], gpu["mem_gb"], gpu["gpus_per_node"]) == ("gpu", 64, 512, 4)
    # node_gpus: 8 from the template, read by the planner (no --node-gpus, no sinfo)
    args = [sys.executable, str(REPO / "launchers" / "plan_gpu_arrays.py"), "--app", " ".join(FIXTURE.cmd), "--",
            "exp=toy_grid", "cluster.num_workers=10", f"hydra.searchpath=[file://{site},file://{REPO}/conf]"]
    env = {k: v for k, v in os.environ.items() if k != "NODE_GPUS"}
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\t")[:3] == ["10", "2", "5"]
