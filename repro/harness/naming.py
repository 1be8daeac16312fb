"""The results folder of an override run: `+exp=fig5_request_rate cluster.kv_cache_tokens=16384`
writes to results/fig5_request_rate+kv16384/, never into the paper's results/fig5_request_rate/.

Rule (docs/ARCHITECTURE.md "Override runs"): a run of a project experiment (conf/exp/NAME.yaml)
whose command line changes a result-affecting setting goes to `NAME+<part>+<part>...`, one part
per changed key, sorted by key (so the order on the command line does not matter):

- not a change: the keys of EXEMPT_KEYS (where results go, how many processes, tracking, Hydra's
  own, and `protocol`: both protocols' cells belong in the paper folder side by side); a value of a
  key the experiment sweeps that is one of the swept values (`seed=0`, `policy=lbgr_rlt`,
  `workload.request_rate=8`: a subset of the paper's grid); the value the experiment already has
  (`workload=gsp` for fig5);
- a part: the key's short name from ALIASES (else its last component), then the value(s):
  `kv16384`, `rate24,28`, `sharegpt` (a config group shows its option only), `generation-le_0_2_3`,
  `no-decay_interval_s` for `~key`. Numbers are written plainly (8.0 -> 8). Characters other than
  letters, digits, `.`, `_`, `-` and `,` become `_`;
- `hydra.sweeper.params.<key>=` (a changed grid): the values the grid gained over the experiment's
  own, e.g. `+mine_lru` for `hydra.sweeper.params.policy=${systems:mine_lru}`;
- a name longer than MAX_PARTS_CHARS keeps its first parts and ends in `+h<8 hex>` of the full
  text, so it stays short, unique and the same for the same command line.

`exp_name=` or `results_dir=` on the command line is the user's own choice: no derived name.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from repro.confutil import CONF_DIR

# The experiment itself, where results go, Hydra's own settings: never a change, whatever the list.
_NOT_SETTINGS = ("exp", "exp_name", "results_dir", "hydra")
# Keys (and their sub-keys / group paths) that never make a run an override run (the default list).
EXEMPT_KEYS: tuple[str, ...] = (
    "n_jobs",
    "keep_stale",
    "reuse_twins",
    "tracking",
    "local",
    "protocol",  # text / artifact: the paper folder holds both protocols' cells
)
NAMED_BY_USER = ("exp_name", "results_dir")
# Short names of the knobs people change most (the figures' KNOB_LABELS say what they mean).
ALIASES: dict[str, str] = {
    "cluster.kv_cache_tokens": "kv",
    "cluster.num_workers": "workers",
    "cluster.mem_fraction": "mem",
    "cluster.scheduler.max_running_requests": "batch",
    "cluster.scheduler.schedule_policy": "sched",
    "workload.request_rate": "rate",
    "workload.num_queries": "queries",
    "workload.output_len": "out",
    "workload.order": "order",
    "workload.shared_prefix_ratio": "prefix",
    "router.decay_interval_s": "dt",
    "seed": "seed",
}
MAX_PARTS_CHARS = 48
_UNSAFE = re.compile(r"[^A-Za-z0-9._,-]")


@dataclass(frozen=True)
class Change:
    """One command-line override that changes the experiment's setting."""

    key: str
    values: tuple[str, ...]  # canonical text of each value (a sweep has several)
    deleted: bool = False
    group: bool = False  # a config-group choice (workload=sharegpt)

    def part(self) -> str:
        name = ALIASES.get(self.key, self.key.rsplit(".", 1)[-1].rsplit("/", 1)[-1])
        if self.deleted:
            return _safe(f"no-{name}")
        text = ",".join(self.values)
        if self.group and self.key not in ALIASES:
            return _safe(text)
        return _safe(f"{name}{text}" if text[:1].isdigit() else f"{name}-{text}")


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


def canonical(value: Any) -> str:
    """A value as the folder name shows it: 8.0 -> 8, 0.50 -> 0.5, other text as it is."""
    text = str(value)
    try:
        x = float(text)
    except ValueError:
        return text
    if not math.isfinite(x) or text.lower() in ("true", "false"):
        return text
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}"


