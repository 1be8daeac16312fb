"""What code a computation runs, as digests: the one mechanism behind a cell's fingerprint
(repro.results.fingerprint) and the workload pool cache's key (repro.workloads.cache).

`code_fingerprint(roots, root_dir=...)` follows the static import closure of `roots` (ast, no
import: every `import` anywhere in a module counts, inside functions too; imports inside `try:`
bodies are optional extras) and returns
  code          module file -> sha256 of its AST with docstrings dropped (comments never reach
                the AST), for every module whose *code* is an input (see `module_origin`);
  package_data  non-Python files shipped in those packages' folders;
  versions      the distributions of the released packages the closure imports, and Python.

Where a top-level name's code comes from (`module_origin`): the project's own tree (`root_dir`,
e.g. repro), the standard library (nothing recorded), a released distribution (its version:
an installer put it in site-packages, with its RECORD / INSTALLER, from an index: its files do
not change under a version), or source that can change under the same version — a module on
the path that no distribution owns, metadata found beside source on the path (an .egg-info left
by `pip install -e` in the source folder), or a distribution installed from a local folder
(PEP 610 `dir_info`): those are hashed like
repro itself, so editing a user's out-of-tree router makes exactly the cells that name it stale.
A code key is the file's path relative to the folder its top-level name was found in
("repro/routing/lbgr.py", "prefix_or_least/router.py").

Memos (per process) trust a file's stat identity: device, inode, size, mtime and ctime
(`stat_identity`). ctime cannot be set from user space, so a file rewritten to the same size with
its mtime put back is still noticed (docs/ARCHITECTURE.md "Freshness": what is trusted).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from repro.fileio import sha256_file

# Python as results record it: major.minor (patch releases do not change numbers).
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]


def stat_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What a memo may trust about a file's bytes without reading them: (dev, inode, size, mtime_ns,
    ctime_ns). A write or `touch -m` changes ctime; a copy or an atomic replace changes the inode."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_file_memo: dict[tuple, Any] = {}


def _memo_file(path: Path, kind: str, compute: Callable[[Path], Any]) -> Any:
    key = (str(path), kind, stat_identity(path.stat()))
    if key not in _file_memo:
        _file_memo[key] = compute(path)
    return _file_memo[key]


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (memoised per process by path and stat identity)."""
    return _memo_file(Path(path), "sha", sha256_file)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


class _ModuleInfo:
    __slots__ = ("digest", "imports", "optional_imports")

    def __init__(self, digest: str, imports: set[str], optional_imports: set[str]):
        self.digest, self.imports, self.optional_imports = digest, imports, optional_imports


def _parse_module(path: Path, name: str, is_package: bool) -> _ModuleInfo:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    imports: set[str] = set()
    optional: set[str] = set()
    in_try: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            for child in node.body:
                for sub in ast.walk(child):
                    in_try.add(id(sub))
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found = [mod] + [f"{mod}.{a.name}" for a in node.names if a.name != "*"]
        if found:
            (optional if id(node) in in_try else imports).update(found)
    digest = hashlib.sha256(ast.dump(_strip_docstrings(tree), include_attributes=False).encode()).hexdigest()
    return _ModuleInfo(digest, imports, optional - imports)


def module_file(root: Path, name: str) -> tuple[Path | None, bool]:
    """(the source file of module `name` under folder `root`, is it a package) or (None, False)."""
    base = root.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None, False


def _module_info(root: Path, name: str) -> tuple[Path, _ModuleInfo] | None:
    path, is_pkg = module_file(root, name)
    if path is None:
        return None
    return path, _memo_file(path, f"ast:{name}:{is_pkg}", lambda p: _parse_module(p, name, is_pkg))


def _excluded(name: str, exclude: Sequence[str]) -> bool:
    return any(name == e or name.startswith(e + ".") for e in exclude)


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


@lru_cache(maxsize=1)
def _site_dirs() -> frozenset[Path]:
    """The folders an installer puts distributions in (this interpreter's site-packages, the user's)."""
    import site
    import sysconfig

    dirs = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
    dirs += list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return frozenset(Path(d).resolve() for d in dirs if d)


def _installed(d: Any) -> bool:
    """Did an installer put `d` there: metadata in a site-packages folder, with the installer's RECORD
    or INSTALLER. Metadata beside source on the path (`pip install -e` of a setup.py project leaves
    <name>.egg-info in the source folder) says nothing about whether that source is a release."""
    try:
        base = Path(d.locate_file("")).resolve()
    except (OSError, TypeError, ValueError):
        return False
    if base not in _site_dirs():
        return False
    return any(d.read_text(name) is not None for name in ("RECORD", "INSTALLER"))


