"""Which protocol an artefact is drawn under, and what its files are called (issue 39).

An experiment folder holds the cells of both protocols side by side (`protocol=text`: the paper's
text; `protocol=artifact`: the authors' scripts, conf/protocol/). Every artefact is drawn once per
protocol present in its results folder, inside repro.figures.load.protocol_view. The
experiment's default protocol (what `python -m repro.run +exp=X` runs, read from conf/exp/X.yaml's
composed config) keeps the plain file names (figures/fig2_main.png); every other protocol's files
carry it before their extension (figures/fig2_main.text.png, .text.csv, .text.caption.txt,
tab2_ablation.text.md). The file names are applied by repro.figures.style's writers, through
`protocol_files`, so figure modules name their files as before.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from repro.confutil import CONF_DIR
from repro.figures.load import DEFAULT_PROTOCOL

# What a caption says about each protocol (captions.provenance_caption).
PROTOCOL_WORDS = {
    "artifact": "artifact (the authors' scripts: sglang-router 0.1.4's cache-aware rule, LBGR and RLT as shipped, "
    "SGLang 0.4.6 server defaults, their workloads and metric definitions)",
    "text": "text (the paper's text)",
}
# Endings the writers keep last: the suffix goes before the longest one a file name ends with.
ENDINGS = (".caption.txt", ".png", ".pdf", ".csv", ".md", ".tex", ".txt", ".json")

_SUFFIX: ContextVar[str] = ContextVar("protocol_file_suffix", default="")


def default_protocol(exp: str) -> str:
    """The protocol `python -m repro.run +exp=<exp>` runs: protocol.name of conf/exp/<exp>.yaml's
    composed config; text for an experiment without a conf file (the user's own folders). An
    override folder (`<exp>+<changes>`) has its paper experiment's default."""
    from repro.figures.overrides import paper_of

    exp = paper_of(exp) or exp
    path = CONF_DIR / "exp" / f"{exp}.yaml"
    if not path.is_file():
        return DEFAULT_PROTOCOL
    return _composed_protocols().get(exp) or _listed_protocol(path)


@functools.lru_cache(maxsize=1)
def _composed_protocols() -> dict[str, str]:
    """protocol.name of every conf/exp/*.yaml's composed config, composed once per process (an
    experiment file that does not compose, or a caller inside a running Hydra app, is left out:
    default_protocol then reads the experiment's defaults list)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import repro.harness.schema  # noqa: F401  (registers the structured schema before composition)

    if GlobalHydra.instance().is_initialized():  # inside a running Hydra app: leave its state alone
        return {}
    out = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for path in sorted((CONF_DIR / "exp").glob("*.yaml")):
            try:
                cfg = compose(config_name="config", overrides=[f"exp={path.stem}"])
            except Exception:  # noqa: BLE001 — see the docstring
                continue
            out[path.stem] = str((cfg.get("protocol") or {}).get("name") or DEFAULT_PROTOCOL)
    return out


def _listed_protocol(path: Path) -> str:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    for entry in data.get("defaults") or ():
        if isinstance(entry, dict):
            for k, v in entry.items():
                if str(k).replace("override", "").strip().strip("/") == "protocol":
                    return str(v)
    return DEFAULT_PROTOCOL


def file_suffix(exp: str, protocol: str | None) -> str:
    """ "" for the experiment's default protocol (or no protocol), else ".<protocol>"."""
    if protocol is None or protocol == default_protocol(exp):
        return ""
    return f".{protocol}"


@contextmanager
def protocol_files(suffix: str):
    """Within the block, repro.figures.style's writers put `suffix` before each file's ending."""
    token = _SUFFIX.set(suffix)
    try:
        yield suffix
    finally:
        _SUFFIX.reset(token)


def suffixed(filename: str) -> str:
    """filename with the open protocol_files suffix before its ending (fig2_main.caption.txt ->
    fig2_main.text.caption.txt)."""
    suffix = _SUFFIX.get()
    if not suffix:
        return filename
    for end in sorted(ENDINGS, key=len, reverse=True):
        if filename.endswith(end):
            return filename[: -len(end)] + suffix + end
    return filename + suffix


def output_name(name: str, protocol: str | None, ending: str) -> str:
    """The file an artefact's drawing under `protocol` writes: output_name("fig2_main", "text", ".png")."""
    return f"{name}{file_suffix(name, protocol)}{ending}"


__all__ = ["ENDINGS", "PROTOCOL_WORDS", "default_protocol", "file_suffix", "output_name", "protocol_files", "suffixed"]
