"""Both protocols in one results folder (issue 39): the loader's protocol view, the paper names of
artifact cells, one drawing per protocol with suffixed file names, captions naming the protocol,
the claims table's column pair per protocol, the headline block and --check over both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from fig_fixture import REPRODUCE_TEMPLATE, make_results

from repro.confutil import CONF_DIR
from repro.figures import claims
from repro.figures.load import (
    PROTOCOL,
    SYSTEM,
    SYSTEM_IMPL,
    ResultsError,
    aggregate,
    load_cells,
    protocol_view,
    protocols_present,
)

ARTIFACT = yaml.safe_load((CONF_DIR / "protocol" / "artifact.yaml").read_text())["protocol"]
IMPL = {paper: impl for impl, paper in ARTIFACT["paper_names"]}  # paper name -> the shipped implementation's
SLOW_CA = 3.0  # the artifact cells' CacheAware+LRU is this much slower than the text cells'


def add_artifact_cells(root: Path, exp: str) -> int:
    """A protocol=artifact twin of every cell of results/<exp>/ (as the harness writes them: the
    implementation's policy_name, the protocol node with its paper_names pairs); CacheAware+LRU's
    latency and TTFT x SLOW_CA, so that the artifact numbers differ from the text ones."""
    n = 0
    for d in sorted(p for p in (root / exp).iterdir() if p.is_dir()):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        summary = json.loads((d / "summary.json").read_text())
        paper = cfg["policy_name"]
        cfg["policy_name"] = IMPL[paper]
        cfg["protocol"] = {"name": "artifact", "metrics": "artifact", "paper_names": ARTIFACT["paper_names"]}
        if paper == "CacheAware+LRU":
            for k in ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s"):
                summary[k] *= SLOW_CA
        out = root / exp / f"a{d.name}"
        out.mkdir()
        (out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=True))
        (out / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=2))
        shutil.copy(d / "timings.json", out / "timings.json")
        n += 1
    return n


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """fig2_main and tab2_ablation (default: artifact) and fig4_order (default: text) with both
    protocols' cells; fig5_request_rate with text cells only."""
    root = make_results(
        tmp_path_factory.mktemp("proto") / "results",
        exps=("fig2_main", "tab2_ablation", "fig4_order", "fig5_request_rate"),
        theory=False,
        small=True,
    )
    for exp in ("fig2_main", "tab2_ablation", "fig4_order"):
        add_artifact_cells(root, exp)
    return root


def test_the_view_splits_the_protocols_and_maps_paper_names(mixed):
    everything = load_cells(mixed, "fig2_main")
    assert set(everything[PROTOCOL]) == {"artifact", "text"} and len(everything) == 48
    assert protocols_present(mixed, "fig2_main") == ["artifact", "text"]
    assert protocols_present(mixed, "fig5_request_rate") == ["text"]
    with protocol_view("artifact"):
        art = load_cells(mixed, "fig2_main")
    with protocol_view("text"):
        text = load_cells(mixed, "fig2_main")
    assert len(art) == len(text) == 24 and set(art[PROTOCOL]) == {"artifact"} and set(text[PROTOCOL]) == {"text"}
    # the paper's six names under both protocols; the implementations' names kept beside them
    assert set(art[SYSTEM]) == set(text[SYSTEM]) == set(IMPL)
    assert all(IMPL[p] == i for p, i in zip(art[SYSTEM], art[SYSTEM_IMPL]))
    assert "CacheAware014+LRU" in set(art[SYSTEM_IMPL]) and (text[SYSTEM_IMPL] == text[SYSTEM]).all()
    # one protocol at a time pools cleanly; both at once never
    keys = ["workload.name", SYSTEM]
    with protocol_view("artifact"):
        assert len(aggregate(load_cells(mixed, "fig2_main"), keys, "fig2_main")) == 12
    with pytest.raises(ResultsError, match="protocols \\['artifact', 'text'\\]"):
        aggregate(everything, keys, "fig2_main")
    with protocol_view("artifact"), pytest.raises(ResultsError, match="protocol=artifact cells"):
        aggregate(load_cells(mixed, "fig5_request_rate"), keys, "fig5_request_rate")


@pytest.fixture(scope="module")
def rendered_mixed(mixed, tmp_path_factory):
    from repro.figures.__main__ import main

    figures = tmp_path_factory.mktemp("proto_fig") / "figures"
    rc = main(["fig2_main", "tab2_ablation", "fig4_order", "fig5_request_rate", "--results-dir", str(mixed),
               "--figures-dir", str(figures), "--tracking", "disabled"])
    return rc, figures


def test_each_protocol_is_drawn_with_its_file_names(rendered_mixed):
    rc, figures = rendered_mixed
    assert rc == 0
    names = {p.name for p in figures.iterdir()}
    # the experiment's default protocol keeps the plain names; the other carries its name
    for stem in ("fig2_main", "fig2_main.text", "fig4_order", "fig4_order.artifact", "fig5_request_rate"):
        assert {f"{stem}.png", f"{stem}.pdf", f"{stem}.csv", f"{stem}.caption.txt"} <= names, stem
    for stem in ("tab2_ablation", "tab2_ablation.text"):
        assert {f"{stem}.md", f"{stem}.tex", f"{stem}.caption.txt"} <= names, stem
    assert not {"fig2_main.artifact.png", "fig4_order.text.png", "fig5_request_rate.artifact.png"} & names
    # every caption names its protocol, in the plot and beside it
    art, text = "Protocol: artifact (the authors' scripts: sglang-router 0.1.4", "Protocol: text (the paper's text)"
    for stem, words in (("fig2_main", art), ("fig2_main.text", text), ("fig4_order", text),
                        ("fig4_order.artifact", art), ("tab2_ablation", art), ("tab2_ablation.text", text)):
        cap = (figures / f"{stem}.caption.txt").read_text()
        assert words in cap and (art if words == text else text) not in cap, stem
    assert art in (figures / "tab2_ablation.md").read_text()
    # the plotted numbers are each protocol's own, under the paper's names
    import pandas as pd

    a, t = pd.read_csv(figures / "fig2_main.csv"), pd.read_csv(figures / "fig2_main.text.csv")
    assert set(a[SYSTEM]) == set(t[SYSTEM]) == set(IMPL)
    ca = lambda df: df.loc[df[SYSTEM] == "CacheAware+LRU", "latency_p50_s"].to_numpy()  # noqa: E731
    assert (ca(a) / ca(t)) == pytest.approx(SLOW_CA, rel=1e-3)


def test_claims_table_has_a_column_pair_per_protocol(mixed):
    ids = ("fig2.p50_latency_vs_ca", "tab2.ca_rlt_latency", "fig4.latency_vs_ca")
    chosen = [c for c in claims.CLAIMS if c.id in ids or c.artefact == "fig5_request_rate"]
    t = claims.evaluate(mixed, chosen).set_index("id")
    # the artifact cells' Cache-Aware+LRU is SLOW_CA x slower: its ratio grows by that factor
    art, text = t.loc["fig2.p50_latency_vs_ca", "ours:artifact"], t.loc["fig2.p50_latency_vs_ca", "ours:text"]
    assert float(art.split("×")[0]) == pytest.approx(SLOW_CA * float(text.split("×")[0]), rel=0.02)
    assert t.loc["fig2.p50_latency_vs_ca", "verdict"] == t.loc["fig2.p50_latency_vs_ca", "verdict:text"]
    assert len(t.loc["fig2.p50_latency_vs_ca", "per_seed:artifact"]) == 2  # two seeds' statistics
    fig5 = [c.id for c in chosen if c.artefact == "fig5_request_rate"]
    assert fig5 and (t.loc[fig5, "verdict:artifact"] == "—").all() and (t.loc[fig5, "ours:artifact"] == "—").all()
    assert (t.loc[fig5, "verdict:text"] != "—").all()
    md = claims.to_markdown(t.reset_index())
    assert "| ID | Claim | Paper | Ours (artifact) | Verdict (artifact) | Ours (text) | Verdict (text) |" in md
    assert "artifact protocol: " in md.splitlines()[0] and "text protocol: " in md.splitlines()[0]
    row = next(ln for ln in md.splitlines() if ln.startswith("| `fig2.p50_latency_vs_ca`"))
    assert art in row and text in row


def test_check_compares_both_protocols_columns(mixed, tmp_path):
    from repro.figures.__main__ import check, write_generated
    from repro.figures.load import memoized_loads
    from repro.figures.reproduce import read_block

    results = tmp_path / "results"
    shutil.copytree(mixed, results)
    figures, md = tmp_path / "figures", tmp_path / "REPRODUCE.md"
    figures.mkdir()
    md.write_text(REPRODUCE_TEMPLATE)
    with memoized_loads():
        write_generated(results, figures, md)
    head = read_block(md.read_text(), "headline")
    assert "| Number | Paper | Artifact protocol | Text protocol |" in head
    row = next(ln for ln in head.splitlines() if ln.startswith("| Fig. 2 P50 latency"))
    assert row.count("(seeds ") == 2 and row.count("n = 2") == 2 and "| 11.96× |" in row
    assert "Protocol" not in read_block(md.read_text(), "claims").splitlines()[0]  # the note, then the table
    with memoized_loads():
        assert check(results, figures, md) == 0

    def edit(cell_dir: Path, factor: float) -> None:
        s = json.loads((cell_dir / "summary.json").read_text())
        s["latency_p50_s"] *= factor
        (cell_dir / "summary.json").write_text(json.dumps(s, sort_keys=True, indent=2))

    def lbgr_rlt_cell(protocol: str) -> Path:
        want = IMPL["LBGR+RLT"] if protocol == "artifact" else "LBGR+RLT"
        for d in sorted((results / "fig2_main").iterdir()):
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            if cfg["policy_name"] == want and (cfg.get("protocol") or {}).get("name", "text") == protocol:
                return d
        raise AssertionError(protocol)

    for protocol in ("artifact", "text"):  # a change in either column is caught
        d = lbgr_rlt_cell(protocol)
        edit(d, 40.0)
        with memoized_loads():
            assert check(results, figures, md) == 1, protocol
        edit(d, 1 / 40.0)
    with memoized_loads():
        assert check(results, figures, md) == 0


def test_w_and_b_runs_are_tagged_with_their_protocol():
    from repro.tracking.runs import tags

    assert "protocol:artifact" in tags({"protocol": {"name": "artifact"}, "policy_name": "X"})
    assert "protocol:text" in tags({"policy_name": "X"})  # cells from before the key: text
