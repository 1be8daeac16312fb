"""Provenance sentences for captions, computed from the cells a figure or table shows.

Every caption says: the protocol (repro.figures.protocols), the backend, the workload(s) (sim = this repository's discrete-event simulator, sglang =
real SGLang servers), the model (weight dtype, tensor parallelism) and GPU, the seeds (and
that values are mean ± SD over them when there are several), any synthetic stand-in data
(workload provenance `synthetic: true`), the tokenizer, and the ShareGPT truncation note
when the packaged file was cut short (`file_truncated: true`), and how many cells are stale
(repro.harness.freshness: made by other code/data than this checkout; kept by keep_stale=true).
"""

from __future__ import annotations

import pandas as pd

BACKEND_WORDS = {
    "sim": "sim (discrete-event simulator; step costs from the cost model fitted on measured H200 profiles)",
    "sglang": "sglang (real SGLang servers)",
    "theory": "theory (single-worker trace replayer)",
}


def _unique(df: pd.DataFrame, col: str) -> list:
    if col not in df:
        return []
    vals = [v for v in df[col].tolist() if v is not None and not (isinstance(v, float) and v != v)]
    return sorted(set(vals), key=str)


def _truthy(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(False, index=df.index)
    return df[col].map(lambda v: v is True or v == 1 or str(v).lower() == "true")


def backends(df: pd.DataFrame) -> list[str]:
    found = _unique(df, "prov.backend") or _unique(df, "backend.name")
    if not found and any(str(c).startswith("repro.theory") for c in _unique(df, "prov.code")):
        found = ["theory"]  # cells written by python -m repro.theory.competitive_ratio
    return [str(b) for b in found]


def workloads_text(df: pd.DataFrame) -> str:
    """ "workload: gsp" (every caption names its benchmark, issue 42)."""
    names = [str(w) for w in _unique(df, "workload.name")]
    if not names:
        return ""
    return ("workload: " if len(names) == 1 else "workloads: ") + ", ".join(names)


def model_gpu(df: pd.DataFrame) -> str:
    parts = []
    cols = [c for c in ("model.name", "model.weight_dtype", "model.tensor_parallel", "hardware.name") if c in df]
    if "model.name" not in cols:
        return ""
    for key, _ in df.groupby(cols, sort=True, dropna=False):
        d = dict(zip(cols, key if isinstance(key, tuple) else (key,)))
        extra = []
        if d.get("model.weight_dtype") not in (None, "bf16") and d.get("model.weight_dtype") == d.get(
            "model.weight_dtype"
        ):
            extra.append(f"{d['model.weight_dtype']} weights")
        tp = d.get("model.tensor_parallel")
        if tp not in (None, 1) and tp == tp:
            extra.append(f"TP={int(tp)}")
        text = str(d["model.name"]) + (f" ({', '.join(extra)})" if extra else "")
        if d.get("hardware.name") is not None:
            text += f" on {d['hardware.name']}"
        parts.append(text)
    return "; ".join(dict.fromkeys(parts))


def seeds_text(df: pd.DataFrame, point_keys: list[str]) -> str:
    seeds = _unique(df, "seed")
    if not seeds:
        return ""
    per_point = df.groupby(point_keys, dropna=False).size().max() if point_keys else len(df)
    listed = ", ".join(str(int(s)) for s in seeds)
    if per_point > 1:
        return f"mean ± SD over seeds {listed}"
    return f"seed {listed}" if len(seeds) == 1 else f"one seed per point (seeds {listed})"


def data_text(df: pd.DataFrame) -> list[str]:
    out = []
    names = "workload.name" if "workload.name" in df else None
    synthetic = df[_truthy(df, "prov.workload.synthetic")]
    if len(synthetic):
        wl = sorted(set(synthetic[names])) if names else ["?"]
        out.append("SYNTHETIC stand-in data (not the real dataset) for: " + ", ".join(map(str, wl)))
    trunc = df[_truthy(df, "prov.workload.file_truncated")]
    if len(trunc):
        # rows_read counts the record cut in half too (it is one of malformed_rows)
        complete = {
            int(r) - int(m if m == m and m is not None else 0)  # NaN: a pool that read no malformed row
            for r, m in zip(
                trunc.get("prov.workload.rows_read", []), trunc.get("prov.workload.malformed_rows", [0] * len(trunc))
            )
            if r == r and r is not None
        }
        n = (
            f"its first {complete.pop():,} complete conversations"
            if len(complete) == 1
            else "the complete conversations before the cut"
        )
        out.append(f"ShareGPT: the packaged file is cut at ~120 MB; results use {n}")
    tok = _unique(df, "prov.workload.tokenizer.kind")
    if tok:
        names_tok = _unique(df, "prov.workload.tokenizer.name")
        out.append("tokenizer: " + ", ".join(map(str, names_tok or tok)))
    return out


def integrity_notes(df: pd.DataFrame, shown: int = 6) -> list[str]:
    """The cells a figure would read but cannot vouch for, by name: folders without summary.json
    (failed, unfinished, emptied: their points average fewer seeds) and cells without a manifest."""

    def names(sigs: list[str]) -> str:
        return ", ".join(sigs[:shown]) + (f" and {len(sigs) - shown} more" if len(sigs) > shown else "")

    out = []
    unfinished = sorted(df.attrs.get("unfinished") or [])
    if unfinished:
        out.append(
            f"INCOMPLETE: {len(unfinished)} cell(s) not finished (failed, interrupted or emptied), "
            f"left out of the points: {names(unfinished)}"
        )
    if "unsealed" in df:
        unsealed = sorted(df.loc[_truthy(df, "unsealed"), "signature"].astype(str))
        if unsealed:
            out.append(
                f"UNSEALED: {len(unsealed)} cell(s) without a checksum manifest, their numbers unchecked "
                f"(edited by hand?): {names(unsealed)}"
            )
    return out


def protocol_text(df: pd.DataFrame) -> str:
    """ "Protocol: artifact (the authors' scripts: ...)" for the protocols of the cells shown."""
    from repro.figures.load import DEFAULT_PROTOCOL, PROTOCOL
    from repro.figures.protocols import PROTOCOL_WORDS

    found = _unique(df, PROTOCOL) or ([DEFAULT_PROTOCOL] if len(df) else [])
    if not found:
        return ""
    return "Protocol: " + "; ".join(PROTOCOL_WORDS.get(str(p), str(p)) for p in found)


def provenance_caption(df: pd.DataFrame, point_keys: list[str]) -> str:
    """One line: protocol; backend; model/GPU; seeds; data notes."""
    parts = []
    proto = protocol_text(df)
    if proto:
        parts.append(proto)
    b = backends(df)
    if b:
        parts.append("Backend: " + ", ".join(BACKEND_WORDS.get(x, x) for x in b))
    wl = workloads_text(df)
    if wl:
        parts.append(wl)
    mg = model_gpu(df)
    if mg:
        parts.append("model/GPU: " + mg)
    s = seeds_text(df, point_keys)
    if s:
        parts.append(s)
    parts.extend(data_text(df))
    parts.extend(integrity_notes(df))
    stale = int(_truthy(df, "stale").sum())
    if stale:
        parts.append(
            f"STALE: {stale} of {len(df)} cells were computed by other code, data or library versions "
            f"than this checkout's (`python -m repro.results status`; a rerun of the experiment recomputes them)"
        )
    return ". ".join(parts) + "."