def _values(ov: Any) -> tuple[str, ...]:
    if ov.is_sweep_override():
        return tuple(canonical(v) for v in ov.sweep_string_iterator())
    return (canonical(ov.get_value_element_as_str()),)


def _exempt(key: str, exempt: Sequence[str]) -> bool:
    return any(key == k or key.startswith((k + ".", k + "/")) for k in exempt)


# Project experiments whose folder is no paper grid: the live CPU demo (run with overrides by
# design) and the inverse search (its folder holds the cells its trials drew).
NOT_PAPER_FOLDERS = ("live_cpu_gsp", "inverse_search")


def is_project_experiment(name: str | None) -> bool:
    """An experiment of the project's conf/exp/ whose folder holds its grid (the paper's and the
    beyond-the-paper ones: fig*, tab*, thm_competitive_ratio, regime_map, load_ladder, ...)."""
    return bool(name) and name not in NOT_PAPER_FOLDERS and (CONF_DIR / "exp" / f"{name}.yaml").is_file()


def experiment_of(overrides: Sequence[str]) -> str | None:
    for text in overrides:
        key, sep, value = text.partition("=")
        if sep and key.lstrip("+") == "exp":
            return value
    return None


def _named_by_user(overrides: Sequence[str]) -> bool:
    return any(text.partition("=")[0].lstrip("+~") in NAMED_BY_USER for text in overrides)


def changes(
    params: Mapping[str, Any] | None,
    overrides: Sequence[str],
    baseline: Callable[[str, bool], str | None] | None = None,
    exempt: Sequence[str] = EXEMPT_KEYS,
    original_params: Mapping[str, Any] | None = None,
) -> list[Change]:
    """The command-line overrides that change the experiment's setting (see the module docstring).
    `baseline(key, is_group)`: the experiment's own value (canonical text) of a key it does not
    sweep, or None when unknown (then any value counts as a change)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def sweep_values(p: Mapping[str, Any] | None) -> dict[str, set[str]]:
        found = {}
        for key, value in (p or {}).items():
            (ov,) = parser.parse_overrides([f"{key}={value}"])
            found[str(key).lstrip("+")] = set(_values(ov))
        return found

    swept = sweep_values(params)
    out: dict[str, Change] = {}
    if original_params is not None:
        # the grid itself changed (`hydra.sweeper.params.policy=${systems:mine_lru}`): the values it
        # gained over the experiment's own grid name the folder
        own = sweep_values(original_params)
        for k, now in swept.items():
            gained = now - own.get(k, set())
            if gained and not _exempt(k, (*_NOT_SETTINGS, *exempt)):
                out[k] = Change(k, tuple(sorted(gained)), group="." not in k)
    for text in overrides:
        (ov,) = parser.parse_overrides([text])
        key = ov.key_or_group.lstrip("+~")
        if _exempt(key, (*_NOT_SETTINGS, *exempt)) or ov.is_hydra_override():
            continue
        group = "." not in key
        if ov.is_delete():
            out[key] = Change(key, (), deleted=True, group=group)
            continue
        values = _values(ov)
        if key in swept and set(values) <= swept[key]:
            out.pop(key, None)  # a subset of the paper's grid (a later override replaces an earlier one)
            continue
        if key not in swept and baseline is not None and len(values) == 1:
            try:
                own = baseline(key, group)
            except Exception:  # a key the experiment does not have: a change
                own = None
            if own is not None and canonical(own) == values[0]:
                out.pop(key, None)
                continue
        out[key] = Change(key, values, group=group)
    return [out[k] for k in sorted(out)]


def folder_name(exp: str, found: Sequence[Change]) -> str:
    """`exp+part+part...`, shortened with a hash of the whole when it gets long."""
    parts = [c.part() for c in found]
    whole = "+".join(parts)
    if len(whole) > MAX_PARTS_CHARS:
        kept: list[str] = []
        for p in parts:
            if len("+".join([*kept, p])) > MAX_PARTS_CHARS - 10:
                break
            kept.append(p)
        whole = "+".join([*kept, "h" + hashlib.sha256(whole.encode()).hexdigest()[:8]])
    return f"{exp}+{whole}"


def derived_exp_name(
    params: Mapping[str, Any] | None,
    overrides: Sequence[str],
    baseline: Callable[[str, bool], str | None] | None = None,
    exempt: Sequence[str] = EXEMPT_KEYS,
    original_params: Mapping[str, Any] | None = None,
) -> str | None:
    """The override run's folder name, or None: no project experiment, the user named the folder
    (exp_name= / results_dir=), or nothing result-affecting changed."""
    exp = experiment_of(overrides)
    if not is_project_experiment(exp):
        return None
    if _named_by_user(overrides):
        return None
    found = changes(params, overrides, baseline, exempt, original_params)
    return folder_name(str(exp), found) if found else None


def composer_baseline(compose_fn: Any, overrides: Sequence[str]) -> Callable[[str, bool], str | None] | None:
    """baseline() for `changes`: the experiment's own settings, composed once without the
    command line's other overrides (a GridComposer; None for another compose function)."""
    base_of = getattr(compose_fn, "base_and_choices", None)
    exp = experiment_of(overrides)
    if base_of is None or exp is None:
        return None
    hydra = [t for t in overrides if t.partition("=")[0].lstrip("+~").startswith(("hydra.", "hydra/"))]
    memo: list = []

    def lookup(key: str, group: bool) -> str | None:
        if not memo:
            memo.append(base_of([f"exp={exp}", *protocol_overrides(overrides), *hydra]))
        cfg, choices = memo[0]
        if group:
            value = choices.get(key)
            return None if value is None else str(value)
        from omegaconf import OmegaConf

        if OmegaConf.select(cfg, key, default="\0missing") == "\0missing":
            return None
        value = OmegaConf.select(cfg, key)
        return None if value is None or OmegaConf.is_config(value) else str(value)

    return lookup


