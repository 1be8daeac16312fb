"""A worked example of an out-of-tree router and eviction policy for the repro harness
(docs/EXTENDING.md): prefix_or_least.router.PrefixOrLeastLoadedRouter and
prefix_or_least.eviction.OldestOrRandomEviction, their configs in prefix_or_least/conf/, found by
Hydra through hydra_plugins/prefix_or_least_conf/.

Nothing is imported here on purpose: a cell's fingerprint follows the imports of the modules its
config names (and of their parent packages), so an edit of router.py makes only the cells that
route with it stale, not those that evict with eviction.py.
"""
