"""A cell finished in another experiment's folder (same signature) is taken from its files, not
run again (repro.harness.cell._finished_twin / _adopt), and the pool never runs two twins at once."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import deque
from pathlib import Path

import pytest

from repro.harness import pool
from repro.harness.cell import run_cell_spec
from repro.results.store import CellStore
from repro.tracking.series import SERIES_FILE
from tests.harness.helpers import tiny_spec

CELL = ("policy=random_lru", "workload.request_rate=6.0")
SAME_FILES = ("summary.json", "requests.parquet", "requests.sha256", SERIES_FILE, "fingerprint.json")


def twin_of(spec, exp: str = "tiny_other", label: str = "workload.request_rate=6.0"):
    """The same cell as another experiment holds it: its own name and swept keys, same signature."""
    return dataclasses.replace(spec, exp_name=exp, label=label, config={**spec.config, "exp_name": exp})


def files(cell_dir: str | Path) -> dict[str, bytes]:
    return {n: (Path(cell_dir) / n).read_bytes() for n in SAME_FILES if (Path(cell_dir) / n).exists()}


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))


def computed(tmp_path: Path, spec) -> dict[str, bytes]:
    """The twin computed on its own (no other experiment in its results folder)."""
    alone = tmp_path / "alone"
    spec = dataclasses.replace(spec, results_dir=str(alone), config={**spec.config, "results_dir": str(alone)})
    out = run_cell_spec(spec)
    assert out.status == "ran" and "reused_from" not in out.extra, out.error
    return files(out.dir)


def test_a_finished_twin_is_taken_and_gives_the_files_computing_it_gives(tmp_path, home):
    results = tmp_path / "results"
    first = run_cell_spec(tiny_spec(results, *CELL, "tracking=offline"))
    assert first.status == "ran", first.error
    second = twin_of(tiny_spec(results, *CELL, "tracking=offline"))
    out = run_cell_spec(second)
    assert out.status == "copied" and out.extra["reused_from"] == first.dir, out.error
    got = files(out.dir)
    assert set(got) == set(SAME_FILES)
    assert got == computed(tmp_path, second)  # the series too: its meta holds this cell's swept keys
    assert got[SERIES_FILE] != files(first.dir)[SERIES_FILE]  # ... which differ from the first's
    timings = json.loads((Path(out.dir) / "timings.json").read_text())
    assert timings["harness"]["reused_from"] == f"tiny/{first.signature}"
    assert "exp_name: tiny_other" in (Path(out.dir) / "config.yaml").read_text()
    assert len(list((Path(out.dir) / "wandb").glob("offline-run-*/run-tiny_other-*.wandb"))) == 1
    again = run_cell_spec(second)
    assert again.status == "skipped"  # finished and fresh like any computed cell


def test_a_twin_is_not_taken_when_its_files_cannot_be_trusted_or_reproduced(tmp_path, home):
    results = tmp_path / "results"
    spec = tiny_spec(results, *CELL, "tracking=offline")
    first = Path(run_cell_spec(spec).dir)

    def runs_itself(twin) -> bool:
        out = run_cell_spec(twin)
        assert out.status == ("copied" if "reused_from" in out.extra else "ran"), out.error
        shutil.rmtree(results / twin.exp_name)  # not a twin for the next case
        return "reused_from" not in out.extra

    store = CellStore.at(first)

    def reseal() -> None:  # an edit the cell's own manifest agrees with: not damage but what it says
        store.finish(store.summary_path.read_bytes())

    # stale twin: made by other code
    fp_bytes = (first / "fingerprint.json").read_bytes()
    fp = json.loads(fp_bytes)
    (first / "fingerprint.json").write_text(json.dumps({**fp, "fingerprint": "0" * 64, "code": {"x.py": "0"}}))
    reseal()
    assert runs_itself(twin_of(spec, "stale_twin"))
    (first / "fingerprint.json").write_bytes(fp_bytes)
    reseal()
    # damaged twin: its summary changed after it was finished
    summary = (first / "summary.json").read_bytes()
    (first / "summary.json").write_bytes(summary.replace(b'"hit_rate": ', b'"hit_rate": 0.9512345, "x": '))
    assert runs_itself(twin_of(spec, "damaged_twin"))
    (first / "summary.json").write_bytes(summary)
    # its requests no longer match their hash
    good = (first / "requests.parquet").read_bytes()
    (first / "requests.parquet").write_bytes(good[:-8] + b"\0" * 8)
    assert runs_itself(twin_of(spec, "corrupt_twin"))
    (first / "requests.parquet").write_bytes(good)
    # finished without a series while this cell tracks one
    (first / SERIES_FILE).rename(tmp_path / "series.bak")
    reseal()
    assert runs_itself(twin_of(spec, "untracked_twin"))
    (tmp_path / "series.bak").rename(first / SERIES_FILE)
    reseal()
    assert not runs_itself(twin_of(spec, "good_twin"))


def test_an_experiment_can_measure_its_own_cells(tmp_path):
    results = tmp_path / "results"
    spec = tiny_spec(results, *CELL, "tracking=disabled")
    assert run_cell_spec(spec).status == "ran"
    own = twin_of(tiny_spec(results, *CELL, "tracking=disabled", "reuse_twins=false"))
    assert own.signature == spec.signature  # the switch is not part of the cell's identity
    out = run_cell_spec(own)
    assert out.status == "ran" and "reused_from" not in out.extra


def test_a_backend_that_is_not_deterministic_is_always_run(tmp_path):
    results = tmp_path / "results"
    spec = tiny_spec(results, *CELL, "tracking=disabled", exp="tiny_fake")  # the fake backend declares nothing
    assert run_cell_spec(spec).status == "ran"
    out = run_cell_spec(twin_of(spec))
    assert out.status == "ran" and "reused_from" not in out.extra


def test_the_pool_holds_a_twin_back_while_its_cell_runs():
    a = pool.CellSpec(0, "a", {}, "sig1", "/r", "exp1")
    twin = pool.CellSpec(1, "a", {}, "sig1", "/r", "exp2")
    other_folder = pool.CellSpec(2, "a", {}, "sig1", "/elsewhere", "exp2")
    b = pool.CellSpec(3, "b", {}, "sig2", "/r", "exp2")
    worker = type("W", (), {"spec": a})()
    idle = type("W", (), {"spec": None})()
    pending = deque([twin, other_folder, b])
    assert pool._next_spec(pending, [worker, idle]) is other_folder
    assert pool._next_spec(pending, [worker, idle]) is b
    assert pool._next_spec(pending, [worker, idle]) is None and list(pending) == [twin]
    worker.spec = None
    assert pool._next_spec(pending, [worker, idle]) is twin


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_sweep_computes_each_signature_once(tmp_path, n_jobs):
    results = tmp_path / "results"
    specs = []
    for exp in ("tiny", "tiny_b", "tiny_c"):
        for rate in ("6.0", "12.0"):
            s = tiny_spec(results, "policy=random_lru", f"workload.request_rate={rate}", "tracking=disabled")
            specs.append(dataclasses.replace(twin_of(s, exp, f"workload.request_rate={rate}"), index=len(specs)))
    outs = []
    pool.run_cells(specs, n_jobs, outs.append)
    assert all(o.status == ("copied" if "reused_from" in o.extra else "ran") for o in outs), [o.error for o in outs]
    computed_here = [o for o in outs if "reused_from" not in o.extra]
    assert sorted(o.signature for o in computed_here) == sorted({s.signature for s in specs})
    by_sig = {o.signature: files(o.dir) for o in computed_here}
    for o in outs:
        assert files(o.dir) == by_sig[o.signature]

