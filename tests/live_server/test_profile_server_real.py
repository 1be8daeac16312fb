"""repro.analysis.profile_server against a real SGLang CPU server it starts itself (marker sglang_server):
a reduced point set, one rep; the written profile loads, the cost model fits it, and no process is left."""

from __future__ import annotations

import pytest

from repro.analysis import profile_server as ps
from repro.costmodel.profile import load_profile
from tests.live_server.conftest import server_python, wait_no_orphans

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(1800)]


def test_profile_from_a_started_server(tmp_path, monkeypatch, test_mark):
    python = server_python()
    monkeypatch.setattr(ps, "PREFILL_NEW", (16, 256))
    monkeypatch.setattr(ps, "PREFILL_CACHED", (0, 256))
    monkeypatch.setattr(ps, "DECODE_BATCH", (1, 4))
    monkeypatch.setattr(ps, "DECODE_CONTEXT", (64,))
    monkeypatch.setattr(ps, "HEAD_ROWS", (1, 4))
    out = tmp_path / "p.json"
    assert ps.main(["--python", python, "--out", str(out), "--reps", "1", "--decode-tokens", "8",
                    "--kv-tokens", "4096", "--port", "31197"]) == 0
    assert wait_no_orphans(test_mark) == []
    prof = load_profile(out)
    pm = prof.models["tiny-llama"]
    assert {(p.new_tokens, p.cached_tokens) for p in pm.prefill} == {(16, 0), (256, 0), (16, 256), (256, 256)}
    assert {(d.batch, d.context) for d in pm.decode} == {(1, 64), (4, 64)}
    assert all(p.per_layer_s > 0 for p in pm.prefill + pm.decode) and pm.layers_total == 2
    assert set(prof.repeats) == {"tiny-llama"}
    assert prof.ceilings["bf16_gemm_tflops"] > 0 and prof.ceilings["copy_tb_s"] > 0
