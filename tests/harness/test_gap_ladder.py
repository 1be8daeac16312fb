"""conf/exp/gap_ladder.yaml and conf/ladder/: each rung adds exactly its factor to the previous
one, r6 is the artifact protocol's Fig. 2 GSP cell (the same signature: twins are copied), and
fig2_speed's speed 1.0 cells are those too."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from repro.harness.compose import GridComposer, cell_signature
from repro.harness.sweep import plan_cells
from tests.harness.helpers import ROOT

RUNGS = ("r0", "r1", "r2", "r3", "r4", "r5", "r6")
# (rung, side) -> the policy option the sweep runs; None: the previous rung's cell stands
POLICY = {
    "baseline": ("cache_aware_lru",) * 3 + ("cache_aware_014_lru", None, None, "cache_aware_014_lru"),
    "ours": ("lbgr_rlt",) * 3 + (None, "lbgr_shipped_rlt", "lbgr_shipped_rlt_shipped", "lbgr_shipped_rlt_shipped"),
}
SKIP_TOP = {"ladder", "exp_name", "results_dir", "tracking", "n_jobs"}


def flat(d: dict, pre: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{pre}{k}."))
        else:
            out[f"{pre}{k}"] = v
    return out


def diff(a: dict, b: dict) -> set[str]:
    fa = {k: v for k, v in flat(a).items() if k.split(".")[0] not in SKIP_TOP}
    fb = {k: v for k, v in flat(b).items() if k.split(".")[0] not in SKIP_TOP}
    return {k for k in fa.keys() | fb.keys() if fa.get(k, "<absent>") != fb.get(k, "<absent>")}


@pytest.fixture(scope="module")
def ladder() -> dict:
    """{(rung, side): cell config} of every rung x system, the sweep's cells and the ones it
    leaves out (composed here to show they equal the previous rung's), seed 0."""
    import repro.harness.schema  # noqa: F401

    out = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        head = compose("config", overrides=["exp=gap_ladder"], return_hydra_config=True)
        params = OmegaConf.to_container(head.hydra.sweeper.params)
        cells = plan_cells(params, ["exp=gap_ladder", "seed=0"], GridComposer("config"), deep=False)
        out["cells"] = cells
        compose_fn = GridComposer("config")
        for side, policies in POLICY.items():
            last = None
            for rung, policy in zip(RUNGS, policies):
                last = policy or last
                cfg = compose_fn(["exp=gap_ladder", f"+ladder={rung}", f"policy={last}", "seed=0"])
                out[(rung, side)] = OmegaConf.to_container(cfg, resolve=True)
        for policy in ("cache_aware_014_lru", "lbgr_shipped_rlt_shipped"):
            cfg = compose_fn(["exp=gap_ladder", "protocol=artifact", f"policy={policy}", "seed=0"])
            out[("artifact", policy)] = OmegaConf.to_container(cfg, resolve=True)
        for exp, extra in (
            ("fig2_speed", []),
            ("fig2_main", ["workload=gsp"]),
            ("fig2_main", ["protocol=text", "workload=gsp"]),
        ):
            head = compose("config", overrides=[f"exp={exp}", *extra], return_hydra_config=True)
            params = OmegaConf.to_container(head.hydra.sweeper.params, resolve=True)  # ${protocol.systems.X}
            key = exp if exp == "fig2_speed" else ("fig2_main", extra[0])
            out[key] = plan_cells(params, [f"exp={exp}", *extra, "seed=0"], GridComposer("config"), deep=False)
    return out


def test_the_sweep_runs_each_rung_system_once_and_labels_it(ladder):
    cells = ladder["cells"]
    got = {(c.config["ladder"]["rung"], c.config["ladder"]["side"]) for c in cells}
    want = {(r, s) for s, ps in POLICY.items() for r, p in zip(RUNGS, ps) if p is not None}
    assert got == want and len(cells) == len(want) == 11
    assert len({c.signature for c in cells}) == len(cells)  # no rung repeats another's cell
    for c in cells:
        rung, side = c.config["ladder"]["rung"], c.config["ladder"]["side"]
        assert ladder[(rung, side)]["policy_name"] == c.config["policy_name"]
        assert c.config["workload"]["name"] == "gsp" and c.config["workload"]["request_rate"] == 12.0


@pytest.mark.parametrize("side", ["baseline", "ours"])
def test_each_rung_adds_exactly_its_factor(ladder, side):
    factor_keys = {
        "r1": lambda k: k.startswith("workload."),
        "r2": lambda k: k.startswith("cluster."),
        "r3": lambda k: k.startswith(("router.", "policy_name")) and side == "baseline",
        "r4": lambda k: k.startswith(("router.", "policy_name")) and side == "ours",
        "r5": lambda k: k.startswith(("eviction.", "policy_name")) and side == "ours",
        "r6": lambda k: k.startswith("protocol."),
    }
    for prev, rung in zip(RUNGS, RUNGS[1:]):
        changed = diff(ladder[(prev, side)], ladder[(rung, side)])
        assert all(factor_keys[rung](k) for k in changed), (rung, side, sorted(changed))
        if POLICY[side][RUNGS.index(rung)] is not None:  # the sweep runs it: the factor changes it
            assert changed, (rung, side)
        else:  # left out of the sweep: the same cell as the previous rung's
            assert not changed and cell_signature(ladder[(prev, side)]) == cell_signature(ladder[(rung, side)])
    assert "protocol.metrics" in diff(ladder[("r5", side)], ladder[("r6", side)])
    for rung in RUNGS[:6]:  # the text protocol throughout r0-r5 (so `protocol` is not signed)
        assert ladder[(rung, side)]["protocol"]["name"] == "text"


def test_r1_takes_the_artifact_protocols_gsp_workload_and_r2_its_servers(ladder):
    artifact = ladder[("artifact", "cache_aware_014_lru")]
    assert ladder[("r1", "baseline")]["workload"] == artifact["workload"]
    assert ladder[("r0", "baseline")]["workload"].get("variant", "text") == "text"
    assert ladder[("r2", "baseline")]["cluster"] == artifact["cluster"]
    assert ladder[("r1", "baseline")]["cluster"]["kv_cache_tokens"] == 32768  # the text budget still
    text = yaml.safe_load((ROOT / "conf" / "ladder" / "r1.yaml").read_text())["workload"]["artifact"]
    theirs = yaml.safe_load((ROOT / "conf" / "protocol" / "artifact.yaml").read_text())["protocol"]["workloads"]
    assert text == theirs["gsp"]


def test_r6_is_the_artifact_protocols_cell_and_r0_the_text_one(ladder):
    for side, policy in (("baseline", "cache_aware_014_lru"), ("ours", "lbgr_shipped_rlt_shipped")):
        r6, art = ladder[("r6", side)], ladder[("artifact", policy)]
        assert not diff(r6, art)
        assert cell_signature(r6) == cell_signature(art)
    r0 = ladder[("r0", "ours")]
    plain = {k: v for k, v in r0.items() if k != "ladder"}
    assert cell_signature(r0) == cell_signature(plain)  # the label is not part of the signature
    assert r0["policy_name"] == "LBGR+RLT" and r0["protocol"]["name"] == "text"


def test_r6_and_r0_are_fig2_mains_gsp_cells_under_each_protocol(ladder):
    """The ladder's ends are Fig. 2's own GSP cells: twins, copied when fig2_main ran first."""
    ends = {"r6": ("fig2_main", "workload=gsp"), "r0": ("fig2_main", "protocol=text")}
    for rung, key in ends.items():
        mine = {c.config["policy_name"]: c.signature for c in ladder["cells"] if c.config["ladder"]["rung"] == rung}
        fig2 = {c.config["policy_name"]: c.signature for c in ladder[key]}
        assert len(mine) == 2 and all(fig2[name] == sig for name, sig in mine.items()), rung


def test_the_speed_sweep_is_the_artifact_cell_at_speed_1(ladder):
    speed = ladder["fig2_speed"]
    assert len(speed) == 5 * 2  # speeds x systems (seed 0)
    assert {c.config["hardware"]["speed_factor"] for c in speed} == {0.5, 0.71, 1.0, 1.41, 2.0}
    assert {c.config["protocol"]["name"] for c in speed} == {"artifact"}
    at_one = {c.signature for c in speed if c.config["hardware"]["speed_factor"] == 1.0}
    r6 = {c.signature for c in ladder["cells"] if c.config["ladder"]["rung"] == "r6"}
    assert at_one == r6
