"""Every paper experiment composes into the grid the paper describes (the first and last cell of
each grid by default; every cell under the slow marker)."""

from __future__ import annotations


import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from repro.harness.compose import GridComposer, compose_cells
from repro.harness.grid import expand_grid
from repro.harness.sweep import plan_cells
from tests.harness.helpers import ROOT

SIX = {"random_lru", "round_robin_lru", "cache_aware_lru", "cache_aware_rlt", "lbgr_lru", "lbgr_rlt"}
EXPS = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml"))
BEYOND = ("mooncake_replay",)  # experiments beyond the paper: their own model, GPU and workload
TODAY = ("todays_baselines",)  # beyond the paper: the paper's systems beside today's policies
LIVE = ("live_cpu_gsp", "live_cpu_artifact")  # real SGLang servers on a CPU: shrunk GSP (text and artifact), backend sglang
# the text -> artifact ladder and the artifact protocol's speed sweep (tests/harness/test_gap_ladder.py)
PROTOCOL_GAP = ("gap_ladder", "fig2_speed")
# paper experiments that run the authors' protocol by default (conf/protocol/artifact.yaml)
ARTIFACT_DEFAULT = ("fig2_main", "tab2_ablation")
SIX_ARTIFACT = {"random_lru", "round_robin_lru", "cache_aware_014_lru", "cache_aware_014_rlt_shipped", "lbgr_shipped_lru",
                "lbgr_shipped_rlt_shipped"}
PAPER = [e for e in EXPS if e not in BEYOND + LIVE + PROTOCOL_GAP + TODAY and e != "thm_competitive_ratio"]


def test_every_paper_experiment_has_a_file():
    assert EXPS == sorted(
        [
            "fig2_main", "fig3_models", "fig4_order", "fig5_request_rate", "fig6_workers", "fig7_cache_size",
            "tab2_ablation", "fig10_prefix_ratio", "fig11_num_queries", "fig12_output_len", "fig13_batch_size",
            "tab3_single_worker", "fig14_decay_interval", "thm_competitive_ratio",
            "fig8_llama70b_benchmarks", "fig9_mixtral_benchmarks",  # the appendix figures, our reading
            "fig2_router_rules", "regime_map", "load_ladder", "inverse_search", "todays_baselines",  # beyond the paper
            *BEYOND, *LIVE, *PROTOCOL_GAP,
        ]
    )


def _plan(exp: str, full: bool) -> list:
    """exp's cells: all composed, signed and value-checked (full), or only its first and last."""
    head = compose("config", overrides=[f"exp={exp}"], return_hydra_config=True)
    params = OmegaConf.to_container(head.hydra.sweeper.params, resolve=True)  # ${protocol.systems.X}
    if full:
        return plan_cells(params, [f"exp={exp}"], GridComposer("config"), deep=False)
    cells = expand_grid(params, [f"exp={exp}"])
    compose_cells([cells[0], cells[-1]], GridComposer("config"))
    CHOICES[exp] = dict(head.hydra.runtime.choices)
    return cells


CHOICES: dict[str, dict] = {}  # exp -> Hydra's group choices of the exp (before its grid)


@pytest.fixture(scope="module")
def grids() -> dict[str, list]:
    """exp name -> its cells; the first and last of each composed (the whole grid: the slow test)."""
    import repro.harness.schema  # noqa: F401

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return {exp: _plan(exp, full=False) for exp in EXPS}


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPS)
def test_every_cell_of_every_exp_composes_and_validates(exp):
    import repro.harness.schema  # noqa: F401

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cells = _plan(exp, full=True)
    assert all(c.config["exp_name"] == exp for c in cells)
    assert len({c.signature for c in cells}) == len(cells)  # no two cells are the same run


def composed(cells):
    return [c for c in cells if c.config is not None]


def values(cells, dotted):
    out = []
    for c in composed(cells):
        node = c.config
        for part in dotted.split("."):
            node = node[part]
        out.append(node)
    return out


def policies(cells):
    return {c.swept.get("policy") for c in cells}


def swept(cells, key, cast=str):
    return sorted({cast(c.swept[key]) for c in cells})


@pytest.mark.parametrize("exp", EXPS)
def test_exp_composes_with_its_name(grids, exp):
    cells = grids[exp]
    assert len(composed(cells)) == 2 or len(cells) == 1
    assert all(c.config["exp_name"] == exp for c in composed(cells))
    assert len({c.signature for c in composed(cells)}) == len(composed(cells))


