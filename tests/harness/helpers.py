"""Helpers for the harness tests (import as tests.harness.helpers): run `repro.run` in this process or as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_CONF = Path(__file__).resolve().parent / "conf"


def cli_args(results: Path, *args: str) -> list[str]:
    """Arguments for a run over the fixture config tree, Hydra's own outputs kept under `results`."""
    return [
        "--config-dir",
        str(FIXTURE_CONF),
        *args,
        f"hydra.run.dir={results}/_hydra/run",
        f"hydra.sweep.dir={results}/_hydra/multirun",
    ]


def run_inprocess(results: Path, *args: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m repro.run ARGS` in this process (Hydra may end a -m run with SystemExit)."""
    from repro.run import main

    monkeypatch.setenv("REPRO_RESULTS_DIR", str(results))
    monkeypatch.setattr(sys, "argv", ["repro.run"])
    try:
        return main(cli_args(results, *args))
    except SystemExit as exc:
        return int(exc.code or 0)


def run_subprocess(results: Path, *args: str, env: dict | None = None, timeout: float = 120):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_RESULTS_DIR": str(results), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "repro.run", *cli_args(results, *args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cell_files(results: Path, exp: str = "tiny", names=("summary.json", "requests.parquet")) -> dict[str, bytes]:
    """{"<sig>/<name>": bytes} of the identity files of every cell of an experiment."""
    out = {}
    for name in names:
        for path in sorted((results / exp).glob(f"*/{name}")):
            out[f"{path.parent.name}/{name}"] = path.read_bytes()
    return out


def compose_fixture(overrides: list[str]):
    """Resolved config of one cell composed over conf/ + the fixture tree (no Hydra app needed)."""
    from hydra import initialize_config_dir

    import repro.harness.schema  # noqa: F401
    from repro.harness.compose import GridComposer, resolve

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        # the harness's own composition: command-line values get the types of the settings they replace
        return resolve(GridComposer("config")([*overrides, f"hydra.searchpath=[file://{FIXTURE_CONF}]"]))


def tiny_spec(results: Path, *overrides: str, exp: str = "tiny"):
    """A CellSpec for one cell of a fixture experiment (tiny: simulator; tiny_fake), results under `results`."""
    from repro.harness.cell import CellSpec
    from repro.harness.compose import cell_signature

    cfg = compose_fixture([f"exp={exp}", *overrides])
    cfg["results_dir"] = str(results)
    return CellSpec(
        index=0,
        label=" ".join(overrides),
        config=cfg,
        signature=cell_signature(cfg),
        results_dir=str(results),
        exp_name=cfg["exp_name"],
    )


def reference_tiny_grid(tmp_path_factory) -> dict[str, bytes]:
    """The tiny grid run in-process on one core, W&B off: the bytes every other run form must reproduce."""
    results = tmp_path_factory.mktemp("reference")
    mp = pytest.MonkeyPatch()
    try:
        assert run_inprocess(results, "+exp=tiny", "tracking=disabled", "n_jobs=1", monkeypatch=mp) == 0
    finally:
        mp.undo()
    return cell_files(results)
