"""schema_errors skips the top-level values that already passed (a cell whose every value passed is
not merged at all): the same verdict and message as a full merge into the schema, whatever it
saw before."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from repro.harness import validate
from repro.harness.validate import schema_errors
from tests.harness.test_harness_validate import fixture_compose, with_
from repro.harness.compose import resolve


def full_merge_errors(cfg: dict) -> list[str]:
    """The reference: the whole config merged into the schema, no memo."""
    try:
        OmegaConf.merge(validate._schema_node(), cfg)
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        key = getattr(exc, "full_key", None)
        return [f"{key}: {msg}" if key and key not in msg else msg]
    return []


@pytest.fixture(scope="module")
def good_cfg() -> dict:
    with fixture_compose() as c:
        return resolve(c(["exp=tiny"]))


def variants(good: dict) -> list[dict]:
    out = [good, with_(good, "cluster.num_worker", 3), with_(good, "tracking.max_points", "maybe"),
           with_(good, "surprise", 1), with_(good, "seed", "zero")]
    for k in sorted(good):  # open mappings (workload, router, ...) and typed ones (cluster, tracking)
        if isinstance(good.get(k), dict):
            out.append(with_(good, k, 7))  # not a mapping
            out.append(with_(good, k, {**good[k], 1: "int key"}))
            out.append(with_(good, k, {**good[k], "extra": 3.0}))
    return out


@pytest.mark.parametrize("warm", [False, True])
def test_memo_gives_the_full_merge_verdict(good_cfg, warm):
    validate._passed.clear()
    cases = variants(good_cfg)
    if warm:  # every good section seen first: later cells merge them as {}
        assert schema_errors(copy.deepcopy(good_cfg)) == []
        assert validate._passed
    for cfg in cases + cases[::-1]:  # and again, with whatever the first pass left in the memo
        assert schema_errors(cfg) == full_merge_errors(cfg), cfg


def test_a_cell_whose_every_value_passed_is_not_merged(good_cfg, monkeypatch):
    validate._passed.clear()
    assert schema_errors(copy.deepcopy(good_cfg)) == []
    merges = []
    real = OmegaConf.merge
    monkeypatch.setattr(OmegaConf, "merge", lambda *a: merges.append(a) or real(*a))
    assert schema_errors(copy.deepcopy(good_cfg)) == [] and merges == []
    other = with_(good_cfg, "seed", 7)
    assert schema_errors(other) == [] and len(merges) == 1  # a new value: merged, the passed mappings as {}
    assert all(v == {} for k, v in merges[0][1].items() if isinstance(good_cfg[k], dict))
