"""repro.harness.hydra_adapter: the one place that touches Hydra's private API, and its version check."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import hydra
import pytest
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from repro import confutil
from repro.harness import hydra_adapter
from repro.harness.hydra_adapter import (
    TESTED_HYDRA_VERSIONS,
    HydraVersionError,
    apply_value_overrides,
    check_hydra_version,
    config_repository,
    split_sweep,
)

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_NAMES = {"_apply_overrides_to_config", "_parse_overrides_and_create_caching_repo", "_locate", "split_arguments"}


def test_the_pinned_hydra_is_a_tested_one():
    pins = re.findall(r"^hydra-core==(\S+)$", (ROOT / "constraints.txt").read_text(), flags=re.M)
    assert pins and pins[0] in TESTED_HYDRA_VERSIONS
    assert hydra.__version__ in TESTED_HYDRA_VERSIONS  # this environment is the pinned one


def test_another_version_is_refused_with_both_versions_named():
    with pytest.raises(HydraVersionError) as err:
        check_hydra_version("1.4.0")
    assert "hydra-core 1.4.0" in str(err.value) and TESTED_HYDRA_VERSIONS[0] in str(err.value)


def test_the_first_use_checks_the_installed_version(monkeypatch):
    monkeypatch.setattr(hydra_adapter, "_installed_passed", False)
    monkeypatch.setattr(hydra, "__version__", "1.4.0")
    parsed = OverridesParser.create().parse_overrides(["seed=0,1"])
    with pytest.raises(HydraVersionError, match="1.4.0"):
        split_sweep(parsed)


def test_split_apply_and_repository_do_what_hydra_does():
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y"])
    assert split_sweep(parsed) == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]
    cfg = OmegaConf.create({"seed": 0, "workload": {"request_rate": 12.0}})
    apply_value_overrides(OverridesParser.create().parse_overrides(["seed=3", "workload.request_rate=8"]), cfg)
    assert OmegaConf.to_container(cfg) == {"seed": 3, "workload": {"request_rate": 8}}
    with initialize_config_dir(config_dir=str(confutil.CONF_DIR), version_base="1.3"):
        repo = config_repository("config", [])
        assert repo.group_exists("router") and not repo.group_exists("seed")


def test_no_other_module_uses_hydras_private_api():
    offenders = []
    for path in sorted((ROOT / "repro").rglob("*.py")) + sorted((ROOT / "hydra_plugins").rglob("*.py")):
        if path.name == "hydra_adapter.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            if any(m.startswith("hydra") and any(part.startswith("_") for part in m.split(".")) for m in modules):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {modules}")
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} uses .{node.attr}")
    assert not offenders, "Hydra's private API outside repro/harness/hydra_adapter.py:\n" + "\n".join(offenders)
