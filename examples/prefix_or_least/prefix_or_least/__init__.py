"""A worked example of an out-of-tree router and eviction policy for the repro harness
(docs/EXTENDING.md): `PrefixOrLeastLoadedRouter` and `OldestOrRandomEviction`, their configs in
prefix_or_least/conf/, found by Hydra through hydra_plugins/prefix_or_least_conf/."""

from prefix_or_least.eviction import OldestOrRandomEviction
from prefix_or_least.router import PrefixOrLeastLoadedRouter

__all__ = ["OldestOrRandomEviction", "PrefixOrLeastLoadedRouter"]
