"""The claims catalogue: claims_catalogue.yaml (data) -> Claim objects bound to their rules.

Each entry: id, artefact (results/<artefact>/), statement (the paper's claim in our words),
paper (the paper's number as printed, or "qualitative" / a theorem), rule (a name in
claims_rules.RULES) and that rule's parameters. Everything is checked when the catalogue is
read: unknown or missing keys, rule parameters, metrics, systems, duplicate ids and a `paper`
text the rule cannot read a number from are a CatalogueError naming the claim, before any
claim is evaluated.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Callable

from repro.figures.claims_evidence import Results
from repro.figures.claims_rules import GROUPS, PAPER_NUMBER, RULES
from repro.figures.claims_verdict import SHORT, Finding, pct, times
from repro.figures.style import PAPER_SYSTEMS

CATALOGUE_FILE = Path(__file__).with_name("claims_catalogue.yaml")
FIELDS = ("id", "artefact", "statement", "paper", "rule")
SYSTEM_PARAMS = ("system", "base", "ours", "against")  # rule parameters that name systems
METRIC_PARAMS = ("metric", "metrics")
EXTRA_COLUMNS = ("eviction_ms_per_query", "routing_ms_per_query")  # per-cell columns a rule may compare


class CatalogueError(ValueError):
    """claims_catalogue.yaml holds an entry the engine cannot evaluate."""


@dataclass(frozen=True)
class Claim:
    id: str
    artefact: str
    statement: str
    paper: str
    evaluate: Callable[[Results], Finding]
    rule: str = ""  # the claims_rules.RULES name it was built from


_NUMBER = re.compile(r"^([+−-]?)(\d+(?:\.\d+)?)\s*(×|%|ms)$")


def paper_number(text: str) -> tuple[int, Decimal, str]:
    """'11.96×' -> (+1, 11.96, '×'); '−38 %' -> (-1, 38, '%'); '+0.58 ms' -> (+1, 0.58, 'ms')."""
    m = _NUMBER.match(text.strip())
    if not m:
        raise ValueError(f"no number in {text!r} (expected e.g. 11.96×, +36.45 %, −38 %, +0.58 ms)")
    sign = -1 if m.group(1) in ("−", "-") else 1
    return sign, Decimal(m.group(2)), m.group(3)


def _paper_params(kind: str, text: str) -> dict:
    """The rule's paper-number arguments from the `paper` text (Decimal: "44.87 %" gives exactly
    the float 0.4487, as if written as a literal)."""
    sign, mag, unit = paper_number(text)
    if kind == "ratio_or_change" and unit == "×" and sign > 0:
        return {"paper": float(mag), "fmt": times}
    if kind == "ratio_or_change" and unit == "%":
        return {"paper": sign * float(mag / 100), "fmt": pct}
    if kind == "reduction" and unit == "%" and sign < 0:
        return {"paper": float(mag / 100)}
    if kind == "ms" and unit == "ms" and sign > 0:
        return {"paper_ms": float(mag)}
    raise ValueError(f"{text!r} is not a {kind.replace('_', ' ')} number")


def _check_values(key: str, value) -> object:
    if key in SYSTEM_PARAMS:
        if key == "against" and isinstance(value, str):
            if value not in GROUPS:
                raise ValueError(f"against: {value!r} is no group (known: {', '.join(GROUPS)})")
            return GROUPS[value]
        names = [value] if isinstance(value, str) else list(value)
        unknown = [s for s in names if s not in PAPER_SYSTEMS]
        if unknown:
            raise ValueError(f"{key}: {unknown} not among the paper's systems {list(PAPER_SYSTEMS)}")
        return value if isinstance(value, str) else tuple(value)
    if key in METRIC_PARAMS:
        names = [value] if isinstance(value, str) else list(value)
        unknown = [m for m in names if m not in SHORT]
        if unknown:
            raise ValueError(f"{key}: unknown metric(s) {unknown} (known: {', '.join(SHORT)})")
        return value if isinstance(value, str) else tuple(value)
    if key == "column" and value not in EXTRA_COLUMNS:
        raise ValueError(f"column: {value!r} is not one of {', '.join(EXTRA_COLUMNS)}")
    return value


def make_claim(entry: dict, artefacts=None) -> Claim:
    """One catalogue entry -> Claim (CatalogueError on anything the engine cannot evaluate)."""
    cid = entry.get("id", "?") if isinstance(entry, dict) else "?"
    try:
        if not isinstance(entry, dict):
            raise ValueError(f"an entry must be a mapping, not {type(entry).__name__}")
        missing = [k for k in FIELDS if k not in entry]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if artefacts is not None and entry["artefact"] not in artefacts:
            raise ValueError(f"artefact {entry['artefact']!r} is not a figure/table (repro.figures.ARTEFACTS)")
        rule = entry["rule"]
        if rule not in RULES:
            raise ValueError(f"rule {rule!r} unknown (known: {', '.join(RULES)})")
        params = {k: v for k, v in entry.items() if k not in FIELDS}
        kwargs = {k: _check_values(k, v) for k, v in params.items()}
        if rule in PAPER_NUMBER:
            kwargs.update(_paper_params(PAPER_NUMBER[rule], str(entry["paper"])))
        try:
            inspect.signature(RULES[rule]).bind(entry["artefact"], **kwargs)
        except TypeError as exc:
            raise ValueError(f"rule {rule}: {exc}") from None
        evaluate = RULES[rule](entry["artefact"], **kwargs)
    except ValueError as exc:
        raise CatalogueError(f"{CATALOGUE_FILE.name}: claim {cid}: {exc}") from None
    return Claim(str(entry["id"]), str(entry["artefact"]), str(entry["statement"]), str(entry["paper"]), evaluate, rule)


def load_catalogue(path: Path = CATALOGUE_FILE) -> tuple[Claim, ...]:
    import yaml

    from repro.figures import ARTEFACTS

    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CatalogueError(f"{path.name}: expected a top-level `claims:` list")
    claims = tuple(make_claim(e, ARTEFACTS) for e in entries)
    ids = [c.id for c in claims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise CatalogueError(f"{path.name}: duplicate claim ids {dup}")
    return claims


CLAIMS: tuple[Claim, ...] = load_catalogue()
