"""repro.confutil: the one to_plain, get_path and flatten every layer shares."""

from __future__ import annotations

from omegaconf import OmegaConf

from repro.confutil import flatten, get_path, to_plain


def test_to_plain_resolves_configs_and_passes_anything_else_through():
    cfg = OmegaConf.create({"a": 1, "b": "${a}", "l": [{"x": "${a}"}], "d": {}})
    assert to_plain(cfg) == {"a": 1, "b": 1, "l": [{"x": 1}], "d": {}}
    assert type(to_plain(cfg)["l"]) is list
    assert to_plain(OmegaConf.create([1, "${0}"])) == [1, 1]
    plain = {"a": (1, 2)}
    assert to_plain(plain) is plain  # not copied: callers that edit the result copy it themselves
    assert to_plain(None) is None and to_plain(3) == 3


def test_get_path():
    cfg = {"a": {"b": {"c": 3}}, "x": 1}
    assert get_path(cfg, "a.b.c") == 3 and get_path(cfg, "a.z", 7) == 7 and get_path(cfg, "x.y") is None


def test_flatten_keeps_lists_and_empty_mappings_as_leaves():
    cfg = {"w": {"rate": 8.0, "stand_in": {}, "ids": [1, 2]}, "seed": 0}
    assert flatten(cfg) == {"w.rate": 8.0, "w.stand_in": {}, "w.ids": [1, 2], "seed": 0}
    assert flatten(OmegaConf.create({"a": {"b": 1}})) == {"a.b": 1}
    assert flatten({}) == {}
