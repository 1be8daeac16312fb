"""The Why column of the claims table: hand-written texts (claims_why.yaml) and their stamps.

Prose is data, not code: claims_why.yaml holds notes (shared, cited as [key]) and, per claim
id and verdict, the text and the STAMP of the results it was written against. A stamp is a
digest of the artefacts' plotted numbers (every point's seed means of the six metrics, 3
significant digits, and its seed list): regenerate the results with different numbers and
every text written for the old ones is flagged stale instead of shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from repro.figures.claims_evidence import NO_DATA_ERRORS, PER_SEED, Results
from repro.figures.claims_verdict import ABSENT, NO_DATA, REPRODUCED

WHY_FILE = Path(__file__).with_name("claims_why.yaml")
STAMP_DIGITS = 3


@dataclass(frozen=True)
class Why:
    text: str
    stamp: str = ""  # digest of the results of `about` the text was written against ("" = never stamped)
    about: tuple[str, ...] = ()  # artefacts whose numbers it quotes (default: the claim's artefact)


def load_why(path: Path = WHY_FILE) -> tuple[dict[str, Why], dict[str, dict[str, Why]]]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    notes = {
        k: Why(v["text"], str(v.get("stamp") or ""), tuple(v.get("about") or ()))
        for k, v in (data.get("notes") or {}).items()
    }
    why_ = {
        cid: {
            verdict: Why(e["text"], str(e.get("stamp") or ""), tuple(e.get("about") or ()))
            for verdict, e in per.items()
        }
        for cid, per in (data.get("why") or {}).items()
    }
    return notes, why_


NOTES, WHY = load_why()


def note_text(v) -> str:
    return v.text if isinstance(v, Why) else str(v)


def artefact_digest(r: Results, name: str) -> str:
    """Digest of one artefact's plotted numbers ("" when it has no results)."""
    import hashlib

    try:
        agg = r.theory() if name == "thm_competitive_ratio" else r.perf(name)
    except NO_DATA_ERRORS:
        return ""
    drop = {PER_SEED} | {c for c in agg.columns if c.endswith("_sd")}
    cols = sorted(c for c in agg.columns if c not in drop)
    lines = []
    for _, row in agg.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, (float, np.floating)):
                v = "nan" if not math.isfinite(v) else f"{float(v):.{STAMP_DIGITS}g}"
            cells.append(f"{c}={v}")
        lines.append("|".join(cells))
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]


def stamp_of(r: Results, artefacts: Iterable[str]) -> str:
    import hashlib

    parts = [f"{a}:{r.stamp_cache.setdefault(a, artefact_digest(r, a))}" for a in sorted(set(artefacts))]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:10]


def _stale(stamp_now: str, entry: Why) -> bool:
    return entry.stamp != stamp_now


STALE_HINT = "`python -m repro.figures.claims --stale`"


def why(claim_id: str, verdict: str, stamp_now: str | None = None) -> str:
    """The Why cell: the text written for this verdict AND these numbers, else a flag saying so."""
    texts = WHY.get(claim_id, {})
    if verdict in texts:
        entry = texts[verdict]
        if isinstance(entry, str):  # plain text (tests): no stamp to check
            return entry
        if stamp_now is not None and _stale(stamp_now, entry):
            return (
                f"(stale: the explanation on file was written for other results, stamp {entry.stamp or 'none'} "
                f"vs {stamp_now} now; list: {STALE_HINT})"
            )
        return entry.text
    if verdict in (REPRODUCED, ABSENT):
        return ""
    if verdict == NO_DATA:
        return "results missing: run `make figures`"
    if texts:
        return f"(verdict changed; the explanation on file was written for: {', '.join(texts)})"
    return "not analysed yet"


def why_about(claim, entry) -> tuple[str, ...]:
    """The artefacts a claim's Why text quotes (its `about`, default the claim's own artefact)."""
    return tuple(getattr(entry, "about", ()) or ()) or (claim.artefact,)


def stale_entries(table: pd.DataFrame) -> list[dict]:
    """Every Why text / note that is not current for these results: what to rewrite."""
    out = []
    for _, row in table.iterrows():
        if row["verdict"] in (NO_DATA, ABSENT):
            continue
        texts = WHY.get(row["id"], {})
        entry = texts.get(row["verdict"])
        if entry is None:
            if texts or row["verdict"] != REPRODUCED:
                out.append(
                    {
                        "kind": "why",
                        "id": row["id"],
                        "verdict": row["verdict"],
                        "reason": f"no text for this verdict (on file: {', '.join(texts) or 'none'})",
                        "ours": row["ours"],
                        "stamp": row["stamp"],
                    }
                )
        elif isinstance(entry, Why) and _stale(row["stamp"], entry):
            out.append(
                {
                    "kind": "why",
                    "id": row["id"],
                    "verdict": row["verdict"],
                    "reason": f"written for stamp {entry.stamp or 'none'}, results now {row['stamp']}",
                    "ours": row["ours"],
                    "stamp": row["stamp"],
                    "text": entry.text,
                }
            )
    for k, stamp in table.attrs.get("note_stamps", {}).items():
        if NOTES[k].stamp != stamp:
            out.append(
                {
                    "kind": "note",
                    "id": k,
                    "verdict": "",
                    "reason": f"written for stamp {NOTES[k].stamp or 'none'}, results now {stamp}",
                    "ours": "",
                    "stamp": stamp,
                    "text": NOTES[k].text,
                }
            )
    return out


def stamp_entries(table: pd.DataFrame, ids: Iterable[str], path: Path = WHY_FILE) -> list[str]:
    """Record today's stamp on the texts of `ids` (claim ids or note keys) for today's verdicts;
    returns what was stamped. A claim without a text for today's verdict cannot be stamped."""
    import yaml

    data = yaml.safe_load(path.read_text())
    by_id = table.set_index("id")
    done = []
    for i in ids:
        if i in data.get("notes", {}):
            data["notes"][i]["stamp"] = table.attrs["note_stamps"][i]
            done.append(i)
            continue
        if i not in by_id.index:
            raise KeyError(f"unknown claim id or note {i!r}")
        verdict = by_id.loc[i, "verdict"]
        entry = data.get("why", {}).get(i, {}).get(verdict)
        if entry is None:
            raise KeyError(f"{i}: no text for today's verdict {verdict!r} in {path.name}: write it first")
        entry["stamp"] = by_id.loc[i, "stamp"]
        done.append(i)
    write_why(data, path)
    return done


WHY_HEADER = """\
# Hand-written explanations of the claims table (the claims: claims_catalogue.yaml; repro/figures/claims.py
# evaluates everything else).
# notes: shared explanations cited as [key]; why: claim id -> verdict it was written for -> text.
# stamp: digest of the results the text was written against (the artefacts in `about`, default
# the claim's own; notes default to fig2_main). After regenerating results, list what needs
# rewriting with `python -m repro.figures.claims --stale`, rewrite the texts here, then record
# the new numbers with `python -m repro.figures.claims --stamp ID [ID ...]`.
"""


def write_why(data: dict, path: Path = WHY_FILE) -> None:
    import yaml

    from repro.fileio import write_atomic

    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)
    write_atomic(path, WHY_HEADER + body)
