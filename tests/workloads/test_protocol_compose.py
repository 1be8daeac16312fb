"""conf/protocol/: protocol=artifact (fig2_main's default) composes with a paper experiment;
protocol=text gives the text cells, whose signatures leave the protocol node out."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from repro.confutil import CONF_DIR
from repro.harness.compose import GridComposer, cell_signature, compose_cells
from repro.harness.grid import expand_grid
from repro.workloads import resolve_spec


def fig2_cells(*extra: str) -> list:
    import repro.harness.schema  # noqa: F401  (registers the schema)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        over = ["exp=fig2_main", *extra]
        head = compose("config", overrides=over, return_hydra_config=True)
        params = OmegaConf.to_container(head.hydra.sweeper.params, resolve=True)  # ${protocol.systems.X}
        cells = expand_grid(params, over)
        compose_cells(cells, GridComposer("config"))
        return cells


@pytest.fixture(scope="module")
def both():
    # fig2_main defaults to protocol=artifact (conf/exp/fig2_main.yaml); protocol=text gives the text cells
    return fig2_cells("protocol=text"), fig2_cells()


def test_artifact_selects_each_workloads_variant_and_the_metrics(both):
    text, art = both
    assert len(text) == len(art) == 120  # 4 workloads x 6 systems x seeds 0-4
    for cell in art:
        cfg = cell.config
        w = cfg["workload"]
        assert cfg["protocol"]["name"] == "artifact" and cfg["protocol"]["metrics"] == "artifact"
        assert w["variant"] == "artifact" and w["num_queries"] is None  # wins over shared/paper.yaml's 1024
        assert w["artifact"] == cfg["protocol"]["workloads"][w["name"]]
        resolve_spec(w)  # a valid workload config
    gsp = next(c.config for c in art if c.config["workload"]["name"] == "gsp")
    assert gsp["workload"]["artifact"]["total_lens"] == [512, 1024, 2048, 4096, 8192]
    assert gsp["workload"]["tokenizer"]["kind"] == "llama3"


def test_text_is_todays_config_and_the_two_protocols_sit_side_by_side(both):
    text, art = both
    for cell in text:
        proto = cell.config["protocol"]
        assert proto["name"] == "text" and proto["num_queries"] == 1024 and proto["paper_names"] == []
        assert proto["systems"] == {s: s for s in proto["systems"]}  # each paper option is itself
        assert cell.config["workload"]["num_queries"] == 1024
        assert cell.config["cluster"]["kv_cache_tokens"] == proto["kv_cache_tokens"]
        assert "variant" not in cell.config["workload"]
        without = {k: v for k, v in cell.config.items() if k != "protocol"}
        assert cell_signature(cell.config) == cell_signature(without)  # today's signatures
    sig_text = {cell_signature(c.config) for c in text}
    sig_art = {cell_signature(c.config) for c in art}
    assert len(sig_text) == len(sig_art) == 120 and not sig_text & sig_art
