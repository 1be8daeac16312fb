"""The signatures each project experiment's current grid produces (`python -m repro.results prune`):
conf/exp/<exp>.yaml expanded and composed as `python -m repro.run +exp=<exp>` does (no validation:
only the signatures are needed)."""

from __future__ import annotations

from typing import Sequence


def grid_signatures(exps: Sequence[str]) -> dict[str, set[str] | str]:
    """{exp: its grid's signatures, or the error that stopped its composition (text)}."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import repro.harness.schema  # noqa: F401  (registers the structured schema before composition)
    from repro.confutil import CONF_DIR
    from repro.harness.compose import GridComposer, compose_cells
    from repro.harness.grid import expand_grid, split_sweep_overrides

    out: dict[str, set[str] | str] = {}
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composer = GridComposer("config")
        for exp in exps:
            if not (CONF_DIR / "exp" / f"{exp}.yaml").is_file():
                continue
            try:
                plain, _ = split_sweep_overrides([f"exp={exp}"])
                head = compose(config_name="config", overrides=plain, return_hydra_config=True)
                sp = head.hydra.sweeper.get("params")
                params = OmegaConf.to_container(sp, resolve=True) if sp is not None else None
                cells = expand_grid(params, [f"exp={exp}"])
                compose_cells(cells, composer)
                out[exp] = {str(c.signature) for c in cells}
            except Exception as exc:  # a grid that does not compose: nothing of it is called foreign
                out[exp] = f"{type(exc).__name__}: {exc}"
    return out
