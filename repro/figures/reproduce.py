"""Generated text: REPRODUCE.md's blocks, figures/claims.md and figures/README.md.

REPRODUCE.md is hand-written except between marker comments

    <!-- BEGIN GENERATED: figures -->  ...  <!-- END GENERATED: figures -->
    <!-- BEGIN GENERATED: headline --> ...  <!-- END GENERATED: headline -->
    <!-- BEGIN GENERATED: claims -->   ...  <!-- END GENERATED: claims -->

which `python -m repro.figures` rewrites from results/ (and `--check` compares). Everything
here is a pure function of the results files, so the same results give the same bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from repro.figures import ARTEFACTS, ArtefactUnavailable, artefact, captions, claims
from repro.figures.load import PROTOCOLS, cell_counts, load_cells
from repro.figures.protocols import default_protocol, output_name

BLOCKS = ("figures", "headline", "claims")
TABLES = ("tab2_ablation", "tab3_single_worker")


class MarkerError(ValueError):
    """A generated block's markers are missing or out of order in a hand-written file."""


def begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED: {name} (python -m repro.figures; do not edit by hand) -->"


def end(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def _pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(begin(name)) + r"\n(.*?)" + re.escape(end(name)), re.S)


def read_block(text: str, name: str) -> str:
    m = _pattern(name).search(text)
    if m is None:
        raise MarkerError(f"no '{begin(name)}' ... '{end(name)}' block")
    return m.group(1)


def replace_block(text: str, name: str, body: str) -> str:
    if _pattern(name).search(text) is None:
        raise MarkerError(f"no '{begin(name)}' ... '{end(name)}' block")
    body = body if body.endswith("\n") else body + "\n"
    return _pattern(name).sub(lambda _: f"{begin(name)}\n{body}{end(name)}", text, count=1)


def outputs(name: str, protocol: str | None = None) -> list[str]:
    """The files an artefact's drawing under `protocol` writes (None / its default: plain names)."""
    if name in TABLES:
        endings = [".md", ".tex"]
    elif name == "thm_competitive_ratio":
        endings = [".png", ".pdf"]
    else:
        endings = [".png", ".pdf", ".csv"]
    return [output_name(name, protocol, e) for e in endings]


def drawn_protocols(name: str, figures_dir: str | Path) -> list[str]:
    """The protocols whose files of `name` are in figures_dir: its default first, then PROTOCOLS."""
    order = [default_protocol(name)] + [p for p in PROTOCOLS if p != default_protocol(name)]
    return [p for p in order if any((Path(figures_dir) / o).is_file() for o in outputs(name, p))]


def title(name: str) -> str:
    """The artefact's title without its 'Figure N: ' prefix."""
    try:
        mod = artefact(name)
    except ArtefactUnavailable:
        return ""
    text = mod.FIGURE.title if hasattr(mod, "FIGURE") else getattr(mod, "TITLE", "")
    if name == "thm_competitive_ratio":
        return "Theorems 4-7 on the replayer: misses per phase of L-LRU, RLT, OPT"
    return text.split(": ", 1)[1] if ": " in text else text


def kv_tokens(df: pd.DataFrame) -> str:
    """The per-worker KV capacities the cells ran with (provenance kv_capacity_tokens)."""
    col = "prov.kv_capacity_tokens"
    if col not in df:
        return "—"
    caps = set()
    for v in df[col]:
        if isinstance(v, tuple):
            caps.update(int(c) for c in v)
        elif v is not None and v == v:
            caps.add(int(v))
    if not caps:
        return "—"
    lo, hi = min(caps), max(caps)
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def _seconds(v: float) -> str:
    if v != v or v <= 0:
        return "n/a"
    return f"{v:,.0f} s" if v >= 10 else f"{v:.1f} s"


def figures_table(results_dir: str | Path, claims_table: pd.DataFrame) -> str:
    """One row per artefact: command, backend, cells, CPU time (sum of the cells' backend wall
    time from timings.json), outputs, claim status."""
    status = claims.status_by_artefact(claims_table)
    rows = []
    total = 0.0
    for name in ARTEFACTS:
        exp = name
        counts = cell_counts(results_dir, exp)
        df = load_cells(results_dir, exp)
        cpu = float(df["cpu_s"].sum()) if len(df) and "cpu_s" in df else float("nan")
        total += 0.0 if cpu != cpu else cpu
        cells = f"{counts['finished']}"
        if counts["failed"] or counts["unfinished"]:
            cells += f" (+{counts['failed']} failed, {counts['unfinished']} unfinished)"
        backend = ", ".join(captions.backends(df)) if len(df) else "—"
        rows.append(
            {
                "Artefact": name,
                "What": title(name),
                "Run": f"`python -m repro.run +exp={exp}`",
                "Backend": backend,
                "Cells": cells,
                "KV tokens/worker": kv_tokens(df),
                "CPU time": _seconds(cpu),
                "Outputs": _outputs_cell(name, df),
                "Claims": status.get(name, "—"),
            }
        )
    table = pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)
    return (
        f"{table}\n\nRender one artefact with `python -m repro.figures NAME`. "
        f"CPU time = the sum over an experiment's finished cells of the backend's wall time "
        f"(timings.json `harness.backend_wall_s`, one core per cell); all experiments: {_seconds(total)}.\n"
    )