@pytest.mark.parametrize("exp", PAPER)
def test_paper_defaults_unless_swept(grids, exp):
    cells = grids[exp]
    swept = set().union(*(c.swept for c in cells))
    assert composed(cells)
    expected = {
        "cluster.num_workers": 1 if exp == "tab3_single_worker" else 4,
        "workload.request_rate": 3.0 if exp == "tab3_single_worker" else 12.0,
        "workload.output_len": 4,
        "workload.order": "round_robin" if exp == "fig4_order" else "random",
        "workload.num_queries": None if exp in ARTIFACT_DEFAULT else 1024,  # the scripts' own counts
        "seed": 0,
        "backend.name": "sim",
    }
    for key, value in expected.items():
        if key in swept or key.split(".")[0] in swept or (value is None and key != "workload.num_queries"):
            continue
        assert set(values(cells, key)) == {value}, key


@pytest.mark.parametrize("exp", PAPER)
def test_model_and_gpu(grids, exp):
    expected = {"fig3_models": ("llama31_8b", "h200"),  # fig3 sweeps the model
                "fig8_llama70b_benchmarks": ("llama31_70b", "h200"),
                "fig9_mixtral_benchmarks": ("mixtral_8x7b", "h200")}.get(exp, ("llama31_8b", "l40"))
    assert (CHOICES[exp]["model"], CHOICES[exp]["hardware"]) == expected
    tracking = "disabled" if exp == "inverse_search" else "offline"  # hundreds of search cells: summaries only
    assert CHOICES[exp]["backend"] == "sim" and CHOICES[exp]["tracking"] == tracking


