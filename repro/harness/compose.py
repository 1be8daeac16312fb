"""Compose, resolve and sign the cells of a sweep (in the process that plans the sweep)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from repro.harness.grid import Cell
from repro.harness.hydra_adapter import HydraVersionError, apply_value_overrides, config_repository
from repro.harness.validate import ConfigError, format_errors
from repro.results import run_signature


_OPTIONAL_TOP_KEYS = ("theory", "local", "ladder")
SYSTEM_KNOB_PREFIXES = ("router.", "eviction.")  # knobs of one system's parts (repro.harness.knobs)
_ABSENT = object()


def resolve(cfg: DictConfig | Mapping) -> dict:
    """Plain, fully resolved containers (what signatures, workers and config.yaml see)."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    # `hydra` never belongs to a cell; schema-only optional keys left at null are dropped so
    # that a cell config is the same whether or not the schema took part in composition.
    return {k: v for k, v in cfg.items() if k != "hydra" and not (k in _OPTIONAL_TOP_KEYS and v is None)}


def cell_signature(cfg: Mapping) -> str:
    """run_signature of the result-affecting config (the backend may narrow it: theory)."""
    from repro.backends import get_backend

    name = (cfg.get("backend") or {}).get("name")
    identity = None
    if name is not None:
        try:
            identity = get_backend(str(name)).identity
        except Exception:  # unknown/unimportable backends are reported by validation
            identity = None
    return run_signature(identity(cfg) if identity is not None else cfg)


def canonical_types(cfg: DictConfig, base: DictConfig, keys: Sequence[str]) -> None:
    """Give each command-line/grid value the type of the setting it replaces, so that equal
    settings are one cell: `router.rls_pool_regularization=3` and `=3.0` both become 3.0 (the
    option's YAML says 3.0), `cluster.num_workers=4.0` becomes 4. The types come from the
    composed defaults of the cell's own group options (the structured schema, ReproSchema,
    already converts the keys it types); a key without a default (null, or added with `+`)
    keeps the value's own type."""
    for key in keys:
        try:
            old = OmegaConf.select(base, key, throw_on_missing=False)
            new = OmegaConf.select(cfg, key, throw_on_missing=False)
        except Exception:  # interpolation to a key the override removed: nothing to compare
            continue
        if isinstance(old, bool) or isinstance(new, bool) or old is None or new is None:
            continue
        if isinstance(old, float) and isinstance(new, int):
            OmegaConf.update(cfg, key, float(new), merge=False)
        elif isinstance(old, int) and isinstance(new, float) and new.is_integer():
            OmegaConf.update(cfg, key, int(new), merge=False)


