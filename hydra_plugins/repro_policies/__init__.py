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
conf/router/<name>.yaml; its policies appear here by themselves. An out-of-tree package adds its
own conf folder with `add_conf_dir` (docs/EXTENDING.md). `policy_name_errors` is the check the
harness runs on every cell before any work: the system's name must be the one its router and
eviction give (matched on `_target_` and `name`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

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


# Folders whose router/ and eviction/ options make the policy group: the project's conf/, then
# each out-of-tree package's, added by its own hydra_plugins module (docs/EXTENDING.md).
_CONF_DIRS: list[Path] = [CONF_DIR] if CONF_DIR.is_dir() else []


def add_conf_dir(conf_dir: str | Path) -> None:
    """Add an out-of-tree package's config folder: its routers and evictions join the policy group
    (products with every known option; the earlier folder wins a name both hold, as on Hydra's
    search path). The package's hydra_plugins module calls this beside its SearchPathPlugin."""
    conf_dir = Path(conf_dir).resolve()
    if conf_dir not in _CONF_DIRS:
        _CONF_DIRS.append(conf_dir)
    register()


def conf_dirs() -> list[Path]:
    return list(_CONF_DIRS)


def options(kind: str, dirs: list[Path] | None = None) -> dict[str, Path]:
    """{option name: its YAML} of config group `kind` (router | eviction) over `dirs` (default: all)."""
    out: dict[str, Path] = {}
    for d in dirs if dirs is not None else _CONF_DIRS:
        for path in sorted((Path(d) / kind).glob("*.yaml")):
            out.setdefault(path.stem, path)
    return dict(sorted(out.items()))


def policies(conf_dir: Path | None = None) -> dict[str, dict]:
    """{policy option name: its config node}, every router x every eviction (of `conf_dir`, or of
    every registered folder)."""
    dirs = None if conf_dir is None else [Path(conf_dir)]
    routers, evictions = options("router", dirs), options("eviction", dirs)
    out: dict[str, dict] = {}
    for r, rpath in routers.items():
        for e, epath in evictions.items():
            name = f"{r}_{e}"
            if name in out:  # e.g. router a_b x eviction c and router a x eviction b_c
                raise ValueError(f"policy name {name!r} is ambiguous (rename a router or eviction option)")
            out[name] = {
                "defaults": [{"/router": r}, {"/eviction": e}, "_self_"],
                "policy_name": f"{display_name(rpath, 'router')}+{display_name(epath, 'eviction')}",
            }
    return out


_identity_memo: dict[tuple, tuple] = {}


def _identity(path: Path) -> tuple:
    """(_target_, name, display name) of an option's YAML (memoised by path, size and mtime: a
    grid of a thousand cells asks for the same few files)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _identity_memo:
        import yaml

        node = yaml.safe_load(path.read_text()) or {}
        node = node if isinstance(node, dict) else {}
        _identity_memo[key] = (node.get("_target_"), node.get("name"), display_name(path, path.parent.name))
    return _identity_memo[key]


def policy_names(router: Mapping, eviction: Mapping) -> set[str]:
    """The system names (policy_name) of the options that compose to these router and eviction
    nodes: matched on `_target_` and `name`, the keys that pick the class."""
    def displays(kind: str, node: Mapping) -> set[str]:
        want = (node.get("_target_"), node.get("name")) if isinstance(node, Mapping) else None
        return {ident[2] for ident in map(_identity, options(kind).values()) if ident[:2] == want}

    return {f"{r}+{e}" for r in displays("router", router) for e in displays("eviction", eviction)}


def policy_name_errors(cfg: Mapping) -> list[str]:
    """[why] when cfg's policy_name is not the name of the router and eviction it composes
    (`router=random` under the default policy lbgr_rlt would run Random but be drawn as LBGR+RLT)."""
    name = cfg.get("policy_name")
    router, eviction = cfg.get("router") or {}, cfg.get("eviction") or {}
    names = policy_names(router, eviction)
    if name in names:
        return []
    r = router.get("name") if isinstance(router, Mapping) else None
    e = eviction.get("name") if isinstance(eviction, Mapping) else None
    if not names:
        where = ", ".join(str(d) for d in _CONF_DIRS)
        return [f"policy_name={name!r}: router {r!r} x eviction {e!r} is no option pair of {where} (matched on "
                "_target_ and name); an out-of-tree package adds its conf folder with "
                "hydra_plugins.repro_policies.add_conf_dir (docs/EXTENDING.md)"]
    return [f"policy_name={name!r} does not name the router {r!r} and eviction {e!r} this cell composes "
            f"(their name: {' or '.join(sorted(names))}); choose both with policy=<router>_<eviction>, "
            "e.g. policy=" + f"{r}_{e}, not router=/eviction= alone"]


def register(conf_dir: Path | None = None) -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in policies(conf_dir).items():
        cs.store(group="policy", name=name, node=node, package="_global_", provider="repro")


if CONF_DIR.is_dir():
    register()
