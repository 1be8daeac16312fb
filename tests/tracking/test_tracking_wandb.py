"""W&B tracking: the offline runs, read back with W&B's own reader, hold what the local files hold."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.harness.cell import run_cell_spec
from repro.metrics import SUMMARY_KEYS
from repro.tracking.runs import ROOT_ID_FILE
from repro.tracking.series import SERIES_FILE, read_series
from tests.harness.helpers import ROOT, tiny_spec

ONE_CELL = ("policy=random_lru", "workload.request_rate=6.0")


def leet(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def records_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in leet("--json", str(run_dir)).splitlines() if line.strip()]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


def only_run(cell: Path) -> Path:
    (run_dir,) = sorted((cell / "wandb").glob("offline-run-*"))
    return run_dir


def history(recs: list[dict]) -> list[dict]:
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


def assert_history_is_the_series(recs: list[dict], cell: Path) -> pd.DataFrame:
    series, meta = read_series(cell / SERIES_FILE)
    hist = history(recs)
    assert len(hist) == len(series)  # every point of the file, no more
    for row, point in zip(series.to_dict("records"), hist):
        want = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        got = {k: v for k, v in point.items() if not k.startswith("_")}
        assert got.keys() == want.keys()
        assert all(same(got[k], float(want[k])) for k in want), (got, want)
    return series


@pytest.mark.wandb
def test_offline_run_holds_summary_series_names_tags_and_config(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(home))  # anything W&B writes outside the cell lands here
    results = tmp_path / "results"
    spec = tiny_spec(results, *ONE_CELL, "tracking=offline")
    out = run_cell_spec(spec)
    assert out.status == "ran", out.error

    cell = Path(out.dir)
    local = json.loads((cell / "summary.json").read_text())
    root = (results / ROOT_ID_FILE).read_text().strip()
    run_dir = only_run(cell)
    remote = json.loads(leet("--summary", "--json", str(run_dir)))
    assert remote["state"] == "finished" and remote["run_id"] == f"tiny-{spec.signature}-{root}"
    assert remote["name"] == "Random+LRU · gsp · 6 req/s · seed 0"
    for key in SUMMARY_KEYS:
        assert same(remote["summary"][key], local[key]), key
    assert remote["summary"]["provenance"]["signature"] == spec.signature
    config = remote["config"]
    assert config["signature"] == spec.signature
    assert config["workload.request_rate"] == 6.0 and config["cluster.num_workers"] == 2  # flattened
    assert not any(k.startswith(("tracking", "results_dir")) for k in config)

    recs = records_of(run_dir)
    (run_rec,) = [r["run"] for r in recs if r["type"] == "run"]
    assert run_rec["run_group"] == "tiny" and run_rec["job_type"] == "sim"
    for tag in ("workload:gsp", "policy:Random+LRU", "router:random", "eviction:lru", "model:llama31_8b",
                "hardware:l40", "seed:0", "backend:sim"):
        assert tag in run_rec["tags"]
    metrics = [r["metric"] for r in recs if r["type"] == "metric"]
    assert {"glob_name": "*", "step_metric": "sim_time_s", "options": {"defined": True, "step_sync": True}} in metrics

    series = assert_history_is_the_series(recs, cell)
    assert {"window/completed_rps", "window/hit_rate", "window/latency_p95_s", "window/ttft_p50_s",
            "in_flight/w0", "queue/w1", "kv_use/w1"} <= set(series.columns)
    assert series["completed"].iloc[-1] == local["num_requests"]
    assert not any(home.rglob("*")), sorted(map(str, home.rglob("*")))  # nothing outside the cell


@pytest.mark.wandb
def test_run_ids_unique_per_root_and_stable_per_cell(tmp_path):
    spec_a = tiny_spec(tmp_path / "a", *ONE_CELL, "tracking=offline")
    spec_b = tiny_spec(tmp_path / "b", *ONE_CELL, "tracking=offline")
    assert spec_a.signature == spec_b.signature
    ids = {}
    for name, spec in (("a", spec_a), ("b", spec_b)):
        cell = Path(run_cell_spec(spec).dir)
        ids[name] = json.loads(leet("--summary", "--json", str(only_run(cell))))["run_id"]
    assert ids["a"] != ids["b"]  # two results folders never share a run

    cell = Path(spec_a.results_dir) / "tiny" / spec_a.signature
    (cell / "summary.json").unlink()  # resubmitted cell: reruns into the same run id
    assert run_cell_spec(spec_a).status == "ran"
    assert json.loads(leet("--summary", "--json", str(only_run(cell))))["run_id"] == ids["a"]


@pytest.mark.wandb
def test_upload_rebuilds_runs_from_files_alone(tmp_path):
    results = tmp_path / "results"
    cells = []
    for rate in ("4.0", "6.0"):
        out = run_cell_spec(tiny_spec(results, "policy=random_lru", f"workload.request_rate={rate}"))
        assert out.status == "ran", out.error
        cells.append(Path(out.dir))
    before = [records_of(only_run(c)) for c in cells]
    for c in cells:
        shutil.rmtree(c / "wandb")
    # an old-style cell (no series file): summary-only run, name from the differences between cells
    (cells[1] / SERIES_FILE).unlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "repro.tracking.upload", str(results)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert "2 cell(s)" in res.stderr and "1 with time series, 1 summary only, 0 failed" in res.stderr
    after = [records_of(only_run(c)) for c in cells]

    def strip(recs):
        return [{k: v for k, v in r.items() if k != "num"} for r in recs if r["type"] in ("run", "history", "summary")]

    assert strip(after[0]) == strip(before[0])  # same run, rebuilt from the files
    assert history(after[1]) == []
    (run1,) = [r["run"] for r in after[1] if r["type"] == "run"]
    (run1_before,) = [r["run"] for r in before[1] if r["type"] == "run"]
    assert run1["run_id"] == run1_before["run_id"] and run1["display_name"] == "Random+LRU · gsp · 6 req/s · seed 0"

    bad = subprocess.run([sys.executable, "-m", "repro.tracking.upload", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "not a directory" in bad.stderr


@pytest.mark.wandb
def test_our_offline_run_reads_like_an_sdk_written_one(tmp_path, monkeypatch):
    """Same data through wandb.init/log/finish and through repro.tracking.wandb_file."""
    import wandb

    from repro.tracking.wandb_file import write_offline_run

    for var, sub in (("WANDB_CACHE_DIR", "c"), ("WANDB_CONFIG_DIR", "g"), ("WANDB_DATA_DIR", "d")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    cols = ["sim_time_s", "completed", "window/hit_rate", "kv_use/w0"]
    rows = [(0.0, 0, float("nan"), 0.0), (0.5, 3, 0.25, 0.5), (1.0, 7, 0.5, 0.75)]
    kw = dict(project="p", group="g", job_type="sim", name="A · b · seed 0", tags=["seed:0", "policy:A"])
    config, summary = {"workload.request_rate": 6.0, "seed": 0}, {"hit_rate": 0.5, "provenance": {"x": [1, 2]}}
    sdk = wandb.init(dir=str(tmp_path / "sdk"), mode="offline", id="sdkrun", config=config, **kw,
                     settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True))
    sdk.define_metric("sim_time_s")
    sdk.define_metric("*", step_metric="sim_time_s")
    for row in rows:
        sdk.log({c: v for c, v in zip(cols, row) if not (isinstance(v, float) and math.isnan(v))})
    sdk.summary.update(summary)
    sdk.finish()
    wandb.teardown()
    (sdk_dir,) = (tmp_path / "sdk" / "wandb").glob("offline-run-*")
    ours = write_offline_run(tmp_path / "ours", run_id="ourrun", entity=None, config=config, summary=summary,
                             time_key="sim_time_s", columns=cols, rows=rows, runtime=[0, 0.1, 0.2], **kw)

    def view(run_dir):
        recs = records_of(run_dir)
        (run,) = [r["run"] for r in recs if r["type"] == "run"]
        keep = ("display_name", "job_type", "project", "run_group", "tags")
        cfg = {k: v for k, v in run["config"]["update"].items() if k != "_wandb"}
        hist = [{k: v for k, v in h.items() if k not in ("_runtime", "_timestamp")} for h in history(recs)]
        metrics = [r["metric"] for r in recs if r["type"] == "metric"]
        info = json.loads(leet("--summary", "--json", str(run_dir)))
        summ = {k: v for k, v in info["summary"].items() if not k.startswith("_")}
        return {k: run[k] for k in keep}, cfg, hist, metrics, summ, info["state"]

    sdk_view, our_view = view(sdk_dir), view(ours)
    # the SDK's summary also holds the last logged values; ours keeps summary.json's keys only
    assert our_view[4] == summary and {k: sdk_view[4][k] for k in summary} == summary
    assert our_view[:4] == sdk_view[:4] and our_view[5] == sdk_view[5] == "finished"


def test_protobuf_encoding_matches_wandb_classes():
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    from repro.tracking import wandb_file as wf

    items = [("sim_time_s", "0.5"), ("kv_use/w0", "0.25"), ("_step", "300")]
    want = pb.Record(history=pb.HistoryRecord(item=[pb.HistoryItem(nested_key=[k], value_json=v) for k, v in items],
                                              step=pb.HistoryStep(num=300)))
    assert wf.history_record(300, items) == want.SerializeToString()
    want = pb.Record(metric=pb.MetricRecord(glob_name="*", step_metric="t", options=pb.MetricOptions(step_sync=True, defined=True)))
    assert wf.metric_record(glob_name="*", step_metric="t") == want.SerializeToString()
    want = pb.Record(summary=pb.SummaryRecord(update=[pb.SummaryItem(nested_key=["a"], value_json="{\"b\":1}")]))
    assert wf.summary_record([("a", "{\"b\":1}")]) == want.SerializeToString()
    # the fast per-row encoder gives the reference encoder's bytes, NaN cells left out
    cols = ["t", "x", "n"]
    rows = [(0.0, float("nan"), 3), (0.5, 1.5, 4), (1.0, float("inf"), 5)]
    fast = list(wf.history_records(cols, rows, runtime=[0.0, 0.1, 0.2], t0=100.0))
    slow = [wf.history_record(s, it) for s, it in wf.history_items(cols, rows, runtime=[0.0, 0.1, 0.2], t0=100.0)]
    assert fast == slow
    parsed = pb.Record()
    parsed.ParseFromString(fast[0])
    assert [i.nested_key[0] for i in parsed.history.item] == ["t", "n", "_step", "_runtime", "_timestamp"]


@pytest.mark.wandb
def test_records_longer_than_a_block_are_split_and_read_back(tmp_path):
    from repro.tracking.wandb_file import write_offline_run

    big = "x" * 100_000  # > 3 blocks of 32 KiB: first / middle / last chunks
    rows = [(float(i), float(i) ** 0.5) for i in range(3000)]
    run = write_offline_run(tmp_path, run_id="big", project="p", entity=None, group="g", job_type="sim", name="n",
                            tags=[], config={}, summary={"big": big}, time_key="t", columns=["t", "y"], rows=rows,
                            runtime=[0.0] * len(rows))
    info = json.loads(leet("--summary", "--json", str(run)))
    assert info["summary"]["big"] == big and info["state"] == "finished"
    assert [h["y"] for h in history(records_of(run))] == pytest.approx([r[1] for r in rows])


@pytest.mark.wandb
def test_live_cell_streams_points_over_wall_time(tmp_path):
    spec = tiny_spec(tmp_path, *ONE_CELL, "tracking=offline", "tracking.stream=true",
                     "backend.name=tests.tracking.live_backend", exp="tiny_fake")
    out = run_cell_spec(spec)
    assert out.status == "ran", out.error
    cell = Path(out.dir)
    recs = records_of(only_run(cell))
    hist = history(recs)
    streamed = [h for h in hist if "window/hit_rate" in h]
    assert [h["completed"] for h in streamed] == [0, 4, 8, 12, 16]
    times = [h["wall_time_s"] for h in hist]
    assert times == sorted(times) and all(t >= 0 for t in times)
    assert hist[-1]["progress"] == 1
    series, meta = read_series(cell / SERIES_FILE)  # the streamed points are kept with the results
    assert meta["time_key"] == "wall_time_s" and len(series) == len(hist)
    info = json.loads(leet("--summary", "--json", str(only_run(cell))))
    assert info["summary"]["num_requests"] == json.loads((cell / "summary.json").read_text())["num_requests"]


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
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=online", "tracking.stream=true"))
    _assert_local_results_intact(out)


def test_run_writer_failure_keeps_local_results(tmp_path, monkeypatch):
    from repro.tracking import wandb_file

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(wandb_file, "write_offline_run", broken)
    with pytest.warns(RuntimeWarning, match="log_result failed .*disk full"):
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=offline"))
    _assert_local_results_intact(out)
    assert (Path(out.dir) / SERIES_FILE).is_file()


def test_offline_tracking_of_a_simulated_cell_never_imports_wandb(tmp_path):
    code = (
        "import sys; from pathlib import Path; from repro.harness.cell import run_cell_spec; "
        "from tests.harness.helpers import tiny_spec; "
        f"out = run_cell_spec(tiny_spec(Path({str(tmp_path)!r}), 'policy=random_lru', 'tracking=offline')); "
        "assert out.status == 'ran', out.error; assert 'wandb' not in sys.modules, 'wandb imported'; "
        "assert list((Path(out.dir) / 'wandb').glob('offline-run-*/run-*.wandb'))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr


def test_disabled_tracking_never_imports_wandb_and_writes_no_series(tmp_path):
    code = (
        "import sys; from pathlib import Path; from repro.harness.cell import run_cell_spec; "
        "from tests.harness.helpers import tiny_spec; "
        f"out = run_cell_spec(tiny_spec(Path({str(tmp_path)!r}), 'policy=random_lru', 'tracking=disabled')); "
        "assert out.status == 'ran', out.error; assert 'wandb' not in sys.modules, 'wandb imported'; "
        f"assert not (Path(out.dir) / {SERIES_FILE!r}).exists() and not (Path(out.dir) / 'wandb').exists()"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr


def test_missing_wandb_package_keeps_local_results_of_a_live_cell(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.warns(RuntimeWarning, match="W&B tracking start failed"):
        out = run_cell_spec(tiny_spec(tmp_path, *ONE_CELL, "tracking=offline", "tracking.stream=true"))
    _assert_local_results_intact(out)
