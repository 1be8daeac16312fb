"""Staleness both ways: editing a function of the simulator, a router, eviction, a workload or the
cost model changes a cell's fingerprint; comments, docstrings, the figures and the docs do not."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from repro.harness.freshness import cell_fingerprint, cell_state
from repro.results import fingerprint as fp
from tests.harness.helpers import ROOT, compose_fixture


@pytest.fixture(scope="module")
def cfg() -> dict:
    return compose_fixture(["exp=tiny", "policy=lbgr_rlt", "tracking=disabled"])


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A copy of the code (repro/, docs/) whose files the tests edit."""
    shutil.copytree(ROOT / "repro", tmp_path / "repro", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def edit_a_function(path: Path) -> None:
    """Change the first `return <expr>` of the file (same file, one function's body differs)."""
    text = path.read_text()
    new, n = re.subn(r"(\n\s+)return (\S)", r"\1return 0 or \2", text, count=1)
    assert n == 1, path
    path.write_text(new)


def edit_comments_and_docstrings(path: Path) -> None:
    text = path.read_text()
    text = "# an added comment line\n" + text.replace('"""', '"""Reworded. ', 1)
    text = re.sub(r"(\n\s+def [^\n]+:\n\s+)\"\"\"", r'\1"""Reworded too. ', text, count=1)
    text = text.replace("\n\n", "\n\n# another comment\n", 1)
    path.write_text(text)


CODE = {
    "simulator": "repro/sim/cluster.py",
    "router": "repro/routing/lbgr.py",
    "eviction": "repro/kvcache/eviction/rlt.py",
    "workload": "repro/workloads/gsp.py",
    "cost model": "repro/costmodel/model.py",
}


@pytest.mark.parametrize("what", list(CODE))
def test_editing_a_function_makes_the_cell_stale(cfg, checkout, what):
    before = cell_fingerprint(cfg, root_dir=checkout)
    assert CODE[what] in before["code"], f"{CODE[what]} is not in the cell's import closure"
    edit_a_function(checkout / CODE[what])
    after = cell_fingerprint(cfg, root_dir=checkout)
    assert after["fingerprint"] != before["fingerprint"]
    assert fp.differences(before, after) == [f"code: {CODE[what]} changed"]


@pytest.mark.parametrize("what", list(CODE))
def test_editing_comments_and_docstrings_keeps_it_fresh(cfg, checkout, what):
    before = cell_fingerprint(cfg, root_dir=checkout)
    edit_comments_and_docstrings(checkout / CODE[what])
    assert (checkout / CODE[what]).read_text() != (ROOT / CODE[what]).read_text()
    assert cell_fingerprint(cfg, root_dir=checkout) == before


def test_figures_docs_and_tracking_are_not_inputs(cfg, checkout):
    before = cell_fingerprint(cfg, root_dir=checkout)
    for rel in ("repro/figures/style.py", "repro/tracking/__init__.py", "repro/harness/sweep.py"):
        edit_a_function(checkout / rel)
    (checkout / "docs" / "ARCHITECTURE.md").write_text("rewritten\n")
    assert cell_fingerprint(cfg, root_dir=checkout) == before


def test_cost_model_data_file_is_an_input(cfg, checkout):
    before = cell_fingerprint(cfg, root_dir=checkout)
    data = checkout / "repro/costmodel/data/h200_profile.json"
    data.write_text(data.read_text() + " ")
    after = cell_fingerprint(cfg, root_dir=checkout)
    assert fp.differences(before, after) == ["package_data: repro/costmodel/data/h200_profile.json changed"]


def test_only_the_routers_and_workloads_a_cell_names_are_roots(cfg):
    f = cell_fingerprint(cfg)
    assert "repro/workloads/gsp.py" in f["code"] and "repro/workloads/ultrachat.py" not in f["code"]
    assert not any(k.startswith(("repro/figures/", "repro/tracking/", "repro/harness/")) for k in f["code"])
    assert {"numpy", "pandas", "pyarrow", "python"} <= set(f["versions"])


def test_library_version_change_is_reported(cfg):
    f = cell_fingerprint(cfg)
    old = {**f, "versions": {**f["versions"], "numpy": "0.0.1"}, "fingerprint": "x"}
    assert fp.differences(old, f) == [f"versions: numpy 0.0.1 -> {f['versions']['numpy']}"]


def test_workload_data_file_is_an_input(tmp_path):
    data = tmp_path / "sharegpt.json"
    data.write_text('[{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}]')
    cfg = compose_fixture(["exp=tiny", "workload=sharegpt", f"workload.path={data}", "tracking=disabled"])
    a = cell_fingerprint(cfg)
    data.write_text('[{"conversations": [{"from": "human", "value": "quite other words"}, {"from": "gpt", "value": "fine"}]}]')
    b = cell_fingerprint(cfg)
    assert a["data"]["workload"]["sha256"] != b["data"]["workload"]["sha256"]
    assert fp.differences(a, b) == ["data: workload changed"]


def test_cell_state(tmp_path, cfg):
    cur = cell_fingerprint(cfg)
    d = tmp_path / "cell"
    d.mkdir()
    assert cell_state(d, cur) == ("missing", [])
    (d / "summary.json").write_text("{}")
    state, why = cell_state(d, cur)
    assert state == "stale" and "no fingerprint.json" in why[0]
    import json

    (d / fp.FINGERPRINT).write_text(json.dumps(cur))
    assert cell_state(d, cur) == ("fresh", [])


def test_fingerprint_is_cheap_once_warm(cfg):
    import time

    cell_fingerprint(cfg)
    t0 = time.perf_counter()
    for _ in range(20):
        cell_fingerprint(cfg)
    assert (time.perf_counter() - t0) / 20 < 0.05


# -- out-of-tree code (issue 32 point 1) and what a backend reads (issue 34 point 7) ------------

ROUTER_MODULE = '''"""A user's router, on the path."""
from repro.routing.simple import RandomRouter
from helper_for_myrouter import pick


class MyRouter(RandomRouter):
    def select_worker(self, request, workers, now_s):
        return pick(super().select_worker(request, workers, now_s))
'''


@pytest.fixture()
def user_module(tmp_path, monkeypatch) -> Path:
    """myrouter.py (importing a helper module beside it) in a folder on sys.path."""
    from repro import codehash

    (tmp_path / "myrouter.py").write_text(ROUTER_MODULE)
    (tmp_path / "helper_for_myrouter.py").write_text("def pick(w):\n    return w\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    codehash._origin_cached.cache_clear()
    yield tmp_path
    codehash._origin_cached.cache_clear()


def test_an_out_of_tree_router_is_hashed_with_its_imports(cfg, user_module):
    mine = {**cfg, "router": {**cfg["router"], "_target_": "myrouter.MyRouter"}}
    before = cell_fingerprint(mine)
    assert {"myrouter.py", "helper_for_myrouter.py"} <= set(before["code"])
    assert "myrouter" not in before["versions"] and "helper_for_myrouter" not in before["versions"]
    paper = cell_fingerprint(cfg)
    edit_comments_and_docstrings(user_module / "myrouter.py")
    assert cell_fingerprint(mine) == before
    edit_a_function(user_module / "helper_for_myrouter.py")
    after = cell_fingerprint(mine)
    assert fp.differences(before, after) == ["code: helper_for_myrouter.py changed"]
    assert cell_fingerprint(cfg) == paper  # the paper's cells do not import it


def _fake_distribution(site: Path, top: str, direct_url: dict | None) -> None:
    import json

    (site / top).mkdir()
    (site / top / "__init__.py").write_text("X = 1\n")
    info = site / f"{top}-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {top}\nVersion: 1.2\n")
    (info / "top_level.txt").write_text(top + "\n")
    (info / "RECORD").write_text("")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def _fake_egg_info(src: Path, top: str) -> None:
    """What `pip install -e` of a setup.py project leaves in its source folder: <name>.egg-info beside the code."""
    (src / top).mkdir()
    (src / top / "__init__.py").write_text("def pick(w):\n    return w\n")
    info = src / f"{top}.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {top}\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text(top + "\n")
    (info / "SOURCES.txt").write_text(f"{top}/__init__.py\n")


def test_editable_installs_count_by_code_released_ones_by_version(tmp_path, monkeypatch):
    from repro import codehash
    from repro.confutil import PROJECT_ROOT

    site = tmp_path / "site-packages"
    site.mkdir()
    _fake_distribution(site, "h32_editable_pkg", {"url": f"file://{tmp_path}", "dir_info": {"editable": True}})
    _fake_distribution(site, "h32_released_pkg", None)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(codehash, "_site_dirs", lambda: frozenset({site.resolve()}))
    tmp_path = site
    for memo in (codehash._origin_cached, codehash._distributions, codehash._dist_info):
        memo.cache_clear()
    try:
        assert codehash.module_origin("h32_editable_pkg", PROJECT_ROOT) == ("code", tmp_path)
        assert codehash.module_origin("h32_released_pkg", PROJECT_ROOT) == ("version", {"h32_released_pkg": "1.2"})
        assert codehash.module_origin("json", PROJECT_ROOT) == ("stdlib", None)
        assert codehash.module_origin("repro", PROJECT_ROOT) == ("code", PROJECT_ROOT)
        f = codehash.code_fingerprint(["h32_editable_pkg", "h32_released_pkg"], root_dir=PROJECT_ROOT)
        assert list(f["code"]) == ["h32_editable_pkg/__init__.py"] and f["versions"]["h32_released_pkg"] == "1.2"
    finally:
        for memo in (codehash._origin_cached, codehash._distributions, codehash._dist_info):
            memo.cache_clear()


def test_metadata_beside_source_is_no_release(tmp_path, monkeypatch):
    """Issue 41 point 3: an .egg-info (or even a dist-info with RECORD) found in a folder on the path
    that is no site-packages folder does not make its package a release: its code is hashed, an
    edit makes the cells stale."""
    from repro import codehash
    from repro.confutil import PROJECT_ROOT

    src = tmp_path / "src"
    src.mkdir()
    _fake_egg_info(src, "h41_egg_pkg")
    _fake_distribution(src, "h41_record_pkg", None)  # RECORD, but not where an installer puts it
    monkeypatch.syspath_prepend(str(src))
    for memo in (codehash._origin_cached, codehash._distributions, codehash._dist_info):
        memo.cache_clear()
    try:
        from importlib import metadata

        assert metadata.version("h41_egg_pkg") == "0.1.0"  # importlib does find the metadata
        assert codehash.module_origin("h41_egg_pkg", PROJECT_ROOT) == ("code", src)
        assert codehash.module_origin("h41_record_pkg", PROJECT_ROOT) == ("code", src)
        before = codehash.code_fingerprint(["h41_egg_pkg"], root_dir=PROJECT_ROOT)
        assert list(before["code"]) == ["h41_egg_pkg/__init__.py"] and "h41_egg_pkg" not in before["versions"]
        edit_a_function(src / "h41_egg_pkg" / "__init__.py")
        after = codehash.code_fingerprint(["h41_egg_pkg"], root_dir=PROJECT_ROOT)
        assert before["code"] != after["code"] and set(after["code"]) == {"h41_egg_pkg/__init__.py"}
    finally:
        for memo in (codehash._origin_cached, codehash._distributions, codehash._dist_info):
            memo.cache_clear()


def test_the_projects_dependencies_stay_releases():
    from repro import codehash
    from repro.confutil import PROJECT_ROOT

    for top, dist in (("numpy", "numpy"), ("yaml", "pyyaml"), ("omegaconf", "omegaconf")):
        kind, versions = codehash.module_origin(top, PROJECT_ROOT)
        assert kind == "version" and dist in versions, (top, kind, versions)


def test_theory_cells_do_not_depend_on_routers_or_workloads(checkout):
    theory = compose_fixture(["exp=thm_competitive_ratio", "tracking=disabled"])
    before = cell_fingerprint(theory, root_dir=checkout)
    assert not any(k.startswith(("repro/routing/", "repro/workloads/")) for k in before["code"])
    edit_a_function(checkout / "repro/routing/lbgr.py")
    edit_a_function(checkout / "repro/workloads/gsp.py")
    assert cell_fingerprint(theory, root_dir=checkout) == before
    edit_a_function(checkout / "repro/kvcache/eviction/rlt.py")  # the replayer runs it
    assert fp.differences(before, cell_fingerprint(theory, root_dir=checkout)) == \
        ["code: repro/kvcache/eviction/rlt.py changed"]


def test_the_workload_pool_key_follows_the_same_closure(monkeypatch):
    from repro import codehash
    from repro.workloads import cache

    seen = []
    real = codehash.code_fingerprint
    monkeypatch.setattr(codehash, "code_fingerprint", lambda roots, **kw: seen.append(list(roots)) or real(roots, **kw))
    cache.code_fingerprint("repro.workloads.gsp")
    assert seen == [["repro.workloads.gsp"]]
    assert "repro/workloads/gsp.py" in real(["repro.workloads.gsp"], root_dir=ROOT)["code"]


def test_a_same_size_data_edit_with_its_mtime_put_back_is_noticed(tmp_path):
    """Issue 34 point 7: the memos key on (dev, inode, size, mtime, ctime), not path + size + mtime."""
    import os

    data = tmp_path / "sharegpt.json"
    body = '[{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]}]'
    data.write_text(body)
    cfg = compose_fixture(["exp=tiny", "workload=sharegpt", f"workload.path={data}", "tracking=disabled"])
    before = cell_fingerprint(cfg)
    st = data.stat()
    probe = tmp_path / "probe"
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:  # the clock's next tick (coarse on some filesystems)
        probe.touch()
    with open(data, "r+") as f:  # same inode, same size, other words
        f.write(body.replace("hello there", "hello where"))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (data.stat().st_size, data.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert fp.differences(before, cell_fingerprint(cfg)) == ["data: workload changed"]
