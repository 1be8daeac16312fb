"""Run identity from a cell's files: names, tags, flat config, root ids."""

from __future__ import annotations

import threading

from repro.tracking import runs

CFG = {
    "policy_name": "LBGR+RLT", "seed": 0, "exp_name": "fig5", "results_dir": "/x",
    "workload": {"name": "gsp", "request_rate": 12.0, "num_queries": 1024},
    "router": {"name": "lbgr"}, "eviction": {"name": "rlt"}, "model": {"name": "llama31_8b"},
    "hardware": {"name": "l40"}, "backend": {"name": "sim"}, "cluster": {"num_workers": 4},
    "tracking": {"mode": "offline"},
}


def test_display_name_and_tags():
    assert runs.display_name(CFG, runs.swept_from_label("policy=lbgr_rlt workload.request_rate=12.0")) == \
        "LBGR+RLT · gsp · 12 req/s · seed 0"
    assert runs.display_name(CFG, {"cluster.num_workers": "4", "tracking.mode": "offline"}) == \
        "LBGR+RLT · gsp · 12 req/s · 4 workers · seed 0"
    assert runs.tags(CFG, ["mine"]) == ["workload:gsp", "policy:LBGR+RLT", "router:lbgr", "eviction:rlt",
                                        "model:llama31_8b", "hardware:l40", "seed:0", "backend:sim", "protocol:text",
                                        "mine"]
    assert "protocol:artifact" in runs.tags({**CFG, "protocol": {"name": "artifact"}})


def test_flat_config_leaves_out_paths_and_tracking():
    flat = runs.flat_config(CFG, "abc")
    assert flat["signature"] == "abc" and flat["workload.request_rate"] == 12.0 and flat["cluster.num_workers"] == 4
    assert not any(k.startswith(("tracking", "results_dir")) for k in flat)


def test_swept_keys_from_sibling_configs():
    other = {**CFG, "workload": {**CFG["workload"], "request_rate": 4.0}, "policy_name": "Random+LRU",
             "router": {"name": "random"}}
    assert runs.swept_from_siblings({"a": CFG, "b": other}) == {"workload.request_rate", "policy_name"}
    sharegpt = {**CFG, "workload": {"name": "sharegpt", "request_rate": 12.0, "num_queries": 999},
                "cluster": {"num_workers": 4, "kv_cache_tokens": 1}}
    assert runs.swept_from_siblings({"a": CFG, "b": sharegpt}) == {"workload.name"}


def test_root_id_is_created_once_and_shared_by_racing_processes(tmp_path):
    got = []
    threads = [threading.Thread(target=lambda: got.append(runs.root_id(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and (tmp_path / runs.ROOT_ID_FILE).read_text().strip() == got[0]
    assert runs.root_id(tmp_path / "other") != got[0]
    assert len(runs.run_id("fig14_decay_interval" * 3, "0123456789ab", got[0])) <= 64


def test_bad_tracking_settings_are_config_errors():
    import copy

    from repro.harness.validate import value_errors
    from tests.harness.helpers import compose_fixture

    good = compose_fixture(["exp=tiny"])
    assert value_errors(good) == []
    for key, value, fragment in (("stream", "yes", "tracking.stream"), ("max_points", 2, "tracking.max_points")):
        bad = copy.deepcopy(good)
        bad["tracking"][key] = value
        assert any(fragment in e for e in value_errors(bad)), key
