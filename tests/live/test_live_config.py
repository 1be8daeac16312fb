"""The live backend's typed config (repro/backends/sglang/config.py): each default once, equal to
what conf/backend/sglang.yaml spells out, unknown keys refused, and the same plan whether a key is
written out or left to its default."""

from __future__ import annotations

import dataclasses

import pytest

from repro.backends.sglang import config as live_config
from repro.backends.sglang.config import (BackendConfig, RouterServiceConfig, RouterServiceSection, Timeouts,
                                          backend_config_errors)

from live_helpers import hardware_cfg, load_yaml, model_cfg, need_parts


def test_the_yaml_spells_out_exactly_the_typed_defaults():
    yaml_backend = load_yaml("backend/sglang.yaml")
    assert dataclasses.asdict(BackendConfig()) == yaml_backend
    assert dataclasses.asdict(BackendConfig.from_mapping(yaml_backend)) == yaml_backend
    assert backend_config_errors(yaml_backend) == []


def test_process_configs_take_their_defaults_from_the_sections():
    rs = RouterServiceConfig(worker_urls=["http://127.0.0.1:1"])
    section = dataclasses.asdict(RouterServiceSection())
    assert {k: getattr(rs, k) for k in section} == section
    # the router's connect timeout is the cell's timeouts.connect_s (it was 5 s here, 10 s in the config)
    assert rs.connect_timeout_s == Timeouts.connect_s == load_yaml("backend/sglang.yaml")["timeouts"]["connect_s"]
    assert rs.request_timeout_s == Timeouts.request_s
    from repro.backends.sglang.client import ClientConfig

    assert (ClientConfig().connect_timeout_s, ClientConfig().request_timeout_s) == (Timeouts.connect_s,
                                                                                    Timeouts.request_s)


def test_unknown_keys_and_bad_shapes_are_named():
    errs = backend_config_errors({"colour": 1, "timeouts": {"request": 5, "cell_s": 0}, "client": [1]})
    assert any("backend: unknown keys ['colour']" in e for e in errs), errs
    assert any("backend.timeouts: unknown keys ['request']" in e for e in errs), errs
    assert any("backend.timeouts.cell_s must be a number > 0" in e for e in errs), errs
    assert any("backend.client must be a mapping" in e for e in errs), errs
    assert backend_config_errors(None) == [] and backend_config_errors("x") == ["backend must be a mapping, got str"]
    with pytest.raises(ValueError, match=r"backend.emulator: unknown keys \['falt'\]"):
        BackendConfig.from_mapping({"emulator": {"falt": "hang"}})
    partial = BackendConfig.from_mapping({"emulate": True, "timeouts": {"request_s": 30}})
    assert partial.emulate and partial.timeouts.request_s == 30 and partial.timeouts.connect_s == Timeouts.connect_s
    assert set(live_config.SECTION_KEYS) == set(live_config.SECTIONS) and "server" in live_config.BACKEND_KEYS


def _cell(backend: dict) -> dict:
    return {
        "seed": 0,
        "model": model_cfg(),
        "hardware": hardware_cfg(),
        "cluster": {"num_workers": 2, "mem_fraction": 0.9, "kv_cache_tokens": None, "scheduler": {}},
        "router": {"_target_": "repro.routing.RandomRouter", "name": "random"},
        "eviction": {"name": "lru", "granularity": "node"},
        "backend": backend,
    }


@pytest.mark.parametrize("emulate", [True, False])
def test_a_plan_is_the_same_with_keys_written_out_or_left_to_their_defaults(tmp_path, monkeypatch, emulate):
    need_parts()
    from repro.backends.sglang import orchestrate
    from repro.backends.assembly import SeedPlan

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    full = {**load_yaml("backend/sglang.yaml"), "emulate": emulate, "placement": "local"}
    minimal = {"name": "sglang", "emulate": emulate, "placement": "local"}
    plans = [orchestrate.plan_cell(_cell(b), [10_000, 10_000], SeedPlan.spawn(0, 2), tmp_path, ports=[1, 2, 3])
             for b in (full, minimal)]
    a, b = (p.describe() for p in plans)
    assert a == b
    assert plans[0].router.config == plans[1].router.config
    assert [w.config for w in plans[0].workers] == [w.config for w in plans[1].workers]
    assert plans[0].router.config["service"]["connect_timeout_s"] == 10.0
    with pytest.raises(orchestrate.OrchestrationError, match=r"unknown keys \['colour'\]"):
        orchestrate.plan_cell(_cell({**minimal, "colour": "red"}), [1, 1], SeedPlan.spawn(0, 2), tmp_path,
                              ports=[1, 2, 3])


@pytest.mark.parametrize("module, what", [("repro.backends.sglang.router_service", "router service"),
                                          ("repro.backends.sglang.emulated_worker", "emulated worker")])
def test_both_server_command_lines_refuse_a_bad_config_with_exit_code_2(tmp_path, capsys, module, what):
    import importlib

    main = importlib.import_module(module).main
    bad = tmp_path / "bad.json"
    bad.write_text('{"service": {"worker_urls": ["http://127.0.0.1:1"]}, "colour": 1, "worker_id": 0}')
    for path in (tmp_path / "missing.json", bad):
        assert main(["--config", str(path), "--port", "1"]) == 2
        err = capsys.readouterr().err
        assert f"ERROR: {what}: bad config {path}: " in err, err
