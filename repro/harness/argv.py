"""Command-line preparation for `python -m repro.run`, before Hydra parses anything.

- `+exp=NAME` -> `exp=NAME`. The defaults list has `exp: null`, and Hydra refuses to
  *add* a group that is already in the defaults list; the README's `+exp=` form must still
  work, so it is rewritten to the plain override (which is what it means here).
- Without `-m`, sweep overrides (`seed=0,1`, `workload.request_rate=range(4,21,4)`) are taken
  out of argv (Hydra's run mode would reject them) and handed to the in-process grid, which
  combines them with the experiment's `hydra.sweeper.params` exactly as the basic sweeper
  would with `-m`.
- Without `-m`, `router.<key>=` / `eviction.<key>=` overrides leave Hydra's argv too (unless a
  flag like `--cfg` asks Hydra to print the config): the grid gives each to the cells whose system
  has that key (repro.harness.knobs), while Hydra's own composition uses the default policy.
- `--dry-run` (ours): list the cells, their signatures and which are finished; run nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Hydra flags that take a value in the next token (argparse in hydra/_internal/utils.py).
_FLAGS_WITH_VALUE = {
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--shell-completion",
    "-sc",
    "--experimental-rerun",
}
_FLAGS_OPTIONAL_VALUE = {"--info", "-i"}  # `--info [config|defaults|...]`
_MULTIRUN = {"-m", "--multirun"}
# Hydra's inspection flags print the composed config themselves: it keeps every override then.
_INSPECT = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve"}
DRY_RUN = "--dry-run"


@dataclass
class PreparedArgv:
    argv: list[str]  # what Hydra will parse
    overrides: list[str] = field(default_factory=list)  # all task overrides, original order
    multirun: bool = False
    dry_run: bool = False


def _is_override(token: str) -> bool:
    return not token.startswith("-") and "=" in token


def _rewrite(token: str) -> str:
    for prefix in ("+exp=", "++exp="):
        if token.startswith(prefix):
            return "exp=" + token[len(prefix) :]
    return token


def _is_hydra_override(token: str) -> bool:
    key = token.split("=", 1)[0].lstrip("+~")
    return key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/")


def prepare_argv(argv: list[str]) -> PreparedArgv:
    from repro.harness.grid import split_sweep_overrides

    out: list[str] = []
    overrides_pos: list[int] = []
    multirun = dry_run = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == DRY_RUN:
            dry_run = True
        elif tok in _MULTIRUN:
            multirun = True
            out.append(tok)
        elif tok in _FLAGS_WITH_VALUE:
            out.append(tok)
            if i + 1 < len(argv):
                out.append(argv[i + 1])
                i += 1
        elif tok in _FLAGS_OPTIONAL_VALUE:
            out.append(tok)
            if i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]:
                out.append(argv[i + 1])
                i += 1
        elif _is_override(tok):
            overrides_pos.append(len(out))
            out.append(_rewrite(tok))
        else:
            out.append(tok)
        i += 1

    if multirun:
        # Hydra composes the sweep's own config with the default policy, which may lack a knob of
        # the swept systems: `++` lets that composition pass; every job then has the key, and the
        # grid check (repro.harness.callbacks) refuses a job whose system lacks it.
        from repro.harness.knobs import system_knob

        for p in overrides_pos:
            if system_knob(out[p]):
                out[p] = "++" + out[p]
    task = [out[p] for p in overrides_pos if not _is_hydra_override(out[p])]
    drop: set[str] = set()
    if not multirun:
        _, sweeps = split_sweep_overrides(task)
        drop = set(sweeps)
        if not any(t in _INSPECT for t in out):
            # router./eviction. knobs: the grid applies each to the systems that have it
            # (repro.harness.knobs); Hydra's single composition (the default policy) may lack it
            from repro.harness.knobs import system_knob

            drop |= {t for t in task if system_knob(t)}
    # Flags first, then overrides: Hydra's argparse cannot take overrides on both sides of a
    # flag (`+exp=X --cfg job seed=1` would be "unrecognized arguments").
    pos = set(overrides_pos)
    flags = [t for j, t in enumerate(out) if j not in pos]
    kept = [out[j] for j in overrides_pos if out[j] not in drop]
    return PreparedArgv(argv=flags + kept, overrides=task, multirun=multirun, dry_run=dry_run)
