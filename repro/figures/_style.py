"""Kept for repro.figures.thm_competitive_ratio's import; the one style module is repro.figures.style."""

from repro.figures.style import apply_style, plt, save_figure

__all__ = ["apply_style", "plt", "save_figure"]
