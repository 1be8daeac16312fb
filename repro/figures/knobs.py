"""What a config key means on an axis or in a caption: one table of knob names and units.

`knob_label("workload.request_rate")` -> "request rate (req/s)". Keys not in the table get a
readable fallback from the key itself (last component, underscores as spaces, a unit read from the
suffix: `_s` seconds, `_tokens` tokens), never the raw dotted key. `differences(paper, override)`
says what an override folder's cells changed against the paper's folder, for its caption.
"""

from __future__ import annotations

import pandas as pd

# key -> (name, unit or "")
KNOBS: dict[str, tuple[str, str]] = {
    "workload.request_rate": ("request rate", "req/s"),
    "workload.num_queries": ("queries per run", ""),
    "workload.output_len": ("output tokens", ""),
    "workload.order": ("query order", ""),
    "workload.shared_prefix_ratio": ("shared-prefix ratio", ""),
    "workload.name": ("workload", ""),
    "cluster.num_workers": ("workers", ""),
    "cluster.kv_cache_tokens": ("KV cache per worker", "tokens"),
    "cluster.mem_fraction": ("GPU memory fraction", "%"),
    "cluster.scheduler.max_running_requests": ("max running requests per worker", ""),
    "cluster.scheduler.schedule_policy": ("schedule policy", ""),
    "cluster.scheduler.chunked_prefill_size": ("chunked prefill size", "tokens"),
    "router.decay_interval_s": ("decay interval Δt", "s"),
    "router.decay_factor": ("decay factor γ", ""),
    "router.generation": ("cache-aware rule generation", ""),
    "model.name": ("model", ""),
    "hardware.name": ("GPU", ""),
    "backend.name": ("backend", ""),
    "seed": ("seed", ""),
}
_SUFFIX_UNITS = (("_tokens", "tokens"), ("_rps", "req/s"), ("_ms", "ms"), ("_s", "s"))


def knob_name_unit(key: str) -> tuple[str, str]:
    if key in KNOBS:
        return KNOBS[key]
    last = key.rsplit(".", 1)[-1]
    for suffix, unit in _SUFFIX_UNITS:
        if last.endswith(suffix) and len(last) > len(suffix):
            return last[: -len(suffix)].replace("_", " "), unit
    return last.replace("_", " "), ""


def knob_label(key: str) -> str:
    """Axis label: "request rate (req/s)"."""
    name, unit = knob_name_unit(key)
    return f"{name} ({unit})" if unit else name


def _text(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _values(df: pd.DataFrame, col: str) -> list:
    vals = [v.item() if hasattr(v, "item") else v for v in df[col].tolist()] if col in df else []
    return sorted({v for v in vals if v is not None and v == v}, key=lambda v: (str(type(v)), v))


def differences(paper: pd.DataFrame, override: pd.DataFrame, columns: list[str]) -> list[str]:
    """["KV cache per worker: 16,384 tokens (paper: 32,768)", ...]: the config fields whose override
    values are not among the paper folder's (a subset of the paper's grid is no difference)."""
    out = []
    for col in columns:
        new, old = _values(override, col), _values(paper, col)
        if not new or set(map(str, new)) <= set(map(str, old)):
            continue
        name, unit = knob_name_unit(col)
        unit = f" {unit}" if unit and unit != "%" else ("%" if unit == "%" else "")
        was = ", ".join(map(_text, old)) if old else "not set"
        out.append(f"{name}: {', '.join(map(_text, new))}{unit} (paper: {was})")
    return out


__all__ = ["KNOBS", "differences", "knob_label", "knob_name_unit"]
