"""A backend gets a DictConfig unless it declares PLAIN_CONFIG; then a plain copy of its own."""

from __future__ import annotations

from helpers import run_inprocess

from repro.backends import get_backend


def test_which_backends_take_plain_configs():
    assert get_backend("sim").plain_config and get_backend("theory").plain_config
    assert not get_backend("sglang").plain_config  # its orchestration takes a DictConfig
    assert not get_backend("tests.harness.fake_backend").plain_config  # reads cfg.workload.num_queries


def test_a_plain_config_backend_gets_its_own_copy(tmp_path, monkeypatch):
    code = run_inprocess(tmp_path, "+exp=tiny_fake", "backend.name=tests.harness.plain_backend", "n_jobs=1",
                         "tracking.mode=disabled", monkeypatch=monkeypatch)
    assert code == 0
    configs = list(tmp_path.glob("tiny_fake/*/config.yaml"))
    assert configs and all((c.parent / "summary.json").is_file() for c in configs)
    for c in configs:
        for name in ("config.yaml", "summary.json"):
            assert "changed_by_the_backend" not in (c.parent / name).read_text()
