"""The paper's §5 claims, evaluated on our results: a generated table, never written by hand.

Every claim has an id, the artefact it is about, the paper's statement and number, and a
verdict rule with its parameters — all data, in claims_catalogue.yaml — and the rule computes
our number and a verdict from results/ (through the same tables the figures draw). Only the
"why" column is prose, from claims_why.yaml keyed by claim id and verdict, each text stamped
with the results it was written for: an explanation written for another verdict, or for other
numbers, than today's is not shown as current.

The engine, one module per seam: claims_verdict (paired comparisons, verdict rules, number
formats), claims_evidence (the numbers: results/ tables with per-seed values), claims_rules
(the verdict rules a catalogue entry names), claims_catalogue (reads and checks the catalogue),
claims_why (Why texts and stamps); this module evaluates the catalogue into the table.

Definitions (stated in REPRODUCE.md too):
- "On average" = the arithmetic mean over benchmarks (or models) of the per-benchmark ratio,
  each ratio taken between seed-averaged metrics — our reading of the paper's averages.
- A× improvement in a lower-is-better metric = baseline / ours; "+x % higher hit rate /
  throughput" = relative change ours / baseline − 1 (not percentage points); "−x %" latency =
  1 − ours / baseline.
- Verdicts. Qualitative claims: "reproduced" if they hold in every comparison, "partly" if in
  at least half, else "not reproduced". Numeric claims: "reproduced" if ours points the same
  way and is within a factor 2 of the paper's number (ratios: our improvement factor; percent:
  our change), "partly" if it only points the same way, else "not reproduced". Overheads
  ("RLT adds only 0.58 ms"): "reproduced" if our added overhead is at most twice the paper's.
- Only the paper's six systems take part in comparisons (extra rows such as Dynamo or llm-d are
  drawn but not judged).
- Comparisons know the seed noise. Two systems at one point are compared on the seeds both
  ran: d_s = (a_s − b_s) per seed, signed so that d > 0 means "a is better". With n ≥ 2 seeds,
  a is better (a WIN) only if mean(d) > K_SE (2) standard errors of d (SD(d) / √n, a paired
  comparison: the seeds' shared workload draws cancel), worse (a LOSS) if mean(d) < −2 SE,
  otherwise a TIE. (2 SE is a rough two-sided 95 % band for many seeds; with 3 seeds it is a
  paired t-test at about 82 %.) With one seed there is no noise estimate: the comparison is
  strict (any difference decides), and the Ours column counts how many comparisons rest on
  one seed. Throughput within TPUT_TIE (0.5 %) counts as "not worse" (a WIN for "highest" /
  "not worse"), because every system that keeps up runs at the offered load and differs only
  by the makespan's tail.
- Qualitative verdicts from W wins, T ties, L losses of N comparisons: "reproduced" if W = N,
  "not reproduced" if W = 0 or W < L, else "partly" (without ties: the old "holds in at
  least half"). Numeric claims: the per-seed value of
  the claim's statistic (e.g. the mean over benchmarks of the per-benchmark ratio, per seed)
  must differ from "no change" (1× / 0 %) by more than 2 SE over seeds, else the claim is a
  tie and "not reproduced" (the Ours column says "tie within noise").
- The Load regime column says where a claim's numbers come from: the regime (summary.json
  `regime`, a point as its worst seed) of every point row its rule read — "stable", or the
  systems per non-stable regime after "k of n compared points stable"; "n/a" without regimes
  (theory cells).
- The Why column is prose written for given numbers: each text carries a stamp (a digest of
  the results of the artefacts it is about, repro/figures/claims_why.yaml); a text whose stamp
  differs from today's results is not shown as current but flagged "stale".
  `python -m repro.figures.claims --stale` lists the texts to rewrite, `--stamp ID ...` stamps
  rewritten ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from repro.figures import claims_why  # its WHY / NOTES are read at call time (tests replace them)
from repro.figures.claims_catalogue import CLAIMS, Claim, load_catalogue
from repro.figures.claims_evidence import NO_DATA_ERRORS, Results, compared_regimes, regime_text
from repro.figures.claims_rules import RULES, mean_ratio
from repro.figures.claims_verdict import (
    ABSENT,
    K_SE,
    LOSS,
    NO_DATA,
    NOT,
    PARTLY,
    REPRODUCED,
    TIE,
    VERDICTS,
    WIN,
    Checks,
    Finding,
    compare,
    numeric,
    paired,
    pct,
    qualitative,
    times,
)
from repro.figures.load import PROTOCOLS, protocol_view, protocols_present
from repro.figures.claims_why import (
    WHY_FILE,
    Why,
    load_why,
    stamp_entries,
    stamp_of,
    stale_entries,
    why_about,
    write_why,
)
from repro.figures.style import PAPER_SYSTEMS


WHY_PROTOCOL = "text"  # the protocol the Why texts (claims_why.yaml) and their stamps are written for


def _present(results_dir: Path, artefact: str) -> set[str]:
    """The protocols of the claim folder's cells (none when it cannot be read: the rule says why)."""
    try:
        return set(protocols_present(results_dir, artefact))
    except NO_DATA_ERRORS:
        return set()


