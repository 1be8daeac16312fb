"""Backends: `sim` (embedded discrete-event simulator), `sglang` (live servers, optional extra),
`theory` (the competitive-ratio experiment on the replayer).

One place to register a backend: `BACKENDS` maps the config's `backend.name` to the module
that implements it. A backend module exposes

    run_cell(cfg: DictConfig, progress: Callable[[float], None] | None = None) -> CellResult | dict
        One grid cell. A CellResult (per-request records + provenance + timings) for the
        serving backends; a plain summary dict for backends without per-request records
        (theory).

and may expose

    validate_cell(cfg: Mapping) -> list[str]
        Extra, backend-specific configuration errors, checked for every cell before any runs.
    identity(cfg: Mapping) -> Mapping
        The result-affecting part of the cell config, if not the whole config (the run
        signature hashes it). Default: the whole resolved config.
    DETERMINISTIC = True
        Same signature and code -> the same result files, byte for byte. The harness then fills a
        cell that another experiment of the same results folder has already finished from that
        cell's files instead of running it again (repro.harness.cell). Default: False (live runs).
    PLAIN_CONFIG = True
        run_cell takes the resolved config as plain dicts and lists (a copy of its own), so the
        harness builds no DictConfig for it (about 5 ms a cell). Default: False (a DictConfig).

A serving backend puts its cell together with repro.backends.assembly (seeds, KV capacities,
scheduler, step-cost model, workload, caches, router, provenance), the same code validation
uses to check a cell without running it.

Modules are imported lazily, so `sglang` (several GB, GPU nodes only) is never imported
unless a cell asks for it. A name that contains a dot is taken as an importable module path
("pkg.module") or "pkg.module:function" — for out-of-tree backends and the test fakes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping

BACKENDS: dict[str, str] = {
    "sim": "repro.backends.sim",
    "sglang": "repro.backends.sglang.backend",
    "theory": "repro.backends.theory",
}


class UnknownBackendError(ValueError):
    pass


@dataclass(frozen=True)
class Backend:
    """What the harness needs from a backend (see the module docstring)."""

    name: str
    run_cell: Callable[..., Any]
    validate_cell: Callable[[Mapping], list[str]] | None = None
    identity: Callable[[Mapping], Mapping] | None = None
    deterministic: bool = False
    plain_config: bool = False


def backend_module_path(name: str) -> str:
    """The import path registered for `name` (no import); UnknownBackendError if none."""
    if name in BACKENDS:
        return BACKENDS[name]
    if "." in name:
        return name
    known = ", ".join(sorted(BACKENDS))
    raise UnknownBackendError(f"unknown backend {name!r}: choose one of {known} (backend=<name>)")


def get_backend(name: str) -> Backend:
    """Import and return the backend registered as `name`.

    Raises UnknownBackendError for a name that is neither registered nor an import path,
    and ImportError (with the module named) when the backend's module cannot be imported.
    """
    path = backend_module_path(name)
    module_path, _, func_name = path.partition(":")
    try:
        module: ModuleType = importlib.import_module(module_path)
    except ImportError as exc:
        raise ImportError(f"backend {name!r}: cannot import {module_path!r}: {exc}") from exc
    run = getattr(module, func_name or "run_cell", None)
    if not callable(run):
        raise UnknownBackendError(f"backend {name!r}: {module_path!r} has no callable {func_name or 'run_cell'!r}")
    return Backend(
        name=name,
        run_cell=run,
        validate_cell=getattr(module, "validate_cell", None),
        identity=getattr(module, "identity", None),
        deterministic=getattr(module, "DETERMINISTIC", False) is True,
        plain_config=getattr(module, "PLAIN_CONFIG", False) is True,
    )


__all__ = ["BACKENDS", "Backend", "UnknownBackendError", "backend_module_path", "get_backend"]
