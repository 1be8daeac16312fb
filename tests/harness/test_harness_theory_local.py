"""Backend `theory` (a plain summary dict per cell) and the per-site conf/local/ layer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hydra import compose, initialize_config_dir

from repro.harness.cell import CellSpec, run_cell_spec
from repro.harness.compose import cell_signature, resolve
from repro.results import run_signature
from tests.harness.helpers import ROOT



def compose_with(searchpath: list[Path], overrides: list[str]) -> dict:
    import repro.harness.schema  # noqa: F401

    extra = [f"hydra.searchpath=[{','.join(f'file://{p}' for p in searchpath)}]"] if searchpath else []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return resolve(compose("config", overrides=[*overrides, *extra]))


def test_theory_cell_shares_the_theory_cli_folder(tmp_path):
    """A quick-grid cell through the harness: real run_theory_cell, the CLI's signature and summary keys."""
    from repro.theory.competitive_ratio import grid, run_cell_stored

    cfg = compose_with(
        [], ["exp=thm_competitive_ratio", "theory.quick=true", "theory.x=16", "theory.policy=rlt", "tracking=disabled"]
    )
    cfg["results_dir"] = str(tmp_path)
    (params,) = [p for p in grid(quick=True) if p["construction"] == "thm4" and p["policy"] == "rlt"
                 and p["b_minus_l_plus_1"] == 16]
    sig = cell_signature(cfg)
    assert sig == run_signature(params)
    out = run_cell_spec(CellSpec(0, "thm", cfg, sig, str(tmp_path), cfg["exp_name"]))
    assert out.status == "ran", out.error
    cell = Path(out.dir)
    assert sorted(p.name for p in cell.iterdir()) == [
        "checksums.sha256", "config.yaml", "fingerprint.json", "summary.json", "timings.json"]
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["params"] == params and summary["provenance"]["backend"] == "theory"
    assert "model" not in summary["provenance"]
    timings = json.loads((cell / "timings.json").read_text())
    assert "wall_s" in timings and "backend_wall_s" in timings["harness"]

    # the CLI finds the harness's cell finished, and reports the same numbers
    cli_summary, ran = run_cell_stored(params, str(tmp_path))
    assert not ran
    cli_cell = {k: v for k, v in cli_summary.items() if k != "provenance"}
    assert cli_cell == {k: v for k, v in summary.items() if k != "provenance"}


def test_theory_cell_not_in_the_grid_is_a_config_error():
    from repro.backends.theory import validate_cell

    cfg = compose_with([], ["exp=thm_competitive_ratio", "theory.x=5"])
    (msg,) = validate_cell(cfg)
    assert "no cell panel='thm4' x=5 policy='lru'" in msg and "1024" in msg


def test_local_layer_overrides_without_changing_signatures(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "conf" / "local.example", site / "local")
    text = (site / "local" / "default.yaml").read_text()
    text = text.replace("# results_dir: /shared/project/repro/results", f"results_dir: {tmp_path}/shared")
    text = text.replace("    entity: null", "    entity: my-team")
    (site / "local" / "default.yaml").write_text(text)
    base = compose_with([], ["policy=lbgr_rlt"])
    with_local = compose_with([site], ["policy=lbgr_rlt"])
    assert with_local["results_dir"] == f"{tmp_path}/shared"
    assert with_local["tracking"]["entity"] == "my-team" and base["tracking"]["entity"] is None
    assert cell_signature(with_local) == cell_signature(base)


def test_example_is_valid_yaml_and_documented():
    text = (ROOT / "conf" / "local.example" / "default.yaml").read_text()
    assert text.startswith("# @package _global_") and "cp -r conf/local.example conf/local" in text