def evaluate(results_dir: str | Path, claims: Iterable[Claim] | None = None) -> pd.DataFrame:
    """One row per claim: id, artefact, claim, paper; per protocol p (load.PROTOCOLS) `ours:p`,
    `verdict:p` and `regime:p` (of the points it compared: claims_evidence.regime_text), each
    computed on that protocol's cells alone (load.protocol_view), ABSENT where p has no cells in
    the claim's folder; `ours`, `verdict`, `regime` repeat WHY_PROTOCOL's, whose verdict keys the
    why text; stamp (of the numbers that Why text must have been written against, on
    WHY_PROTOCOL's cells)."""
    claims = list(CLAIMS if claims is None else claims)
    results_dir = Path(results_dir)
    present = {a: _present(results_dir, a) for a in dict.fromkeys(c.artefact for c in claims)}
    rows = [{"id": c.id, "artefact": c.artefact, "claim": c.statement, "paper": c.paper} for c in claims]
    note_stamps: dict[str, str] = {}
    for protocol in PROTOCOLS:
        with protocol_view(protocol):
            r = Results(results_dir)
            for c, row in zip(claims, rows):
                if present[c.artefact] and protocol not in present[c.artefact]:
                    f, regime = Finding(ABSENT, ABSENT), ABSENT
                else:
                    with compared_regimes() as seen:
                        try:
                            f = c.evaluate(r)
                        except NO_DATA_ERRORS as exc:
                            reason = str(exc).split("\n")[0]
                            f = Finding(f"no data ({reason[:160]})", NO_DATA)
                    regime = regime_text(seen)
                row.update({f"ours:{protocol}": f.ours, f"verdict:{protocol}": f.verdict, f"regime:{protocol}": regime})
                if protocol == WHY_PROTOCOL:
                    entry = claims_why.WHY.get(c.id, {}).get(f.verdict)
                    stamp = stamp_of(r, why_about(c, entry))
                    row.update(
                        ours=f.ours,
                        verdict=f.verdict,
                        regime=regime,
                        why=claims_why.why(c.id, f.verdict, stamp),
                        stamp=stamp,
                        per_seed=f.per_seed,
                    )
                row[f"per_seed:{protocol}"] = f.per_seed
            if protocol == WHY_PROTOCOL:
                note_stamps = {
                    k: stamp_of(r, v.about or ("fig2_main",)) for k, v in claims_why.NOTES.items() if isinstance(v, Why)
                }
    table = pd.DataFrame(rows)
    table.attrs["note_stamps"] = note_stamps
    return table


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def protocols_of(table: pd.DataFrame) -> list[str]:
    """The protocols the table has columns for, in PROTOCOLS order."""
    return [p for p in PROTOCOLS if f"verdict:{p}" in table]


def verdict_counts(table: pd.DataFrame, protocol: str) -> str:
    counts = table[f"verdict:{protocol}"].value_counts()
    text = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    absent = int(counts.get(ABSENT, 0))
    return text + (f", {absent} without cells ({ABSENT})" if absent else "")


def regime_cell(row: pd.Series, protocols: list[str]) -> str:
    """The Load regime column: each protocol's, where it has cells ("artifact: stable · text: ...")."""
    parts = [(p, row[f"regime:{p}"]) for p in protocols if row[f"regime:{p}"] != ABSENT]
    if len(parts) == 1 and len(protocols) == 1:
        return str(parts[0][1])
    return " · ".join(f"{p}: {r}" for p, r in parts) or ABSENT


