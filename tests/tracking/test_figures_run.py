"""`make figures` logs every figure, table and the claims table to one W&B run per build."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.tracking.test_tracking_wandb import leet


def test_markdown_table_reads_a_pipe_table():
    from repro.tracking.figures import markdown_table

    text = "Caption line.\n\n| System | P50 (ms) |\n|:--|--:|\n| A+LRU | 1 ± 2 |\n| B | 3 |\n"
    df = markdown_table(text)
    assert df.columns.tolist() == ["System", "P50 (ms)"] and df.values.tolist() == [["A+LRU", "1 ± 2"], ["B", "3"]]
    assert markdown_table("no table here") is None


@pytest.mark.wandb
def test_figures_run_holds_images_tables_and_claims(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.tracking.figures import log_figures_run

    figs = tmp_path / "figures"
    figs.mkdir()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(figs / "fig5_request_rate.png")
    plt.close(fig)
    (figs / "fig5_request_rate.caption.txt").write_text("Figure 5: request rate.")
    pd.DataFrame({"rate": [4, 8], "p95": [0.5, 0.7]}).to_csv(figs / "fig5_request_rate.csv", index=False)
    (figs / "tab2_ablation.md").write_text("Table 2.\n\n| System | Hit |\n|:--|:--|\n| LBGR+RLT | 71 |\n")
    claims = pd.DataFrame({"id": ["c1", "c2"], "verdict": ["reproduced", "partly"]})
    results = tmp_path / "results"
    run_dir = log_figures_run(results, figs, ["fig5_request_rate", "tab2_ablation", "fig2_main"], claims)
    assert run_dir is not None and run_dir.parent == figs / "wandb"
    info = json.loads(leet("--summary", "--json", str(run_dir)))
    root = (results / ".tracking_id").read_text().strip()
    assert info["state"] == "finished" and info["run_id"].startswith(f"figures-{root}-")
    summ = info["summary"]
    assert summ["artefacts"] == 2 and summ["claims_verdicts"] == {"reproduced": 1, "partly": 1}
    assert summ["figures/fig5_request_rate"]["_type"] == "image-file"
    assert summ["figures/fig5_request_rate"]["caption"] == "Figure 5: request rate."
    for key, nrows in (("tables/fig5_request_rate", 2), ("tables/tab2_ablation", 1), ("claims", 2)):
        assert summ[key]["_type"] == "table-file" and summ[key]["nrows"] == nrows, key
        assert (run_dir / "files" / summ[key]["path"]).is_file()
    assert (run_dir / "files" / summ["figures/fig5_request_rate"]["path"]).is_file()
    table = json.loads((run_dir / "files" / summ["tables/tab2_ablation"]["path"]).read_text())
    assert table["columns"] == ["System", "Hit"] and table["data"] == [["LBGR+RLT", "71"]]
