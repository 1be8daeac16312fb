"""A broken per-site file in conf/local/ is one line and exit 2, before any work (issue 41, point 9:
Hydra printed the YAML parser's 89-line traceback)."""

from __future__ import annotations

import shutil
import sys

from repro import confutil
from tests.harness.helpers import cli_args


def test_a_broken_local_yaml_is_one_line(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "conf"
    shutil.copytree(confutil.CONF_DIR, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local").mkdir()
    (conf / "local" / "default.yaml").write_text("foo: [1, 2\nbar: : :\n")
    monkeypatch.setattr(confutil, "CONF_DIR", conf)
    monkeypatch.setattr(sys, "argv", ["repro.run"])
    from repro.run import main

    rc = main(cli_args(tmp_path, "+exp=tiny", "tracking=disabled", "--dry-run"))
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "conf/local/default.yaml is not valid YAML (line 2, column 4" in err, err
