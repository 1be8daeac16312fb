"""Test-only fault injection, so crash-and-resume can be tested deterministically.

REPRO_FAULT="ACTION:STAGE:N[;ACTION:STAGE:N...]" makes the N-th cell (1-based) that this
process reaches STAGE misbehave:
  ACTION  kill  -> SIGKILL this process at once (no cleanup, like `kill -9` or an OOM kill)
          raise -> raise InjectedFault (the cell fails like a crashing backend)
          term_in_library / int_in_library -> SIGTERM / SIGINT to this process inside a block
                   that turns whatever the handler raises into its own RuntimeError (as
                   OmegaConf.create does with a stop that lands inside it)
  STAGE   start          after config.yaml is written, before the backend runs
          before_summary after requests.parquet and timings.json, before summary.json
Unset in normal use; it costs one dict lookup per stage.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "REPRO_FAULT"
STAGES = ("start", "before_summary")
ACTIONS = ("kill", "raise", "term_in_library", "int_in_library")
_counts: dict[str, int] = {}


class InjectedFault(RuntimeError):
    pass


def _plan() -> list[tuple[str, str, int]]:
    spec = os.environ.get(ENV, "").strip()
    out = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        action, stage, n = part.split(":")
        if action not in ACTIONS or stage not in STAGES:
            raise ValueError(f"{ENV}: bad entry {part!r} (ACTION {'|'.join(ACTIONS)}, STAGE {'|'.join(STAGES)})")
        out.append((action, stage, int(n)))
    return out


def checkpoint(stage: str) -> None:
    if ENV not in os.environ:
        return
    _counts[stage] = _counts.get(stage, 0) + 1
    for action, st, n in _plan():
        if st == stage and n == _counts[stage]:
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if action in ("term_in_library", "int_in_library"):
                _signal_inside_a_library(signal.SIGTERM if action == "term_in_library" else signal.SIGINT)
            raise InjectedFault(f"injected fault at {stage} of cell #{n} ({ENV})")


def _signal_inside_a_library(signum: int) -> None:
    try:
        signal.pthread_kill(threading.main_thread().ident, signum)  # handled before the call returns
        signal.sigtimedwait([], 0)  # a C call that returns at once: the handler has run by now
    except BaseException as exc:  # what a library does that catches everything
        raise RuntimeError(f"a library's own error, hiding {type(exc).__name__}") from exc
    raise RuntimeError(f"signal {signum} had no handler that raised")
