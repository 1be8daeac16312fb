"""Dependencies point down only: every `import repro.X` / `from repro.X import ...` under repro/
(module level, inside functions and under TYPE_CHECKING alike: a lazy import is still a dependency)
against the table below. Read with ast, nothing is imported. docs/ARCHITECTURE.md "Dependencies
point down only" explains the table.

A package is a folder or a top-level module of repro/ (`repro.confutil`, `repro.run`); `repro` itself
is the package's __init__ (only __version__). Entry points (`repro.run` and every `__main__` module)
may import anything.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A package may import its own modules, the packages ALLOWED names, nothing else.
LAYERS = (
    ("repro", "confutil", "fileio", "lifeline"),
    ("codehash",),
    ("kvcache", "costmodel", "workloads", "metrics", "results", "tracking"),
    ("routing", "sim", "theory"),
    ("backends",),
    ("harness",),
    ("figures", "analysis"),
    ("run",),
)
BASE = {"repro", "confutil", "fileio", "lifeline"}
ALLOWED: dict[str, set[str]] = {
    "repro": set(),
    "confutil": set(),
    "fileio": set(),
    "lifeline": set(),  # stdlib only: repro.run arms it before any heavy import
    "codehash": BASE,  # the code digests of fingerprints and of the workload cache's keys
    "kvcache": BASE,
    "costmodel": BASE,
    "metrics": BASE,
    "results": BASE | {"codehash"},
    "tracking": BASE | {"results"},  # writes W&B files from a cell's files (their names: results.store)
    "workloads": BASE | {"codehash", "kvcache"},  # stats.py measures prefix sharing with a radix cache
    "routing": BASE | {"kvcache", "costmodel", "workloads"},
    "sim": BASE | {"kvcache", "costmodel", "workloads", "metrics", "routing"},  # the cluster asks its router
    "theory": BASE | {"kvcache", "workloads", "results"},
    "backends": BASE | {"kvcache", "costmodel", "workloads", "metrics", "results", "routing", "sim", "theory"},
    # the harness sees caches, routers and the simulator only through a backend (repro/backends/assembly.py)
    "harness": BASE | {"codehash", "workloads", "metrics", "results", "tracking", "backends"},
    "figures": BASE | {"kvcache", "costmodel", "workloads", "metrics", "results", "tracking",
                       "routing", "sim", "theory", "backends", "harness"},
    "analysis": BASE | {"kvcache", "costmodel", "workloads", "metrics", "results", "tracking",
                        "routing", "sim", "theory", "backends", "harness"},
    "run": set(),  # an entry point: anything
}
# Routers are a `_target_` in conf/router/*.yaml: below the analysis tools, other packages reach them
# through the registry, the interface and the shared trackers only, never one router's module.
INTERFACES = {"routing": {"repro.routing", "repro.routing.base", "repro.routing.trackers"}}
INTERFACE_EXEMPT = {"analysis"}

# Known violations that other branches of issue 15 are removing: (importer, imported module) -> why.
# The test fails when a pair no longer occurs, so this list empties as they land.
PENDING: dict[tuple[str, str], str] = {
}


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: Path = ROOT) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "repro"


def _is_entry_point(module: str) -> bool:
    return module == "repro.run" or module.rsplit(".", 1)[-1] == "__main__"


def _imports(path: Path, root: Path = ROOT):
    """(line, statement text, imported module) for every repro import in one file."""
    module = _module_name(path, root)
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "repro" or alias.name.startswith("repro."):
                    yield node.lineno, f"import {alias.name}", alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "repro" or target.startswith("repro.")):
                continue
            text = f"from {'.' * node.level}{node.module or ''} import"
            for alias in node.names:  # `from pkg import submodule` depends on the submodule
                sub = f"{target}.{alias.name}"
                yield node.lineno, f"{text} {alias.name}", sub if _is_module(sub, root) else target


@lru_cache(maxsize=None)
def _scan(root: Path = ROOT):
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    problems: list[str] = []
    packages = set()
    for path in sorted((root / "repro").rglob("*.py")):
        importer = _module_name(path, root)
        src = _package(importer)
        packages.add(src)
        rel = path.relative_to(root)
        for line, text, imported in _imports(path, root):
            dst = _package(imported)
            if dst == src or _is_entry_point(importer):
                continue
            where = f"{rel}:{line}: `{text}`"
            rule = None
            if src not in ALLOWED:
                rule = f"package '{src}' is not in tests/test_layering.py ALLOWED (add it to the table)"
            elif dst not in ALLOWED[src]:
                rule = (f"'{src}' may not import '{dst}' (dependencies point down only; '{src}' may import: "
                        f"{', '.join(sorted(ALLOWED[src])) or 'nothing of repro'})")
            elif dst in INTERFACES and src not in INTERFACE_EXEMPT and imported not in INTERFACES[dst]:
                rule = (f"'{imported}' is not an interface of '{dst}'; outside it import only "
                        f"{', '.join(sorted(INTERFACES[dst]))}")
            if rule is None:
                continue
            found[(importer, imported)].append(where)
            if (importer, imported) not in PENDING:
                problems.append(f"{where}: {rule}")
    return found, problems, packages


def test_imports_follow_the_allowed_table():
    found, problems, _ = _scan()
    assert not problems, "imports that break the layering:\n  " + "\n  ".join(problems)


def test_pending_violations_still_exist():
    found, _, _ = _scan()
    gone = [f"{a} -> {b} ({why})" for (a, b), why in PENDING.items() if (a, b) not in found]
    assert not gone, ("these PENDING pairs no longer occur: remove them from PENDING in "
                      "tests/test_layering.py:\n  " + "\n  ".join(gone))


def test_every_package_has_a_row_and_the_table_points_down():
    _, _, packages = _scan()
    assert packages <= set(ALLOWED), f"packages missing from ALLOWED: {sorted(packages - set(ALLOWED))}"
    layer = {p: i for i, names in enumerate(LAYERS) for p in names}
    assert set(layer) == set(ALLOWED), "LAYERS and ALLOWED must name the same packages"
    sideways = {("workloads", "kvcache"), ("sim", "routing"), ("tracking", "results")}  # one direction only
    for src, dsts in ALLOWED.items():
        for dst in dsts:
            assert layer[dst] < layer[src] or (src, dst) in sideways, f"ALLOWED: {src} -> {dst} points up"
    assert all((b, a) not in sideways for a, b in sideways)


def test_the_scanner_sees_lazy_relative_and_from_package_imports(tmp_path):
    # the rules are only as good as the scan: a function-level import, a relative one and
    # `from repro import x` each resolve to the module they depend on
    pkg = tmp_path / "repro" / "sim"
    pkg.mkdir(parents=True)
    for f in (tmp_path / "repro" / "__init__.py", tmp_path / "repro" / "fileio.py", pkg / "__init__.py", pkg / "y.py"):
        f.write_text("")
    (pkg / "x.py").write_text("def f():\n    from repro.backends.base import C\n"
                              "from . import y\nfrom repro import fileio, __version__\nimport repro.harness.cell\n"
                              "import numpy\nfrom reprox import z\n")
    got = sorted((line, text, mod) for line, text, mod in _imports(pkg / "x.py", tmp_path))
    assert got == [
        (2, "from repro.backends.base import C", "repro.backends.base"),
        (3, "from . import y", "repro.sim.y"),
        (4, "from repro import __version__", "repro"),
        (4, "from repro import fileio", "repro.fileio"),
        (5, "import repro.harness.cell", "repro.harness.cell"),
    ]
    assert _package("repro.backends.base") == "backends" and _package("repro") == "repro"
    assert _is_entry_point("repro.results.__main__") and _is_entry_point("repro.run")
    assert not _is_entry_point("repro.harness.batch")


def test_a_planted_violation_names_file_line_and_rule(tmp_path):
    files = {
        "repro/__init__.py": "", "repro/metrics/__init__.py": "", "repro/routing/__init__.py": "",
        "repro/routing/base.py": "", "repro/routing/lbgr.py": "", "repro/results/__main__.py": "import repro.harness\n",
        "repro/metrics/summary.py": "import os\n\ndef f():\n    from repro.routing.base import Router\n",
        "repro/sim/__init__.py": "from repro.routing import lbgr\nfrom repro.routing.base import Router\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found, problems, _ = _scan(tmp_path)
    assert sorted(found) == [("repro.metrics.summary", "repro.routing.base"), ("repro.sim", "repro.routing.lbgr")]
    assert problems[0].startswith("repro/metrics/summary.py:4: `from repro.routing.base import Router`: "
                                  "'metrics' may not import 'routing'")
    assert problems[1].startswith("repro/sim/__init__.py:1: `from repro.routing import lbgr`: "
                                  "'repro.routing.lbgr' is not an interface of 'routing'")
