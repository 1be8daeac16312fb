"""Hydra imports every module under `hydra_plugins` at start-up: this one puts the package's
conf/ on Hydra's search path (so router=prefix_or_least and eviction=oldest_or_random exist)
and into the harness's policy group (policy=prefix_or_least_lru, lbgr_oldest_or_random, ...)."""

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from hydra_plugins.repro_policies import add_conf_dir

CONF = Path(__file__).resolve().parents[2] / "prefix_or_least" / "conf"
add_conf_dir(CONF)


class PrefixOrLeastSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="prefix_or_least", path=f"file://{CONF}")
