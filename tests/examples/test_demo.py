"""examples/prefix_or_least/demo.sh from a fresh clone (issue 32 "Done when"): the run, the figure,
the run table's last line; a rerun skips everything, a second experiment copies its twins; an edit
of the example router's code makes exactly its cells stale, a comment edit none.

Slow (a few minutes: 24 simulator cells and two renders): `python -m pytest -m slow tests/examples`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXP = "fig2_gsp_prefix_or_least"
GRID = ["+exp=fig2_main", "protocol=text", "seed=0,1,2", "workload=gsp", f"exp_name={EXP}",
        "hydra.sweeper.params.policy=${systems:prefix_or_least_lru,lbgr_oldest_or_random}"]

pytestmark = pytest.mark.slow


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _counts(line: str) -> tuple[int, int, int, int]:
    m = re.search(r": (\d+) ran, (\d+) copied \(from a finished twin\), (\d+) skipped \(finished\), (\d+) failed", line)
    assert m, line
    return tuple(int(g) for g in m.groups())


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clone") / "repro"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(out)], check=True, timeout=600)
    return out


def test_demo_from_a_fresh_clone(clone, tmp_path):
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    demo = [str(clone / "examples" / "prefix_or_least" / "demo.sh"), str(results)]
    first = subprocess.run(demo, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert _counts(_last_line(first.stdout)) == (24, 0, 0, 0)
    for suffix in ("png", "pdf", "csv", "caption.txt"):
        assert (results / "figures" / f"{EXP}.{suffix}").stat().st_size > 0
    caption = (results / "figures" / f"{EXP}.caption.txt").read_text()
    assert caption.startswith("Performance of the eight systems (results/") and f"{EXP}/" in caption.split(")")[0]
    assert "Beyond the paper's six systems: LBGR+OldestOrRandom, PrefixOrLeast+LRU." in caption

    again = subprocess.run(demo, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0 and _counts(_last_line(again.stdout)) == (0, 0, 24, 0), again.stdout[-2000:]

    run_env = {**env, "PYTHONPATH": f"{clone / 'examples' / 'prefix_or_least'}:{clone}"}

    def repro_run(*args: str) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "repro.run", *args, f"results_dir={results}"], cwd=clone,
                             env=run_env, capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return res

    copied = repro_run("+exp=fig2_main", "protocol=text", "seed=0,1,2", "workload=gsp", "exp_name=another", "policy=lbgr_rlt,prefix_or_least_lru",
                       "tracking=disabled")
    assert _counts(_last_line(copied.stdout)) == (0, 6, 0, 0)

    def stale_policies() -> list[str]:
        out = repro_run(*GRID, "--dry-run").stdout
        # cell lines only: the summary line counts stale cells too
        return sorted(re.search(r"policy=(\S+)", line).group(1) for line in out.splitlines()
                      if " stale " in line and "policy=" in line)

    router = clone / "examples" / "prefix_or_least" / "prefix_or_least" / "router.py"
    text = router.read_text()
    router.write_text("# a comment added by the test\n" + text.replace('"""Send a request', '"""Reworded: send a request'))
    assert stale_policies() == []
    router.write_text(text.replace("return best\n", "return best if best >= 0 else 0\n"))
    assert stale_policies() == ["prefix_or_least_lru"] * 3
