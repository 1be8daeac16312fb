"""One W&B run per figures build: every rendered figure (image), table (W&B Table) and the claims.

Called by `python -m repro.figures` (so `make figures`) after it has rendered; reads only what
it wrote into the figures folder: <name>.png (+ .caption.txt) as images under `figures/<name>`,
<name>.csv or the markdown table of <name>.md as W&B Tables under `tables/<name>`, and the
claims table (repro.figures.claims.evaluate) under `claims`, with its verdict counts in the
summary. project = the results' tracking.project, group `figures`, job_type `figures`, run id
`figures-<results root id>-<UTC time>` (one run per build), tags `figures` and the root id.
Uses the SDK (images, tables); W&B trouble warns and never fails the figures build.
"""

from __future__ import annotations

import os
import re
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from repro.tracking import runs


def markdown_table(text: str):
    """The first pipe table of a markdown text as a DataFrame (None if there is none)."""
    import pandas as pd

    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    rows = [r for r in rows if not all(re.fullmatch(r":?-+:?", c or "-") for c in r)]
    if len(rows) < 2:
        return None
    return pd.DataFrame(rows[1:], columns=rows[0])


def artefacts(figures_dir: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """name -> {"image": png path, "caption": text, "table": DataFrame} for what exists."""
    import pandas as pd

    out: dict[str, dict[str, Any]] = {}
    for name in names:
        item: dict[str, Any] = {}
        cap = figures_dir / f"{name}.caption.txt"
        if cap.is_file():
            item["caption"] = cap.read_text().strip()
        if (figures_dir / f"{name}.png").is_file():
            item["image"] = figures_dir / f"{name}.png"
        if (figures_dir / f"{name}.csv").is_file():
            item["table"] = pd.read_csv(figures_dir / f"{name}.csv")
        elif (figures_dir / f"{name}.md").is_file():
            table = markdown_table((figures_dir / f"{name}.md").read_text())
            if table is not None:
                item["table"] = table
        if item:
            out[name] = item
    return out


def log_figures_run(
    results_dir: str | Path,
    figures_dir: str | Path,
    names: Iterable[str],
    claims=None,
    *,
    mode: str = "offline",
    project: str | None = None,
    entity: str | None = None,
) -> Path | None:
    """Log the build; returns the run's directory (None when disabled or W&B failed)."""
    if mode == "disabled":
        return None
    figures_dir = Path(figures_dir)
    items = artefacts(figures_dir, names)
    try:
        import wandb

        root = runs.root_id(results_dir)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d_%H%M%S")
        saved = {v: os.environ.get(v) for v in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}
        wdir = figures_dir / "wandb"
        for v, sub in zip(saved, ("cache", "config", "data")):
            os.environ[v] = str(wdir / sub)
        try:
            run = wandb.init(
                project=project or "repro",
                entity=entity,
                group="figures",
                job_type="figures",
                id=f"figures-{root}-{stamp}",
                name=f"figures · {stamp}",
                tags=["figures", f"root:{root}"],
                dir=str(figures_dir),
                mode=mode,
                config={"results_dir": str(results_dir), "artefacts": sorted(items)},
                settings=wandb.Settings(
                    console="off",
                    silent=True,
                    x_disable_stats=True,
                    disable_git=True,
                    save_code=False,
                    x_save_requirements=False,
                ),
            )
            payload: dict[str, Any] = {}
            for name, item in items.items():
                if "image" in item:
                    payload[f"figures/{name}"] = wandb.Image(str(item["image"]), caption=item.get("caption"))
                if "table" in item:
                    payload[f"tables/{name}"] = wandb.Table(dataframe=item["table"].astype(str))
            if claims is not None:
                payload["claims"] = wandb.Table(dataframe=claims.astype(str))
                run.summary["claims_verdicts"] = {str(k): int(v) for k, v in claims["verdict"].value_counts().items()}
            run.log(payload)
            run.summary["artefacts"] = len(items)
            run_dir = Path(run.dir).parent
            run.finish()
            wandb.teardown()
            return run_dir
        finally:
            for v, old in saved.items():
                if old is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = old
    except Exception as exc:
        warnings.warn(
            f"W&B figures run failed ({type(exc).__name__}: {exc}); the figures are unaffected",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


__all__ = ["artefacts", "log_figures_run", "markdown_table"]
