"""Backend `theory` (a plain summary dict per cell) and the per-site conf/local/ layer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import repro.theory
from repro.harness.cell import CellSpec, run_cell_spec
from repro.harness.compose import cell_signature, resolve
from repro.results import run_signature
from tests.harness.helpers import ROOT

STUBS = Path(__file__).resolve().parent / "stub_conf"


def compose_with(searchpath: list[Path], overrides: list[str]) -> dict:
    import repro.harness.schema  # noqa: F401

    sp = ",".join(f"file://{p}" for p in searchpath)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return resolve(compose("config", overrides=[*overrides, f"hydra.searchpath=[{sp}]"]))


def test_theory_cell_writes_the_dict_as_its_summary(tmp_path, monkeypatch):
    seen = []

    def fake_run_theory_cell(params):
        seen.append(dict(params))
        return {"misses_per_phase": 13.0, "ratio": 13.0, "policy": params["policy"]}

    monkeypatch.setattr(repro.theory, "run_theory_cell", fake_run_theory_cell, raising=False)
    cfg = compose_with([STUBS], ["exp=thm_competitive_ratio", "theory.b_minus_l_plus_1=13", "seed=4", "tracking=disabled"])
    cfg["results_dir"] = str(tmp_path)
    sig = cell_signature(cfg)
    assert sig == run_signature(cfg["theory"])  # the same folder as the theory CLI's own runs
    out = run_cell_spec(CellSpec(0, "thm", cfg, sig, str(tmp_path), cfg["exp_name"]))
    assert out.status == "ran", out.error
    assert seen == [{**cfg["theory"], "seed": 4}] and cfg["theory"]["seed"] == 4
    cell = Path(out.dir)
    summary = json.loads((cell / "summary.json").read_text())
    assert {k: summary[k] for k in ("misses_per_phase", "ratio", "policy")} == {
        "misses_per_phase": 13.0,
        "ratio": 13.0,
        "policy": "lru",
    }
    assert summary["provenance"]["backend"] == "theory" and summary["provenance"]["seed"] == 4
    assert "model" not in summary["provenance"]
    assert sorted(p.name for p in cell.iterdir()) == ["config.yaml", "summary.json", "timings.json"]


def test_local_layer_overrides_without_changing_signatures(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "conf" / "local.example", site / "local")
    text = (site / "local" / "default.yaml").read_text()
    text = text.replace("# results_dir: /shared/project/repro/results", f"results_dir: {tmp_path}/shared")
    text = text.replace("    entity: null", "    entity: my-team")
    (site / "local" / "default.yaml").write_text(text)
    base = compose_with([STUBS], ["policy=lbgr_rlt"])
    with_local = compose_with([site, STUBS], ["policy=lbgr_rlt"])
    assert with_local["results_dir"] == f"{tmp_path}/shared"
    assert with_local["tracking"]["entity"] == "my-team" and base["tracking"]["entity"] is None
    assert cell_signature(with_local) == cell_signature(base)


def test_example_is_valid_yaml_and_documented():
    text = (ROOT / "conf" / "local.example" / "default.yaml").read_text()
    assert text.startswith("# @package _global_") and "cp -r conf/local.example conf/local" in text
