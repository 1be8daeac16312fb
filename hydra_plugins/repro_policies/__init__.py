"""The `policy` config group as the product router x eviction (no file per pair).

Hydra imports every module under the `hydra_plugins` namespace package when it starts (in any
process that composes a config: `python -m repro.run`, its -m jobs on any launcher,
`initialize_config_dir` + `compose` in tools and tests), so the policies registered here exist
wherever conf/ is used. For every conf/router/<r>.yaml and conf/eviction/<e>.yaml this stores
the ConfigStore node `policy/<r>_<e>` (package _global_), the same config a file
conf/policy/<r>_<e>.yaml would be:

    defaults: [/router: <r>, /eviction: <e>, _self_]
    policy_name: "<router display>+<eviction display>"

so `policy=lbgr_rlt` (command line, sweeps, defaults lists) selects router lbgr and eviction rlt
and names the system "LBGR+RLT". Display names (the figures and claims key on policy_name): a
`# @display NAME` line at the very top of the option's YAML (Hydra's header syntax; only
`@package` means anything to Hydra, so the name never enters the composed config and never
reaches the router's constructor); without one, a router's name in CamelCase (cache_aware ->
CacheAware) and an eviction's in capitals (lru -> LRU). Adding a router is its class plus
conf/router/<name>.yaml; its policies appear here by themselves.
"""

from __future__ import annotations

import re
from pathlib import Path

from repro.confutil import CONF_DIR
_DISPLAY = re.compile(r"^\s*#\s*@display\s+(\S+)\s*$")


def display_name(path: Path, kind: str) -> str:
    """The `# @display NAME` header of a router/eviction YAML, else the documented rule."""
    for line in path.read_text().splitlines():
        if not re.match(r"^\s*#\s*@", line):  # Hydra's header: the leading `# @key value` lines
            break
        m = _DISPLAY.match(line)
        if m:
            return m.group(1)
    if kind == "router":
        return "".join(part.capitalize() for part in path.stem.split("_"))
    return path.stem.upper()


def policies(conf_dir: Path = CONF_DIR) -> dict[str, dict]:
    """{policy option name: its config node}, every router x every eviction of conf_dir."""
    routers = sorted((conf_dir / "router").glob("*.yaml"))
    evictions = sorted((conf_dir / "eviction").glob("*.yaml"))
    out: dict[str, dict] = {}
    for r in routers:
        for e in evictions:
            name = f"{r.stem}_{e.stem}"
            if name in out:  # e.g. router a_b x eviction c and router a x eviction b_c
                raise ValueError(f"policy name {name!r} is ambiguous (rename a router or eviction option)")
            out[name] = {
                "defaults": [{"/router": r.stem}, {"/eviction": e.stem}, "_self_"],
                "policy_name": f"{display_name(r, 'router')}+{display_name(e, 'eviction')}",
            }
    return out


def register(conf_dir: Path = CONF_DIR) -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in policies(conf_dir).items():
        cs.store(group="policy", name=name, node=node, package="_global_", provider="repro")


if CONF_DIR.is_dir():
    register()