def _outputs_cell(name: str, df: pd.DataFrame) -> str:
    """Links to the files of each protocol the cells have ("artifact: png · pdf · csv; text: ...")."""
    from repro.figures.load import PROTOCOL

    present = set(df[PROTOCOL]) if len(df) and PROTOCOL in df else set()
    order = [default_protocol(name)] + [p for p in PROTOCOLS if p != default_protocol(name)]
    shown = [p for p in order if p in present] or [default_protocol(name)]
    parts = []
    for p in shown:
        links = " · ".join(f"[{o.rsplit('.', 1)[1]}](figures/{o})" for o in outputs(name, p))
        parts.append(f"{p}: {links}" if len(shown) > 1 or p != default_protocol(name) else links)
    return "; ".join(parts)


PROTOCOL_NOTE = (
    "Each claim is judged once per protocol, on that protocol's cells alone: *artifact* = the authors' scripts "
    "(sglang-router 0.1.4's cache-aware rule, LBGR and RLT as shipped, SGLang 0.4.6 server defaults, their "
    "workloads and metric definitions), *text* = the paper's text; — = no cells of that protocol in the "
    f"claim's results folder. The Why texts are written for the {claims.WHY_PROTOCOL} protocol's numbers "
    "(their stamps digest those)."
)


def claims_block(claims_table: pd.DataFrame) -> str:
    return PROTOCOL_NOTE + "\n\n" + claims.to_markdown(claims_table)


def claims_file(claims_table: pd.DataFrame) -> str:
    return (
        "# Claims of the paper's §5, evaluated on our results\n\n"
        "Generated by `python -m repro.figures` from results/ (verdict rules: REPRODUCE.md, "
        "repro/figures/claims.py). Do not edit by hand.\n\n" + PROTOCOL_NOTE + "\n\n" + claims.to_markdown(claims_table)
    )


def thm_caption(results_dir: str | Path) -> str:
    df = load_cells(results_dir, "thm_competitive_ratio")
    text = (
        "Theorems 4-7 on one worker: steady-state misses per phase of L-LRU, RLT and OPT on the lower-bound "
        "constructions (trace replayer, token granularity), against B − L + 1 (L-LRU's bound) and the harmonic "
        "number H (RLT's expectation)."
    )
    if len(df):
        text += " " + captions.protocol_text(df) + "."
        b = captions.backends(df)
        text += " Backend: " + ", ".join(captions.BACKEND_WORDS.get(x, x) for x in b) + "." if b else ""
        if "num_runs" in df and "policy" in df:
            runs = sorted(set(int(n) for n in df.loc[df["policy"] == "rlt", "num_runs"]))
            if runs:
                text += f" RLT: mean of {', '.join(map(str, runs))} seeded runs per point, band = 95 % CI."
    return text


def index(results_dir: str | Path, figures_dir: str | Path) -> str:
    """figures/README.md: every artefact with its caption (from <name>.caption.txt when rendered)."""
    lines = [
        "# Rendered figures and tables",
        "",
        "Generated by `python -m repro.figures` (`make figures`); captions carry the provenance. "
        "Claims: [claims.md](claims.md). Each artefact is drawn once per protocol its results hold "
        "(artifact: the authors' scripts; text: the paper's text); the files of a protocol other than the "
        "experiment's default carry its name (fig2_main.text.png, fig5_request_rate.artifact.csv).",
        "",
    ]
    for name in ARTEFACTS:
        lines.append(f"## {name}")
        lines.append("")
        drawn = drawn_protocols(name, figures_dir)
        if not drawn:
            lines.append("Not rendered (no results yet).")
            lines.append("")
        for protocol in drawn:
            lines += _index_entry(
                name, protocol, figures_dir, heading=len(drawn) > 1 or protocol != default_protocol(name)
            )
    return "\n".join(lines).rstrip() + "\n"


def _index_entry(name: str, protocol: str, figures_dir: str | Path, heading: bool) -> list[str]:
    """figures/README.md's lines for one artefact under one protocol."""
    lines = [f"### protocol={protocol}", ""] if heading else []
    files = outputs(name, protocol)
    present = [o for o in files if (Path(figures_dir) / o).is_file()]
    stem = files[0].rsplit(".", 1)[0]
    if name in TABLES:
        lines.append(f"See [{stem}.md]({stem}.md) ([LaTeX]({stem}.tex)).")
    else:
        lines.append(f"![{stem}]({stem}.png)")
        lines.append("")
        lines.append(f"[PDF]({stem}.pdf)" + (f" · [data]({stem}.csv)" if f"{stem}.csv" in present else ""))
    lines.append("")
    cap = Path(figures_dir) / f"{stem}.caption.txt"
    lines.append(cap.read_text().strip() if cap.is_file() else "")
    lines.append("")
    return lines


def available(name: str) -> bool:
    try:
        artefact(name)
        return True
    except ArtefactUnavailable:
        return False
