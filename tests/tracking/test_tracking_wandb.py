"""W&B tracking: the offline run holds what the local files hold; W&B never costs local results."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.harness.cell import run_cell_spec
from repro.metrics import SUMMARY_KEYS
from tests.harness.helpers import ROOT, tiny_spec

ONE_CELL = ("policy=random_lru", "workload.request_rate=6.0")


def leet(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.mark.wandb
def test_offline_run_holds_the_local_summary(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(home))  # anything W&B writes outside the cell lands here
    spec = tiny_spec(tmp_path / "results", *ONE_CELL, "tracking=offline", "tracking.progress_interval_s=0")
    out = run_cell_spec(spec)
    assert out.status == "ran", out.error

    cell = Path(out.dir)
    local = json.loads((cell / "summary.json").read_text())
    (run_dir,) = sorted((cell / "wandb").glob("offline-run-*"))
    remote = json.loads(leet("--summary", "--json", str(run_dir)))
    assert remote["state"] == "finished" and remote["run_id"] == f"tiny-{spec.signature}"
    for key in SUMMARY_KEYS:
        assert same(remote["summary"][key], local[key]), key
    assert remote["summary"]["provenance"]["signature"] == spec.signature
    assert remote["summary"]["requests"]["nrows"] == local["num_requests"]  # per-request table
    assert remote["config"]["signature"] == spec.signature
    assert remote["config"]["workload"]["request_rate"] == 6.0

    records = [json.loads(line) for line in leet("--json", str(run_dir)).splitlines() if line.strip()]
    (run_rec,) = [r for r in records if r["type"] == "run"]
    assert run_rec["run"]["run_group"] == "tiny"
    progress = [r["history"]["item"]["progress"] for r in records if r["type"] == "history"
                and "progress" in r["history"]["item"]]
    assert len(progress) >= 2 and 0 <= progress[0] < 1 and progress[-1] == 1 and progress == sorted(progress)

    (table_file,) = run_dir.glob("files/media/table/requests_*.table.json")
    table = json.loads(table_file.read_text())
    requests = pd.read_parquet(cell / "requests.parquet")
    assert table["columns"] == list(requests.columns)
    assert table["data"] == requests.astype(object).values.tolist()  # the per-request table, row for row

    assert not any(home.rglob("*")), sorted(map(str, home.rglob("*")))  # nothing outside the cell


def _assert_local_results_intact(out):
    assert out.status == "ran", out.error
    cell = Path(out.dir)
    assert json.loads((cell / "summary.json").read_text())["num_requests"] == 24
    assert (cell / "requests.parquet").stat().st_size > 0


@pytest.mark.wandb
def test_wandb_init_failure_keeps_local_results(tmp_path, monkeypatch):
    import wandb

    def broken_init(*a, **k):
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb, "init", broken_init)
    with pytest.warns(RuntimeWarning, match="W&B tracking start failed .*W&B is down"):
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=online"))
    _assert_local_results_intact(out)


@pytest.mark.wandb
def test_wandb_failure_mid_cell_keeps_local_results(tmp_path, monkeypatch):
    import wandb

    def broken_table(*a, **k):
        raise ValueError("cannot serialise")

    monkeypatch.setattr(wandb, "Table", broken_table)
    with pytest.warns(RuntimeWarning, match="log_result failed .*cannot serialise"):
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=offline"))
    _assert_local_results_intact(out)


def test_missing_wandb_package_keeps_local_results(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.warns(RuntimeWarning, match="W&B tracking start failed"):
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=offline"))
    _assert_local_results_intact(out)
    assert not (Path(out.dir) / "wandb" / "offline-run").exists()


def test_disabled_tracking_never_imports_wandb(tmp_path):
    code = (
        "import sys; from pathlib import Path; from repro.harness.cell import run_cell_spec; "
        "from tests.harness.helpers import tiny_spec; "
        f"out = run_cell_spec(tiny_spec(Path({str(tmp_path)!r}), 'policy=random_lru', 'tracking=disabled')); "
        "assert out.status == 'ran', out.error; assert 'wandb' not in sys.modules, 'wandb imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**__import__('os').environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
