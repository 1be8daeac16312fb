"""The replayer's CLI and library entry: output keys, the paper's numbers, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro.kvcache import CapacityError
from repro.kvcache.replay import main, replay
from repro.theory import theorem4_trace

ROOT = Path(__file__).resolve().parents[2]


def write_trace(path, paths):
    path.write_text("".join(json.dumps({"tokens": [int(t) for t in p]}) + "\n" for p in paths))
    return str(path)


def run_cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_output_has_required_keys(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3]])
    rc, out, err = run_cli(capsys, "--trace", trace, "--capacity", 4, "--policy", "rlt", "--seed", 3)
    assert rc == 0, err
    res = json.loads(out)
    for key in ("misses", "hits", "evicted_tokens", "phases", "policy", "capacity", "seed", "granularity", "batch"):
        assert key in res
    assert res["policy"] == "rlt" and res["capacity"] == 4 and res["seed"] == 3
    assert res["hits"] + res["misses"] == 10
    assert res["granularity"] == "token" and res["batch"] == 1


@pytest.mark.parametrize("B, L", [(8, 3), (12, 5), (20, 2)])
def test_cli_theorem4_lru_and_opt_per_phase(tmp_path, capsys, B, L):
    x = B - L + 1
    trace = write_trace(tmp_path / "thm4.jsonl", theorem4_trace(B, L, 12 * x))
    for policy, want in (("lru", x), ("opt", 1)):
        rc, out, err = run_cli(capsys, "--trace", trace, "--capacity", B, "--policy", policy, "--per-phase")
        assert rc == 0, err
        res = json.loads(out)
        assert res["phases"] == 12
        assert res["steady_misses_per_phase"] == want
        assert all(m == want for m in res["misses_by_phase"][1:-1])


def test_cli_batched(tmp_path, capsys):
    trace = write_trace(tmp_path / "b.jsonl", [[1, 2], [1, 3], [4], [1, 2]])
    rc, out, err = run_cli(capsys, "--trace", trace, "--capacity", 4, "--policy", "lru", "--batch", 2, "--granularity", "node")
    assert rc == 0, err
    assert json.loads(out)["batch"] == 2


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"tokens": [1, 2]}\n{"tokens": [1, 2\n', "b.jsonl:2: not valid JSON"),
        ('{"tokens": [1, 2]}\n[1, 2]\n', "b.jsonl:2: expected an object"),
        ('{"tokens": []}\n', "b.jsonl:1: empty token list"),
        ('{"tokens": [1, "a"]}\n', "b.jsonl:1: tokens must be integers"),
        ('{"tokens": [1, 4294967296]}\n', "b.jsonl:1: token ids must fit in int32"),
        ("\n\n", "no paths"),
        ('{"tokens": [1, 2, 3, 4, 5, 6]}\n', "path 0 has 6 tokens but the capacity is 4"),
    ],
)
def test_cli_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    (tmp_path / "b.jsonl").write_text(content)
    rc, out, err = run_cli(capsys, "--trace", tmp_path / "b.jsonl", "--capacity", 4, "--policy", "lru")
    assert rc == 2 and out == ""
    assert message in err and err.startswith("error: ")


def test_cli_batch_group_too_large(tmp_path, capsys):
    trace = write_trace(tmp_path / "g.jsonl", [[1, 2, 3], [4, 5, 6]])
    rc, out, err = run_cli(capsys, "--trace", trace, "--capacity", 5, "--policy", "lru", "--batch", 2)
    assert rc == 2 and "batch group of paths 0..1 holds 6 distinct tokens > capacity 5" in err


def test_cli_missing_file_and_bad_choice(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "--trace", tmp_path / "nope.jsonl", "--capacity", 4, "--policy", "lru")
    assert rc == 2 and "No such file" in err
    with pytest.raises(SystemExit):
        main(["--trace", "x", "--capacity", "4", "--policy", "fifo"])


def test_replay_library_errors_before_any_work():
    with pytest.raises(CapacityError, match="path 1 has 4 tokens"):
        replay([[1], [1, 2, 3, 4]], 3)
    with pytest.raises(ValueError, match="path 0 is empty"):
        replay([[]], 3)
    with pytest.raises(ValueError, match="capacity"):
        replay([[1]], 0)
    with pytest.raises(ValueError, match="policy"):
        replay([[1]], 3, "fifo")
    with pytest.raises(ValueError, match="batch"):
        replay([[1]], 3, batch=0)


def test_module_entry_point_runs(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [[1, 2], [3]])
    out = subprocess.run(
        [sys.executable, "-m", "repro.kvcache.replay", "--trace", trace, "--capacity", "2", "--policy", "opt"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )
    res = json.loads(out.stdout)
    assert res["misses"] == 3 and res["hits"] == 0 and res["evicted_tokens"] == 1
