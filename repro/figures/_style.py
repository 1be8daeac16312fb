"""Shared plot style and deterministic saving for every figure module (reads nothing but results/)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; the same bytes on every machine with the same versions
import matplotlib.pyplot as plt  # noqa: E402

from repro.results.store import atomic_write_bytes  # noqa: E402

# Fixed metadata: no creation dates or version strings, so re-rendering gives identical files.
_PNG_META = {"Software": None}
_PDF_META = {"Creator": None, "Producer": None, "CreationDate": None}


def apply_style() -> None:
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 150, "font.size": 9, "svg.hashsalt": "repro"})


def save_figure(fig, figures_dir: str | Path, name: str) -> list[Path]:
    """Write figures_dir/name.png and .pdf atomically; returns their paths."""
    import io

    out = []
    for ext, meta in (("png", _PNG_META), ("pdf", _PDF_META)):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=meta, bbox_inches="tight")
        out.append(atomic_write_bytes(Path(figures_dir) / f"{name}.{ext}", buf.getvalue()))
    plt.close(fig)
    return out
