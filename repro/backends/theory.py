"""Backend `theory`: one competitive-ratio cell on the trace replayer (repro.theory).

The cell's parameters are the config's `theory` node (construction, B - L + 1, L, beta,
policy, seeds, phases, ...: defined by repro.theory); `seed` is added from the top-level
seed when the node does not set it. Its result is a plain summary dict (no per-request
records). The run signature hashes these parameters only — not the unused serving config —
so the same cell run by `python -m repro.theory.competitive_ratio` (which signs its params
the same way) lands in the same results/<exp>/<sig>/ folder.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


def _plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return node


def theory_params(cfg: Mapping) -> dict:
    params = _plain(cfg.get("theory"))
    if not isinstance(params, Mapping):
        raise ValueError("backend=theory needs a `theory:` node with the cell's parameters")
    params = dict(params)
    params.setdefault("seed", _plain(cfg.get("seed", 0)))
    return params


def identity(cfg: Mapping) -> Mapping:
    return theory_params(cfg)


def validate_cell(cfg: Mapping) -> list[str]:
    try:
        params = theory_params(cfg)
    except ValueError as exc:
        return [str(exc)]
    if not params:
        return ["theory: the `theory:` node is empty"]
    try:
        import repro.theory as theory
    except ImportError as exc:  # pragma: no cover - the package exists in the skeleton
        return [f"backend=theory: cannot import repro.theory ({exc})"]
    validate = getattr(theory, "validate_params", None)
    if callable(validate):
        try:
            validate(params)
        except (ValueError, TypeError, KeyError) as exc:
            return [f"theory: {exc}"]
    elif not callable(getattr(theory, "run_theory_cell", None)):
        return ["backend=theory: repro.theory.run_theory_cell is not available (not merged yet?)"]
    return []


def run_cell(cfg: Mapping, progress: Callable[[float], None] | None = None) -> dict:
    from repro.theory import run_theory_cell

    result = dict(run_theory_cell(theory_params(cfg)))
    if progress is not None:
        progress(1.0)
    return result
