"""The server profile's writer (repro/analysis/profile_server.py) against its reader (repro/costmodel/profile.py)."""

from __future__ import annotations

import json

import pytest

from repro.analysis import profile_server as ps
from repro.costmodel.profile import load_profile, run_to_run_spread

MODEL = {"profile_name": "tiny-test", "architecture": {"num_layers": 2, "hidden_size": 128, "vocab_size": 1000}}
HEAD = {"1": 0.001, "2": 0.0012, "4": 0.0014, "8": 0.002, "16": 0.003}


def _pass(scale: float) -> dict:
    prefill = [{"new_tokens": n, "cached_tokens": c, "step_s": scale * (0.02 + n * 1e-5 + c * 2e-6), "runs_s": []}
               for c in ps.PREFILL_CACHED for n in ps.PREFILL_NEW]
    decode = [{"batch": b, "context": L, "step_s": scale * (0.005 + b * 2e-4 + b * L * 1e-7), "runs_s": []}
              for L in ps.DECODE_CONTEXT for b in ps.DECODE_BATCH]
    return {"prefill": prefill, "decode": decode}


def _torch(gemm: float) -> dict:
    return {"head": HEAD, "bf16_gemm_tflops": gemm, "copy_tb_s": 0.05, "torch": "x", "threads": 1}


def test_written_profile_reads_back(tmp_path):
    passes = [_pass(1.0), _pass(1.1)]
    prof = ps.build_profile(passes, [_torch(0.4), _torch(0.5)], MODEL, url="u", load="1 2 3", reps=3,
                            decode_tokens=16)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    loaded = load_profile(path)
    pm = loaded.models["tiny-test"]
    assert pm.layers_total == 2
    assert len(pm.prefill) == len(ps.PREFILL_NEW) * len(ps.PREFILL_CACHED)
    assert len(pm.decode) == len(ps.DECODE_BATCH) * len(ps.DECODE_CONTEXT)
    p0 = passes[0]["prefill"][0]
    got = next(p for p in pm.prefill if (p.new_tokens, p.cached_tokens) == (p0["new_tokens"], p0["cached_tokens"]))
    assert got.per_layer_s == pytest.approx((p0["step_s"] - HEAD["1"]) / 2)  # one sampled row
    d = passes[0]["decode"][-1]
    got = next(p for p in pm.decode if (p.batch, p.context) == (d["batch"], d["context"]))
    assert got.per_layer_s == pytest.approx((d["step_s"] - HEAD[str(d["batch"])]) / 2)  # one row per request
    assert [h.rows for h in pm.head] == sorted(int(k) for k in HEAD)
    assert loaded.ceilings["bf16_gemm_tflops"] == 0.5  # the best run
    # the second pass is the held-out repeat: 10 % slower steps, more than 10 % per layer (head subtracted)
    spread = run_to_run_spread(loaded)["tiny-test"]
    assert 0.1 < spread["prefill"] < 0.2 and 0.1 < spread["decode"] < 0.2
    assert prof["info"]["request_overhead_s"][0] == pytest.approx(
        passes[0]["prefill"][0]["step_s"] - passes[0]["decode"][0]["step_s"])
    assert "per_layer_s = (step - LM head" in prof["info"]["method"]


def test_step_shorter_than_its_head_is_an_error():
    raw = _pass(1.0)
    raw["decode"][0]["step_s"] = HEAD["1"] * 0.5
    with pytest.raises(ps.ProfileError, match="not longer than its LM head"):
        ps.profile_entry("m", 2, raw, {int(k): v for k, v in HEAD.items()})


def test_decode_step_from_two_batches():
    # one token after 0.10-0.12 s (median 0.11), 11 tokens after 0.30-0.34 s (median 0.31): 10 steps in 0.2 s
    assert ps.decode_step([0.10, 0.11, 0.12], [0.30, 0.31, 0.34], 11) == pytest.approx(0.02)
    with pytest.raises(ps.ProfileError, match="at least 2"):
        ps.decode_step([0.1], [0.1], 1)


def test_bad_arguments_fail_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ps.main(["--python", str(tmp_path / "nope"), "--out", str(tmp_path / "o.json")])
    assert "not an executable file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ps.main(["--python", "/bin/sh", "--out", str(tmp_path / "o.json"), "--kv-tokens", "100"])
    assert "--kv-tokens 100" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