class GridComposer:
    """`hydra.compose(config_name, overrides)` for many cells that share their config groups.

    Hydra composes a config in two steps: the defaults list (config-group choices) is merged,
    then plain value overrides (`seed=1`, `workload.request_rate=8`) are applied to the result
    (repro.harness.hydra_adapter.apply_value_overrides). A grid usually varies a few values over a
    few group choices, so this composes each distinct set of group overrides once and applies
    the value overrides to a copy with Hydra's own function — the same two steps in the same
    order (about 20x fewer compositions for fig2's 72 cells). An override that could be a
    config group (known group, `/` or `@` in its key, or a group choice of the composed
    config) always goes through full composition. The -m path composes every job in full;
    the identity tests compare both byte for byte.
    """

    def __init__(self, config_name: str):
        self.config_name = config_name
        self._bases: dict[tuple[str, ...], tuple[DictConfig, dict]] = {}
        self._repos: dict[tuple[str, ...], Any] = {}
        self._params: dict[tuple[str, ...], dict | None] = {}  # hydra.sweeper.params of each base

    def _compose(self, overrides: Sequence[str], with_hydra: bool) -> DictConfig:
        from hydra import compose

        return compose(config_name=self.config_name, overrides=list(overrides), return_hydra_config=with_hydra)

    def _repo(self, hydra_overrides: tuple[str, ...]) -> Any:
        """Hydra's config repository for this search path (hydra.searchpath overrides included)."""
        if hydra_overrides not in self._repos:
            try:
                repo = config_repository(self.config_name, hydra_overrides)
            except HydraVersionError:
                raise
            except Exception:  # no repository here: every override then takes full composition
                repo = None
            self._repos[hydra_overrides] = repo
        return self._repos[hydra_overrides]

    def _base(self, structural: tuple[str, ...]) -> tuple[DictConfig, dict]:
        """The composition of these group overrides (hydra node dropped) and its group choices."""
        if structural not in self._bases:
            full = self._compose(structural, with_hydra=True)
            choices = {str(k): v for k, v in full.hydra.runtime.choices.items()}
            sp = full.hydra.sweeper.get("params")
            params = OmegaConf.to_container(sp, resolve=True) if sp is not None else None
            self._params[structural] = params if isinstance(params, dict) else None
            with open_dict(full):
                del full["hydra"]  # as hydra.compose does; values never touch it
            self._bases[structural] = (full, choices)
        return self._bases[structural]

    def base_and_choices(self, overrides: Sequence[str]) -> tuple[DictConfig, dict]:
        """(config, group choices) of group-only overrides (`exp=NAME`): what an experiment sets
        before the command line's values (repro.harness.naming compares against it)."""
        return self._base(tuple(overrides))

    def sweep_params(self, overrides: Sequence[str]) -> dict | None:
        """The resolved hydra.sweeper.params these overrides compose (an experiment's own grid)."""
        self._base(tuple(overrides))
        return self._params.get(tuple(overrides))

    def missing_system_knobs(self, overrides: Sequence[str]) -> list[str]:
        """The `router.<key>=` / `eviction.<key>=` overrides naming a key the router or eviction
        these overrides choose does not have (repro.harness.knobs applies them where they exist)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        repo = self._repo(tuple(ov.input_line for ov in parsed if ov.is_hydra_override()))
        is_value = [self._maybe_value(ov, repo) for ov in parsed]
        structural = tuple(text for text, v in zip(overrides, is_value) if not v)
        missing = []
        for text, ov, v in zip(overrides, parsed, is_value):
            key = ov.key_or_group
            if not v or (ov.is_add() and not ov.is_force_add()) or ov.is_delete():
                continue
            if not key.startswith(SYSTEM_KNOB_PREFIXES):
                continue
            if OmegaConf.select(self._base(structural)[0], key, default=_ABSENT) is _ABSENT:
                missing.append(text)
        return missing

    @staticmethod
    def _maybe_value(ov: Any, repo: Any) -> bool:
        key = ov.key_or_group
        if repo is None or ov.is_hydra_override() or ov.package is not None or "/" in key or "@" in key:
            return False
        if isinstance(ov.value(), dict):
            return True  # Hydra treats dict values as config overrides, group or not
        return not repo.group_exists(key.lstrip("+~"))

    def __call__(self, overrides: Sequence[str]) -> DictConfig:
        import copy

        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        repo = self._repo(tuple(ov.input_line for ov in parsed if ov.is_hydra_override()))
        is_value = [self._maybe_value(ov, repo) for ov in parsed]
        structural = [text for text, v in zip(overrides, is_value) if not v]
        values = [ov for ov, v in zip(parsed, is_value) if v]
        base, choices = self._base(tuple(structural))
        if any(ov.key_or_group.lstrip("+~") in choices for ov in values):
            cfg = self._compose(overrides, with_hydra=False)
        else:
            cfg = copy.deepcopy(base)
            apply_value_overrides(values, cfg)
        canonical_types(cfg, base, [ov.key_or_group.lstrip("+~") for ov in values])
        return cfg

    def canonicalize(self, cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
        """`cfg` composed elsewhere (a -m job) from `overrides`, with this composer's canonical types."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        repo = self._repo(tuple(ov.input_line for ov in parsed if ov.is_hydra_override()))
        is_value = [self._maybe_value(ov, repo) for ov in parsed]
        structural = tuple(text for text, v in zip(overrides, is_value) if not v)
        if structural not in self._bases:
            self(list(structural))
        base, _ = self._bases[structural]
        canonical_types(cfg, base, [ov.key_or_group.lstrip("+~") for ov, v in zip(parsed, is_value) if v])
        return cfg


def hydra_compose(config_name: str) -> Callable[[Sequence[str]], DictConfig]:
    """Compose with the running Hydra app's search path (inside @hydra.main or its callbacks)."""
    return GridComposer(config_name)


def compose_cells(cells: Sequence[Cell], compose_fn: Callable[[Sequence[str]], DictConfig]) -> None:
    """Fill cell.config and cell.signature; every composition error in one ConfigError."""
    from repro.harness.knobs import apply_where_known

    apply_where_known(cells, compose_fn)
    problems: dict[str, list[str]] = {}
    bad = 0
    for cell in cells:
        try:
            cell.config = resolve(compose_fn(cell.overrides))
            cell.signature = cell_signature(cell.config)
        except Exception as exc:  # Hydra's composition / interpolation errors
            bad += 1
            msg = str(exc).strip() or type(exc).__name__
            problems.setdefault(msg, []).append(f"{cell.index} [{cell.label}]")
    if problems:
        raise ConfigError(format_errors(problems, len(cells), bad))