def to_markdown(table: pd.DataFrame) -> str:
    """The claims table as Markdown: one column of numbers and one of verdicts per protocol
    (deterministic text; what --check compares)."""
    protocols = protocols_of(table)
    head = "; ".join(f"{p} protocol: {verdict_counts(table, p)}" for p in protocols)
    columns = ["ID", "Claim", "Paper"]
    for p in protocols:
        columns += [f"Ours ({p})", f"Verdict ({p})"]
    columns += ["Load regime", f"Why ({WHY_PROTOCOL} protocol)"]
    lines = [
        f"{len(table)} claims. {head}.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join(":---" for _ in columns) + "|",
    ]
    for _, row in table.iterrows():
        cells = [f"`{row['id']}`", row["claim"], row["paper"]]
        for p in protocols:
            v = row[f"verdict:{p}"]
            cells += [row[f"ours:{p}"], v if v == ABSENT else f"**{v}**"]
        cells += [regime_cell(row, protocols), row["why"]]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    used = cited_notes(" ".join(table["why"]))
    if used:
        lines += ["", "Notes cited in the Why column:", ""]
        stamps = table.attrs.get("note_stamps", {})
        for k in used:
            v = claims_why.NOTES[k]
            flag = (
                " *(stale: written for other results)*"
                if isinstance(v, Why) and stamps.get(k, v.stamp) != v.stamp
                else ""
            )
            lines.append(f"- **[{k}]**{flag} {claims_why.note_text(v)}")
    return "\n".join(lines) + "\n"


def cited_notes(text: str) -> list[str]:
    """NOTES keys cited as [key] in text, and in the notes they cite, in NOTES order."""
    notes = claims_why.NOTES
    found: set[str] = set()
    todo = [text]
    while todo:
        t = todo.pop()
        for k in notes:
            if f"[{k}]" in t and k not in found:
                found.add(k)
                todo.append(claims_why.note_text(notes[k]))
    return [k for k in notes if k in found]


def status_by_artefact(table: pd.DataFrame) -> dict[str, str]:
    """Per artefact, each protocol's verdict counts ("artifact: 2 partly; text: 1 reproduced, 1 partly")."""
    protocols = protocols_of(table)
    out = {}
    for art, g in table.groupby("artefact", sort=False):
        parts = []
        for p in protocols:
            counts = g[f"verdict:{p}"].value_counts()
            text = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts.get(v, 0))
            if text:
                parts.append(f"{p}: {text}")
        out[art] = "; ".join(parts) or ABSENT
    return out


def main(argv=None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m repro.figures.claims",
        description="List the claims table's Why texts that need rewriting, or stamp rewritten ones.",
    )
    ap.add_argument("--results-dir", default="results")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--stale", action="store_true", help="list texts written for other verdicts or other numbers (exit 1 if any)"
    )
    g.add_argument("--stamp", nargs="+", metavar="ID", help="record today's numbers on these claim ids / note keys")
    a = ap.parse_args(argv)
    table = evaluate(a.results_dir)
    if a.stamp:
        try:
            done = stamp_entries(table, a.stamp)
        except KeyError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 2
        print(f"stamped {len(done)}: {' '.join(done)}")
        return 0
    todo = stale_entries(table)
    for e in todo:
        print(f"{e['kind']} {e['id']}" + (f" [{e['verdict']}]" if e["verdict"] else "") + f": {e['reason']}")
        if e["ours"]:
            print(f"    ours now: {e['ours']}")
        if e.get("text"):
            print(f"    text on file: {e['text'][:300]}")
    print(f"{len(todo)} text(s) to rewrite" if todo else "every Why text is current")
    return 1 if todo else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "CLAIMS",
    "RULES",
    "VERDICTS",
    "WHY_FILE",
    "Checks",
    "Claim",
    "Finding",
    "Why",
    "compare",
    "evaluate",
    "load_catalogue",
    "load_why",
    "mean_ratio",
    "numeric",
    "paired",
    "pct",
    "qualitative",
    "stale_entries",
    "stamp_entries",
    "status_by_artefact",
    "times",
    "to_markdown",
    "write_why",
    "K_SE",
    "LOSS",
    "NOT",
    "PARTLY",
    "REPRODUCED",
    "TIE",
    "WIN",
    "PAPER_SYSTEMS",
]
