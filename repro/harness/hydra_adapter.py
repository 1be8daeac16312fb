"""Every use of Hydra's private API (hydra._internal, private methods) in one place.

The in-process grid re-expands and re-composes a sweep exactly as Hydra's `-m` would, which needs
three pieces Hydra does not publish:
- `split_sweep`: the basic sweeper's cartesian product, in its order (BasicSweeper.split_arguments);
- `config_repository`: the caching config repository Hydra's loader composes from (its
  `group_exists` tells a config-group override from a value override);
- `apply_value_overrides`: the loader's second composition step, value overrides applied to a
  composed config (ConfigLoaderImpl._apply_overrides_to_config).
Each checks, at first use, that the installed hydra-core is one this module was written for
(TESTED_HYDRA_VERSIONS: constraints.txt's pin, kept equal by tests/harness/test_hydra_adapter.py);
another version stops with HydraVersionError naming both. Private modules are imported only after
that check, so a Hydra that moved them also gets the clear error.
"""

from __future__ import annotations

from typing import Any, Sequence

TESTED_HYDRA_VERSIONS = ("1.3.8",)

_installed_passed = False  # the installed hydra-core passed the check


class HydraVersionError(RuntimeError):
    """The installed hydra-core is not one the adapter's private calls were checked against."""


def check_hydra_version(installed: str) -> None:
    """Raise HydraVersionError unless `installed` is in TESTED_HYDRA_VERSIONS."""
    if installed not in TESTED_HYDRA_VERSIONS:
        raise HydraVersionError(
            f"hydra-core {installed} is installed, but repro/harness/hydra_adapter.py uses Hydra internals checked "
            f"only against hydra-core {', '.join(TESTED_HYDRA_VERSIONS)} (constraints.txt): install that "
            f"(`pip install -c constraints.txt -e .`), or check the adapter against {installed} and add it to "
            f"TESTED_HYDRA_VERSIONS"
        )


def require_tested_hydra() -> None:
    """check_hydra_version on the installed hydra-core, once per process."""
    global _installed_passed
    if not _installed_passed:
        import hydra

        check_hydra_version(str(hydra.__version__))
        _installed_passed = True


def split_sweep(parsed_overrides: Sequence[Any]) -> list[list[str]]:
    """The basic sweeper's jobs (each a list of `key=value` strings) for parsed overrides, in its order."""
    require_tested_hydra()
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    (jobs,) = BasicSweeper.split_arguments(list(parsed_overrides), max_batch_size=None)
    return jobs


def config_repository(config_name: str, hydra_overrides: Sequence[str]) -> Any:
    """The running Hydra app's caching config repository for `config_name` (hydra.searchpath
    overrides included); it answers `group_exists(name)`."""
    require_tested_hydra()
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    _, repo = loader._parse_overrides_and_create_caching_repo(config_name, list(hydra_overrides))
    return repo


def apply_value_overrides(parsed_overrides: Sequence[Any], cfg: Any) -> None:
    """Apply parsed value overrides to the composed config `cfg` in place, as Hydra's loader does."""
    require_tested_hydra()
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(list(parsed_overrides), cfg)
