"""repro.confutil: the one to_plain, get_path and flatten every layer shares."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from repro import confutil
from repro.confutil import PROJECT_ROOT, flatten, get_path, to_plain, to_yaml


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


def _omegaconf_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(cfg), sort_keys=True)


# Scalars that YAML reads as something else when unquoted, long and multi-line text (the emitter
# folds at 80 columns), unicode, the odd floats, nested lists and mappings.
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["true", "False", "null", "~", "1", "1.5", "1e3", ".inf", "0x1F", "", " ", "a: b", "- x",
                     "#c", "'q'", '"d"', "yes", "on", "2026-12-01", "${a}", "\n", "x\ny", "tab\tt", "é ü 中文"]),
    st.text(max_size=120), st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
)
_keys = st.text(min_size=1, max_size=12).filter(lambda k: not k.startswith("_"))
_configs = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(_keys, inner, max_size=5)), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _configs, max_size=6))
def test_to_yaml_is_omegaconfs_text(cfg):
    try:
        want = _omegaconf_yaml(cfg)
    except Exception:  # OmegaConf refuses it (e.g. an interpolation-looking string it resolves): not a config
        return
    assert to_yaml(cfg) == want


def test_to_yaml_on_every_committed_config_and_without_libyaml(monkeypatch):
    files = sorted((PROJECT_ROOT / "results").glob("*/*/config.yaml"))[:400]
    assert files, "no committed results to compare with"
    for f in files:
        cfg = yaml.safe_load(f.read_text())
        assert to_yaml(cfg) == _omegaconf_yaml(cfg), f
    assert confutil._yaml_dumper().__name__ == "OmegaConfCDumper"  # the fast path is what ran
    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    fallback = confutil._yaml_dumper.__wrapped__()  # what a PyYAML without libyaml gets (uncached)
    assert fallback is not confutil._yaml_dumper() and issubclass(fallback, yaml.Dumper)
