"""Input fingerprints: what decides a cell's numbers besides its config (docs/ARCHITECTURE.md "Freshness").

A fingerprint is a plain JSON dict with four parts, each a sorted mapping:
  code          repro module file -> sha256 of its AST with docstrings dropped (comments never
                reach the AST), for the import closure of the cell's entry modules;
  package_data  non-Python files shipped next to those modules (e.g. repro/costmodel/data/*.json);
  data          the external data a cell reads (workload file sha256, given by the caller);
  versions      the distributions of the third-party packages the closure imports, and Python's
                major.minor.
and `fingerprint`, the sha256 of the four. The closure is static (ast, no import): every
`import`/`from ... import` anywhere in a module counts, inside functions too, so a lazy import
is followed; imports inside `try:` bodies (optional extras) do not count toward `versions`.
Modules named in `exclude` (tracking, figures, the harness's orchestration) are not followed.

Everything is memoised per process, keyed by file (path, size, mtime_ns): computing the
fingerprint of a whole grid costs one parse of each module (~50 ms for the simulator's closure).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from repro.fileio import sha256_file, sha256_json
from repro.results.store import CellStore

FINGERPRINT = CellStore.FINGERPRINT
FORMAT = 1


# Python as results record it: major.minor (patch releases do not change numbers; the
# fingerprint and every summary's provenance use this one value).
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]

def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_file_memo: dict[tuple[str, int, int, str], Any] = {}


def _memo_file(path: Path, kind: str, compute) -> Any:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, kind)
    if key not in _file_memo:
        _file_memo[key] = compute(path)
    return _file_memo[key]


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (memoised per process by path, size and mtime)."""

    return _memo_file(Path(path), "sha", sha256_file)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
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
    digest = _sha256_bytes(ast.dump(_strip_docstrings(tree), include_attributes=False).encode())
    return _ModuleInfo(digest, imports, optional - imports)


def _module_file(root: Path, name: str) -> tuple[Path | None, bool]:
    base = root.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None, False


def _module_info(root: Path, name: str) -> tuple[Path, _ModuleInfo] | None:
    path, is_pkg = _module_file(root, name)
    if path is None:
        return None
    return path, _memo_file(path, f"ast:{name}:{is_pkg}", lambda p: _parse_module(p, name, is_pkg))


def _excluded(name: str, exclude: Sequence[str]) -> bool:
    return any(name == e or name.startswith(e + ".") for e in exclude)


def import_closure(
    roots: Iterable[str], *, root_dir: Path, packages: Sequence[str], exclude: Sequence[str] = ()
) -> tuple[dict[str, Path], set[str], set[str]]:
    """(modules of `packages` reached from `roots` -> file, third-party top-level names, optional ones)."""
    seen: dict[str, Path] = {}
    external: set[str] = set()
    optional: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if not name or name in seen:
            continue
        top = name.split(".")[0]
        if top not in packages:
            external.add(top)
            continue
        if _excluded(name, exclude):
            continue
        found = _module_info(root_dir, name)
        if found is None:  # `from pkg import function`: the candidate `pkg.function` is no module
            continue
        path, info = found
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        todo.extend(info.imports)
        for opt in info.optional_imports:
            if opt.split(".")[0] in packages:
                todo.append(opt)
            else:
                optional.add(opt.split(".")[0])
    return seen, external, optional - external


def package_data_files(module_files: Iterable[Path]) -> list[Path]:
    """Non-Python files in the folders of the closure's packages (not in their subpackages)."""
    return _package_data(module_files)[0]


def _package_data(module_files: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(package_data_files, the data folders listed to find them)."""
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


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


@lru_cache(maxsize=None)  # installed versions do not change within a process; each lookup scans sys.path
def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def library_versions(top_level_names: Iterable[str]) -> dict[str, str]:
    """Versions of the installed distributions behind these import names (stdlib skipped)."""
    out: dict[str, str] = {"python": PYTHON_VERSION}
    dists = _distributions()
    for name in sorted(set(top_level_names)):
        if name in sys.stdlib_module_names or name == "__future__":
            continue
        for dist in dists.get(name, [name]):
            out[dist.lower()] = _version(dist)
    return out


_closure_memo: dict[tuple, dict] = {}


def code_fingerprint(
    roots: Sequence[str], *, root_dir: Path, packages: Sequence[str] = ("repro",), exclude: Sequence[str] = ()
) -> dict:
    """{code, package_data, versions} of the import closure of `roots` (memoised per process)."""
    key = (tuple(sorted(set(roots))), str(root_dir), tuple(packages), tuple(exclude))
    # A hit is re-validated by stats alone (a sweep asks once per cell): the closure's files, its
    # data files and the folders they were found in (a file added to or removed from a folder
    # changes the folder's mtime), so the closure walk runs only when something changed.
    hit = _closure_memo.get(key)
    if hit is not None and _stamp(hit["watched"]) == hit["stamp"]:
        return hit["value"]
    modules, external, _ = import_closure(roots, root_dir=root_dir, packages=packages, exclude=exclude)
    data_files, data_dirs = _package_data(modules.values())
    watched = sorted({*modules.values(), *data_files, *data_dirs, *(p.parent for p in modules.values())})
    stamp = _stamp(watched)
    code = {}
    for name, path in modules.items():
        code[path.relative_to(root_dir).as_posix()] = _module_info(root_dir, name)[1].digest
    data = {p.relative_to(root_dir).as_posix(): file_sha256(p) for p in data_files}
    value = {"code": dict(sorted(code.items())), "package_data": data, "versions": library_versions(external)}
    _closure_memo[key] = {"watched": watched, "stamp": stamp, "value": value}
    return value


def _stamp(paths: Sequence[Path]) -> tuple:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:  # removed: differs from any earlier stamp
            out.append(None)
    return tuple(out)


def finish(parts: Mapping[str, Any]) -> dict:
    """The full fingerprint dict: the parts plus `fingerprint` (sha256 of the parts) and `format`."""
    body = {k: parts[k] for k in ("code", "package_data", "data", "versions")}
    return {"format": FORMAT, "fingerprint": sha256_json(body), **body}


def differences(old: Mapping[str, Any] | None, new: Mapping[str, Any], limit: int = 4) -> list[str]:
    """Why `old` is not `new`, in words ("code: repro/routing/lbgr.py changed", ...)."""
    if not old:
        return ["no fingerprint.json (made before fingerprints were recorded, or by another tool)"]
    if old.get("fingerprint") == new.get("fingerprint"):
        return []
    out: list[str] = []
    for part in ("code", "package_data", "data", "versions"):
        a, b = old.get(part) or {}, new.get(part) or {}
        for k in sorted(set(a) | set(b)):
            if a.get(k) == b.get(k):
                continue
            if k not in a:
                out.append(f"{part}: {k} added")
            elif k not in b:
                out.append(f"{part}: {k} removed")
            elif part == "versions":
                out.append(f"versions: {k} {a[k]} -> {b[k]}")
            else:
                out.append(f"{part}: {k} changed")
    if not out:
        out.append("fingerprint format changed")
    if len(out) > limit:
        out = out[:limit] + [f"... {len(out) - limit} more"]
    return out


def read_fingerprint(cell_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(cell_dir) / FINGERPRINT).read_text())
    except (OSError, ValueError):
        return None