def test_grid_shapes(grids):
    g = grids
    assert len(g["fig2_main"]) == 120 and policies(g["fig2_main"]) == SIX_ARTIFACT
    assert swept(g["fig2_main"], "seed", int) == [0, 1, 2, 3, 4]
    assert swept(g["fig2_main"], "workload") == ["gsp", "loogle", "sharegpt", "ultrachat"]
    assert len(g["fig3_models"]) == 36 and swept(g["fig3_models"], "model") == ["llama31_70b", "mixtral_8x7b"]
    assert set(values(g["fig3_models"], "workload.name")) == {"sharegpt"}  # the other benchmarks: fig8 / fig9
    for exp in ("fig8_llama70b_benchmarks", "fig9_mixtral_benchmarks"):
        assert len(g[exp]) == 18 and swept(g[exp], "workload") == ["gsp", "loogle", "ultrachat"]
    for exp in ("fig3_models", "fig4_order", "fig5_request_rate", "fig6_workers", "fig10_prefix_ratio",
                "fig12_output_len", "tab3_single_worker", "fig14_decay_interval", "fig2_router_rules"):
        assert swept(g[exp], "seed", int) == [0, 1, 2], exp  # close verdicts: judged against the seed noise
    rr = g["fig2_router_rules"]
    assert len(rr) == 48 and policies(rr) == {"cache_aware_lru", "cache_aware_rlt"}
    assert set(values(rr, "router.generation")) == {"le_0_2_3", "smg_1_13"}  # fig2_main holds 0.3.2's rows
    rm = g["regime_map"]
    assert len(rm) == 240 and policies(rm) == {"cache_aware_lru", "cache_aware_rlt", "lbgr_rlt", "cache_aware_smg_lru"}
    assert set(values(rr, "policy_name")) <= {"CacheAware+LRU", "CacheAware+RLT"}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        smg = compose("config", overrides=["exp=regime_map", "policy=cache_aware_smg_lru"])
    assert (smg.router.generation, smg.router.name, smg.policy_name) == ("smg_1_13", "cache_aware_smg", "CacheAware(smg)+LRU")
    inv = g["inverse_search"]  # the inverse search's starting point: Figure 2's GSP pair (its trials: tests/analysis)
    assert len(inv) == 6 and policies(inv) == {"cache_aware_lru", "lbgr_rlt"} and swept(inv, "seed", int) == [0, 1, 2]
    assert swept(rm, "workload.request_rate", float) == [4.0, 8.0, 16.0, 24.0, 32.0]
    assert swept(rm, "cluster.kv_cache_tokens", int) == [8192, 16384, 32768, 65536, 131072, 262144]
    ladder = g["load_ladder"]
    assert len(ladder) == 108 and policies(ladder) == SIX and swept(ladder, "workload") == ["gsp", "sharegpt"]
    assert swept(ladder, "workload.request_rate", float) == [4.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 64.0, 96.0]
    assert set(values(g["fig4_order"], "workload.name")) == {"loogle"} and policies(g["fig4_order"]) == SIX
    assert swept(g["fig5_request_rate"], "workload.request_rate", float) == [4.0, 8.0, 12.0, 16.0, 20.0]
    assert swept(g["fig6_workers"], "cluster.num_workers", int) == [2, 4, 6, 8, 10]
    assert swept(g["fig7_cache_size"], "cluster.mem_fraction", float) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert set(values(g["fig7_cache_size"], "cluster.kv_cache_tokens")) == {None}  # the formula decides
    assert policies(g["tab2_ablation"]) == SIX_ARTIFACT - {"random_lru", "round_robin_lru"}
    assert len(g["tab2_ablation"]) == 20 and set(values(g["tab2_ablation"], "workload.name")) == {"gsp"}
    assert swept(g["fig10_prefix_ratio"], "workload.shared_prefix_ratio", float) == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert len(swept(g["fig11_num_queries"], "workload.num_queries")) == 5
    assert swept(g["fig12_output_len"], "workload.output_len", int) == [4, 8, 16, 32, 64, 128]
    assert len(swept(g["fig13_batch_size"], "cluster.scheduler.max_running_requests")) == 5
    assert policies(g["tab3_single_worker"]) == {"cache_aware_lru", "cache_aware_rlt"}
    mc = g["mooncake_replay"]
    assert policies(mc) == SIX | {"dynamo_lru", "llmd_lru", "power_of_two_lru"} and len(mc) == 9
    assert set(values(mc, "workload.name")) == {"mooncake"} and set(values(mc, "workload.num_queries")) == {None}
    assert set(values(mc, "cluster.num_workers")) == {8} and set(values(mc, "cluster.kv_cache_tokens")) == {None}
    assert (CHOICES["mooncake_replay"]["model"], CHOICES["mooncake_replay"]["hardware"]) == ("llama31_8b", "h100")
    assert len(g["tab3_single_worker"]) == 24
    assert len(swept(g["fig14_decay_interval"], "router.decay_interval_s")) == 6
    for exp in EXPS:
        if exp not in ("fig14_decay_interval", "tab3_single_worker", "tab2_ablation", "thm_competitive_ratio",
                       "fig2_router_rules", "regime_map", "inverse_search", *BEYOND, *LIVE, *PROTOCOL_GAP,
                       *ARTIFACT_DEFAULT, *TODAY):  # fig2_main: SIX_ARTIFACT (above)
            assert policies(g[exp]) == SIX, exp
    today = g["todays_baselines"]  # the six beside SGLang's own evictions and today's routers
    assert len(today) == 168 and SIX < policies(today) and len(policies(today)) == 14
    assert swept(today, "workload") == ["gsp", "loogle", "sharegpt", "ultrachat"] and swept(today, "seed", int) == [0, 1, 2]
    live = g["live_cpu_gsp"]
    assert policies(live) == {"round_robin_lru", "cache_aware_lru", "cache_aware_rlt", "lbgr_rlt"} and len(live) == 4
    assert (CHOICES["live_cpu_gsp"]["model"], CHOICES["live_cpu_gsp"]["hardware"],
            CHOICES["live_cpu_gsp"]["backend"]) == ("tiny_llama", "cpu", "sglang")
    thm = g["thm_competitive_ratio"]
    assert set(values(thm, "backend.name")) == {"theory"} and len(thm) == 54
    assert swept(thm, "theory.panel") == ["thm4", "thm5"]
    assert swept(thm, "theory.policy") == ["lru", "opt", "rlt"]
    assert swept(thm, "theory.x", int) == [4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_theory_signature_ignores_the_serving_config(grids):
    from repro.harness.compose import cell_signature
    from repro.results import run_signature

    from repro.theory.competitive_ratio import grid

    cell = composed(grids["thm_competitive_ratio"])[0]
    assert cell.config["theory"] == {"panel": "thm4", "x": 4, "policy": "lru", "quick": False}
    (params,) = [p for p in grid() if p["construction"] == "thm4" and p["policy"] == "lru"
                 and p["b_minus_l_plus_1"] == 4]
    assert cell.signature == run_signature(params)  # the theory CLI's folder for this cell
    other = {**cell.config, "workload": {"name": "sharegpt"}}
    assert cell_signature(other) == cell.signature


def test_cell_config_does_not_depend_on_the_grid_composer(grids):
    """The grid composer (groups once, values applied after) equals Hydra's full composition."""
    from repro.harness.compose import resolve

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for exp in ("fig5_request_rate", "fig14_decay_interval", "thm_competitive_ratio"):
            for cell in composed(grids[exp]):
                assert resolve(compose("config", overrides=cell.overrides)) == cell.config