def protocol_overrides(overrides: Sequence[str]) -> list[str]:
    """The command line's `protocol=` / `protocol.<key>=` overrides: exempt, yet they decide what the
    experiment's own settings and grid are (its sweep names `${protocol.systems.X}`), so the
    comparison composes the experiment under them."""
    return [t for t in overrides if _exempt(t.partition("=")[0].lstrip("+~"), ("protocol",))]


def _grid_overridden() -> bool:
    """Does the running Hydra app's command line set hydra.sweeper.params.<key>? (True when no app
    runs: the caller then pays one more composition to find out.)"""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return True
    hydra_overrides = HydraConfig.get().overrides.hydra
    return any(str(o).lstrip("+~").startswith("hydra.sweeper.params") for o in hydra_overrides)


def quoted_override(key: str, value: str) -> str:
    """`key='value'`: Hydra reads the derived name (with its `,` and `+`) as one string."""
    return f"{key}='{value}'"


def with_derived_name(params: Mapping[str, Any] | None, overrides: Sequence[str], compose_fn: Any = None) -> list[str]:
    """`overrides` + `exp_name='<derived>'` for an override run (and a line on stderr saying so)."""
    import sys

    original = None
    exp = experiment_of(overrides)
    own_params = getattr(compose_fn, "sweep_params", None)
    if is_project_experiment(exp) and own_params is not None and not _named_by_user(overrides) and _grid_overridden():
        # hydra.sweeper.params.<key>= changed the grid: the experiment's own, under the same protocol
        original = own_params([f"exp={exp}", *protocol_overrides(overrides)])
    name = derived_exp_name(params, overrides, composer_baseline(compose_fn, overrides), original_params=original)
    if name is None:
        return list(overrides)
    print(
        f"repro.run: these overrides change {experiment_of(overrides)}'s setting: results go to {name}/ "
        f"(the paper's folder holds only its own grid; exp_name=NAME or results_dir=DIR names another)",
        file=sys.stderr,
    )
    return [*overrides, quoted_override("exp_name", name)]