@lru_cache(maxsize=None)  # installed distributions do not change within a process
def _dist_info(dist: str) -> tuple[str, bool]:
    """(version, released): released when an installer put it in site-packages (`_installed`) and
    PEP 610's direct_url.json does not say it came from a local folder or file."""
    from importlib import metadata

    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return "absent", True
    if not _installed(d):
        return d.version, False
    try:
        direct = json.loads(d.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if isinstance(direct, dict):
        if "dir_info" in direct or str(direct.get("url", "")).startswith("file:"):
            return d.version, False
        commit = (direct.get("vcs_info") or {}).get("commit_id")
        if commit:
            return f"{d.version}@{commit}", True
    return d.version, True


def _found_on_path(top: str) -> Path | None:
    """The folder holding top-level module `top`'s source (a package or a .py file), without importing it."""
    from importlib.util import find_spec

    try:
        spec = find_spec(top)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None  # extension module, namespace package, builtin
    path = Path(origin)
    return path.parent.parent if path.name == "__init__.py" and spec.submodule_search_locations else path.parent


@lru_cache(maxsize=None)
def _origin_cached(top: str, root_dir: str) -> tuple[str, Any]:
    if top in sys.stdlib_module_names or top == "__future__":
        return "stdlib", None
    if module_file(Path(root_dir), top)[0] is not None:
        return "code", Path(root_dir)
    dists = _distributions().get(top, [])
    if dists and all(_dist_info(d)[1] for d in dists):
        return "version", {d.lower(): _dist_info(d)[0] for d in dists}
    where = _found_on_path(top)
    if where is not None:
        return "code", where
    return "version", {d.lower(): _dist_info(d)[0] for d in (dists or [top])}


def module_origin(top: str, root_dir: Path) -> tuple[str, Any]:
    """("code", folder) | ("version", {distribution: version}) | ("stdlib", None) for a top-level
    import name (module docstring). A name nothing provides: ("version", {name: "absent"})."""
    return _origin_cached(top, str(root_dir))


def import_closure(
    roots: Iterable[str], *, root_dir: Path, exclude: Sequence[str] = ()
) -> tuple[dict[str, tuple[Path, Path]], dict[str, str]]:
    """(module -> (its folder of origin, its file) for every module whose code is an input,
    {distribution: version} of the released ones the closure imports outside `try:`)."""
    seen: dict[str, tuple[Path, Path]] = {}
    versions: dict[str, str] = {}
    todo = [(r, False) for r in roots]
    while todo:
        name, optional = todo.pop()
        if not name or name in seen:
            continue
        kind, where = module_origin(name.split(".")[0], root_dir)
        if kind == "version":
            if not optional:
                versions.update(where)
            continue
        if kind == "stdlib" or _excluded(name, exclude):
            continue
        found = _module_info(where, name)
        if found is None:  # `from pkg import function`: the candidate `pkg.function` is no module
            continue
        path, info = found
        seen[name] = (where, path)
        parts = name.split(".")
        todo.extend((".".join(parts[:i]), False) for i in range(1, len(parts)))  # parent packages run first
        todo.extend((m, False) for m in info.imports)
        todo.extend((m, True) for m in info.optional_imports)
    return seen, versions


def _package_data(module_files: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(non-Python files in the folders of the closure's packages, the folders listed to find them)."""
    out: set[Path] = set()
    listed: list[Path] = []
    for f in module_files:
        if f.name != "__init__.py":
            continue
        stack = [f.parent]
        while stack:
            d = stack.pop()
            listed.append(d)
            for child in d.iterdir():
                if child.name.startswith(".") or child.name == "__pycache__":
                    continue
                if child.is_dir():
                    if not (child / "__init__.py").exists():
                        stack.append(child)  # plain data folder: part of this package
                elif child.suffix not in (".py", ".pyc", ".pyo"):
                    out.add(child)
    return sorted(out), listed


def package_data_files(module_files: Iterable[Path]) -> list[Path]:
    """Non-Python files in the folders of the closure's packages (not in their subpackages)."""
    return _package_data(module_files)[0]


_closure_memo: dict[tuple, dict] = {}


def code_fingerprint(roots: Sequence[str], *, root_dir: Path, exclude: Sequence[str] = ()) -> dict:
    """{code, package_data, versions} of the import closure of `roots` (memoised per process)."""
    key = (tuple(sorted(set(roots))), str(root_dir), tuple(exclude))
    # A hit is re-validated by stats alone (a sweep asks once per cell): the closure's files, its
    # data files and the folders they were found in (a file added to or removed from a folder
    # changes the folder's mtime), so the closure walk runs only when something changed.
    hit = _closure_memo.get(key)
    if hit is not None and _stamp(hit["watched"]) == hit["stamp"]:
        return hit["value"]
    modules, versions = import_closure(roots, root_dir=root_dir, exclude=exclude)
    files = {path: where for where, path in modules.values()}
    data_files, data_dirs = _package_data(files)
    watched = sorted({*files, *data_files, *data_dirs, *(p.parent for p in files)})
    stamp = _stamp(watched)
    code = {}
    for name, (where, path) in modules.items():
        code[path.relative_to(where).as_posix()] = _module_info(where, name)[1].digest
    data = {}
    for p in data_files:
        owner = next(files[f] for f in files if f.name == "__init__.py" and p.is_relative_to(f.parent))
        data[p.relative_to(owner).as_posix()] = file_sha256(p)
    value = {
        "code": dict(sorted(code.items())),
        "package_data": dict(sorted(data.items())),
        "versions": {"python": PYTHON_VERSION, **dict(sorted(versions.items()))},
    }
    _closure_memo[key] = {"watched": watched, "stamp": stamp, "value": value}
    return value


def _stamp(paths: Sequence[Path]) -> tuple:
    out = []
    for p in paths:
        try:
            out.append(stat_identity(p.stat()))
        except OSError:  # removed: differs from any earlier stamp
            out.append(None)
    return tuple(out)


__all__ = [
    "PYTHON_VERSION",
    "code_fingerprint",
    "file_sha256",
    "import_closure",
    "module_file",
    "module_origin",
    "package_data_files",
    "stat_identity",
]
