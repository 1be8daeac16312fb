"""The one loader of results/ for every figure, table and claim (reads files, never runs anything).

A finished cell is a folder results/<exp>/<sig>/ holding summary.json (written last by the
harness, so its presence marks the cell finished), config.yaml and timings.json. A cell whose
files no longer match its checksum manifest (repro.results.store) is a ResultsError naming it,
never a row; one without a manifest counts as stale. One row per finished cell:

- `exp`, `signature`;
- every config.yaml field under its dotted name (`workload.request_rate`,
  `cluster.scheduler.max_running_requests`, `policy_name`, `seed`, ...);
- every summary.json metric under its own name (`hit_rate`, `latency_p50_s`, ...);
- provenance under `prov.` (`prov.backend`, `prov.workload.synthetic`, ...);
- timings.json under `timings.` (`timings.harness.backend_wall_s`,
  `timings.eviction.total_s`, ...);
- DERIVED per-cell columns (add_overheads): eviction / routing ms per query, cpu_s.

Lists become tuples (hashable, comparable). Folders without summary.json are unfinished or
failed cells (error.txt) and are counted, never read.

`aggregate` groups cells by the keys a figure shows and averages over seeds, after checking
that nothing else differs between the cells it pools: two cells for the same point and seed
(a stale cell from an older grid), or cells that differ in a config field the figure does not
show, are a ResultsError naming the signatures and the fields — never a silent average.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml

from repro.metrics.summary import REGIMES, SUMMARY_KEYS, TEXT_SUMMARY_KEYS
from repro.results.signature import NON_RESULT_KEYS
from repro.results.store import CellStore

# The six metrics every performance figure shows (paper §5 "Metrics").
METRICS: tuple[str, ...] = ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s", "hit_rate", "throughput_rps")
# Computed per cell from timings.json by add_overheads (ms per query; cpu_s = backend wall time).
DERIVED: tuple[str, ...] = ("eviction_ms_per_query", "routing_ms_per_query", "cpu_s")
SYSTEM = "policy_name"
SEED = "seed"
# The protocol view (issue 39): every row's protocol (`protocol.name` of its config; cells without
# the key are text) and, where the cell's protocol maps it (`protocol.paper_names`), its system under
# the paper's name in SYSTEM with the implementation's name kept in SYSTEM_IMPL.
PROTOCOL = "protocol"
SYSTEM_IMPL = "policy_impl"
DEFAULT_PROTOCOL = "text"
PROTOCOLS: tuple[str, ...] = ("artifact", "text")  # the claims table's column order (others sort after)


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


class ResultsError(RuntimeError):
    """results/ cannot give a figure what it needs (missing, stale or ambiguous cells)."""


def _hashable(v):
    """A cell value as a DataFrame cell that can be grouped and compared: lists -> tuples,
    dicts -> canonical JSON. Not repro.confutil.to_plain (OmegaConf nodes -> containers): the
    values here come from json / yaml.load, never OmegaConf, and must stop being containers."""
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def flatten(obj: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists -> tuples, dicts inside lists -> canonical JSON."""
    out: dict = {}
    if not isinstance(obj, dict):
        return out
    stack = [(prefix, obj)]
    while stack:
        pre, node = stack.pop()
        for k, v in node.items():
            if isinstance(v, dict) and v:
                stack.append((f"{pre}{k}.", v))
            else:
                out[f"{pre}{k}"] = None if isinstance(v, dict) else _hashable(v)
    return dict(sorted(out.items()))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from exc


def cell_dirs(results_dir: str | Path, exp: str) -> list[Path]:
    root = Path(results_dir) / exp
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def cell_counts(results_dir: str | Path, exp: str) -> dict[str, int]:
    """finished (summary.json), failed (error.txt, no summary), unfinished (neither)."""
    counts = {"finished": 0, "failed": 0, "unfinished": 0}
    for d in cell_dirs(results_dir, exp):
        if (d / CellStore.SUMMARY).is_file():
            counts["finished"] += 1
        elif (d / CellStore.ERROR).is_file():
            counts["failed"] += 1
        else:
            counts["unfinished"] += 1
    return counts


_MEMO: dict | None = None
_VIEW: ContextVar[str | None] = ContextVar("protocol_view", default=None)


@contextmanager
def protocol_view(name: str | None):
    """Within the block, load_cells returns only the cells of protocol `name` (None: all), so
    that a figure module or a claim rule sees one protocol at a time."""
    token = _VIEW.set(name)
    try:
        yield name
    finally:
        _VIEW.reset(token)


def current_protocol() -> str | None:
    """The protocol of the open protocol_view block (None outside one)."""
    return _VIEW.get()


def protocols_present(results_dir: str | Path, exp: str) -> list[str]:
    """The protocols of results/<exp>/'s finished cells, in PROTOCOLS order (others after, sorted)."""
    with protocol_view(None):
        df = load_cells(results_dir, exp)
    found = set(df[PROTOCOL]) if len(df) else set()
    return [p for p in PROTOCOLS if p in found] + sorted(found - set(PROTOCOLS))


@contextmanager
def memoized_loads():
    """Within the block, load_cells reads each results/<exp>/ once (one CLI run renders and
    evaluates claims from the same files; nothing writes results/ meanwhile)."""
    global _MEMO
    outer = _MEMO
    _MEMO = {} if outer is None else outer
    try:
        yield _MEMO
    finally:
        _MEMO = outer


def remember(frames: Mapping) -> None:
    """Add frames load_cells made elsewhere (a worker that drew a finished experiment's figures)
    to the open memoized_loads block, if any, so that they are not read again here."""
    if _MEMO is not None:
        _MEMO.update(frames)


def load_cells(results_dir: str | Path, exp: str) -> pd.DataFrame:
    """One row per finished cell of results/<exp>/ (empty frame when there is none); inside a
    protocol_view block only that protocol's cells."""
    key = (str(Path(results_dir).resolve()), exp)
    if _MEMO is not None:
        if key not in _MEMO:
            _MEMO[key] = _load_cells(results_dir, exp)
        df = _MEMO[key].copy()
    else:
        df = _load_cells(results_dir, exp)
    view = _VIEW.get()
    if view is None or df.empty:
        return df
    attrs = dict(df.attrs)
    df = df[df[PROTOCOL] == view].reset_index(drop=True)
    df.attrs = attrs
    return df


def _is_stale(cell_dir: Path, config: dict) -> bool:
    """Made by other code/data/libraries than this checkout's (kept by keep_stale=true)? Captions say so."""
    from repro.harness.freshness import cell_fingerprint, cell_state

    try:
        return cell_state(cell_dir, cell_fingerprint(config))[0] == "stale"
    except Exception:  # cannot even compute what it would be now: not what this checkout makes
        return True


def _load_cells(results_dir: str | Path, exp: str) -> pd.DataFrame:
    rows, summary_cols, unfinished = [], set(), []
    for d in cell_dirs(results_dir, exp):
        summary_path = d / CellStore.SUMMARY
        if not summary_path.is_file():  # failed, unfinished or emptied: the captions name it
            unfinished.append(d.name)
            continue
        integrity, why = CellStore.at(d).integrity()
        if integrity == "damaged":  # never plotted: the figure names it and how to mend it
            raise ResultsError(
                f"{d}: damaged ({'; '.join(why)}); rerun its experiment (it recomputes damaged "
                f"cells) or delete the folder"
            )
        summary = _read_json(summary_path)
        config_path = d / CellStore.CONFIG
        if not config_path.is_file():
            raise ResultsError(f"{d}: summary.json without config.yaml (a cell folder must hold both)")
        config = yaml.load(config_path.read_text(), Loader=_YAML_LOADER) or {}
        timings = _read_json(d / CellStore.TIMINGS) if (d / CellStore.TIMINGS).is_file() else {}
        row = {"exp": exp, "signature": d.name, "stale": integrity == "unsealed" or _is_stale(d, config)}
        row["unsealed"] = integrity == "unsealed"  # no manifest: its numbers may be hand-edited
        row.update(flatten(config))
        for k, v in summary.items():
            if k == "provenance":
                continue
            if k in row:  # theory cells repeat their parameters in the summary: fine if equal
                if _key(row[k]) != _key(_hashable(v)):
                    raise ResultsError(f"{summary_path}: summary {k}={v!r} contradicts config.yaml ({row[k]!r})")
                continue
            if k in NUMERIC_SUMMARY_KEYS and not _is_number(v):
                raise ResultsError(f"{summary_path}: {k}={v!r} is not a number (edited by hand?); rerun the cell")
            row[k] = _hashable(v)
            summary_cols.add(k)
        row.update(flatten(summary.get("provenance") or {}, "prov."))
        row.update(flatten(timings, "timings."))
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["unfinished"] = unfinished
    if df.empty:
        return df
    for k in SUMMARY_KEYS:
        if k in df and k not in TEXT_SUMMARY_KEYS:
            df[k] = pd.to_numeric(df[k], errors="coerce")
    df = add_overheads(with_protocol(df))
    df.attrs["summary_columns"] = sorted(summary_cols)
    df.attrs["unfinished"] = unfinished
    return df


NUMERIC_SUMMARY_KEYS = frozenset(SUMMARY_KEYS) - frozenset(TEXT_SUMMARY_KEYS)


def _is_number(v) -> bool:
    """A metric as the harness writes it: a number, or null / NaN where it is undefined."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def with_protocol(df: pd.DataFrame) -> pd.DataFrame:
    """PROTOCOL per row (`protocol.name`, text without it); SYSTEM under the paper's name where the
    cell's `protocol.paper_names` pairs map it, the implementation's name in SYSTEM_IMPL."""
    df = df.copy()
    names = df["protocol.name"] if "protocol.name" in df else pd.Series(None, index=df.index, dtype=object)
    df[PROTOCOL] = [str(v) if isinstance(v, str) and v else DEFAULT_PROTOCOL for v in names]
    if SYSTEM not in df:
        return df
    pairs = df["protocol.paper_names"] if "protocol.paper_names" in df else pd.Series(None, index=df.index)
    df[SYSTEM_IMPL] = df[SYSTEM]
    df[SYSTEM] = [_paper_name(s, p) for s, p in zip(df[SYSTEM], pairs)]
    return df


def _paper_name(system, pairs):
    if not isinstance(system, str) or not isinstance(pairs, tuple):
        return system
    for pair in pairs:
        if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == system:
            return pair[1]
    return system


def add_overheads(df: pd.DataFrame) -> pd.DataFrame:
    """Per-query wall-clock overheads from timings.json (Table 2's last two columns), in ms.

    eviction_ms_per_query = eviction CPU time / requests; routing_ms_per_query = (routing
    decisions + completion callbacks, where LBGR learns) / requests. NaN where a backend did
    not measure them. Machine-dependent: measured on whatever ran the cell. cpu_s = the cell's
    backend time in seconds.
    """
    attrs = dict(df.attrs)
    df = df.copy()
    df.attrs = attrs
    n = pd.to_numeric(df.get("num_requests"), errors="coerce") if "num_requests" in df else np.nan

    def col(name):
        return pd.to_numeric(df[name], errors="coerce") if name in df else pd.Series(np.nan, index=df.index)

    def backend(key):  # the backend's timings sit at the top level (older cells: under "backend")
        return col(f"timings.{key}").fillna(col(f"timings.backend.{key}"))

    df["eviction_ms_per_query"] = backend("eviction.total_s") / n * 1e3
    routing = backend("routing.total_s")
    callbacks = backend("completion_callback.total_s").fillna(0.0)
    df["routing_ms_per_query"] = (routing + callbacks) / n * 1e3
    # backend wall time of the cell: the harness's, else what a standalone runner recorded
    # (repro.theory.competitive_ratio writes cpu_s / wall_s at the top of timings.json)
    df["cpu_s"] = col("timings.harness.backend_wall_s").fillna(col("timings.cpu_s")).fillna(col("timings.wall_s"))
    return df


def require(df: pd.DataFrame, exp: str, columns: Iterable[str] = ()) -> pd.DataFrame:
    if df.empty:
        view = _VIEW.get()
        if view is not None:
            raise ResultsError(
                f"no finished protocol={view} cells under results/{exp}/: run "
                f"`python -m repro.run +exp={exp} protocol={view}`"
            )
        raise ResultsError(f"no finished cells under results/{exp}/: run `python -m repro.run +exp={exp}`")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ResultsError(f"results/{exp}/: cells lack the fields {missing}")
    return df


def _config_columns(df: pd.DataFrame) -> list[str]:
    """Result-affecting config fields (not summary, provenance, timings or bookkeeping)."""
    skip = (
        set(SUMMARY_KEYS)
        | set(DERIVED)
        | set(df.attrs.get("summary_columns", ()))
        | {"exp", "signature", "stale", "unsealed"}
    )
    out = []
    for c in df.columns:
        if c in skip or c.startswith(("prov.", "timings.")):
            continue
        if c.split(".", 1)[0] in NON_RESULT_KEYS:
            continue
        if c.startswith(f"{PROTOCOL}."):  # `protocol` itself (text for cells without the key) is checked
            continue
        out.append(c)
    return out


def _key(v) -> str:
    """Comparable text for a cell value (NaN == NaN, 1 == 1.0)."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "null"
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return repr(float(v))
    return repr(v)


def check_poolable(df: pd.DataFrame, keys: Sequence[str], exp: str) -> None:
    """Raise unless the cells of each `keys` group differ in the seed only, one cell per seed
    (and never pool two protocols' cells: a figure draws one protocol at a time)."""
    keys = list(keys)
    mixed = sorted(set(df[PROTOCOL])) if PROTOCOL in df and PROTOCOL not in keys else []
    if len(mixed) > 1:
        raise ResultsError(
            f"results/{exp}/: cells of the protocols {mixed} in one table; draw one protocol at a time "
            f"(repro.figures.load.protocol_view, as `python -m repro.figures` does)"
        )
    cfg_cols = [c for c in _config_columns(df) if c not in keys and c != SEED]
    by = [df[k].map(_key) for k in keys]  # NaN-safe, type-stable group labels
    if cfg_cols:
        text = df[cfg_cols].map(_key)
        n_values = text.groupby(by, sort=False).nunique()
        bad_groups = n_values.index[(n_values > 1).any(axis=1)]
    else:
        n_values, bad_groups = None, []
    seeds = df[SEED].map(_key) if SEED in df else pd.Series("", index=df.index)
    dup = seeds.groupby(by, sort=False).apply(lambda s: s.duplicated().any())
    for group in list(dup.index[dup.to_numpy(dtype=bool)]) + list(bad_groups):
        group = _tuple(group)
        mask = np.logical_and.reduce([b.to_numpy() == g for b, g in zip(by, group)])
        g = df[mask]
        where = ", ".join(f"{k}={_plain(v)}" for k, v in zip(keys, g[keys].iloc[0].tolist()))
        varying = (
            [c for c in cfg_cols if n_values.loc[group if len(group) > 1 else group[0], c] > 1] if cfg_cols else []
        )
        if SEED in g and g[SEED].duplicated().any():
            dups = g[g[SEED].duplicated(keep=False)]
            values = "; ".join(f"{c}: {', '.join(sorted({str(_plain(v)) for v in dups[c].tolist()}))}" for c in varying)
            raise ResultsError(
                f"results/{exp}/: cells {sorted(dups['signature'])} are the same point ({where}) and seed but "
                f"differ in {varying or 'nothing shown'}{f' ({values})' if values else ''}: two settings in one "
                f"folder, e.g. a run with overrides written into the paper's folder (before override runs got "
                f"their own), or a stale cell of an older grid. Keep each setting in a folder of its own: rerun the "
                f"override with exp_name=NAME (or results_dir=DIR), move its cells out, and "
                f"`python -m repro.results prune` lists the cells conf/exp/{exp}.yaml does not produce"
            )
        raise ResultsError(
            f"results/{exp}/: cells {sorted(g['signature'])} at {where} differ in {varying}, which this "
            f"figure does not show; give such ablation rows their own policy_name, or run them into a folder "
            f"of their own (exp_name=NAME or results_dir=DIR)"
        )


def _plain(v):
    """A value as a plain Python number or text (4.0, not np.float64(4.0))."""
    return v.item() if isinstance(v, np.generic) else v


def _tuple(group) -> tuple:
    return group if isinstance(group, tuple) else (group,)


REGIME = "regime"


def worst_regime(values: Iterable) -> str | None:
    """The most loaded regime among `values` (a point's seeds): a point is only as stable as its
    worst seed. None when no value is a regime (cells from before the field existed)."""
    known = [REGIMES.index(v) for v in values if v in REGIMES]
    return REGIMES[max(known)] if known else None


def aggregate(df: pd.DataFrame, keys: Sequence[str], exp: str, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Mean, sample SD (ddof=1; 0 for one seed), and seed count per `keys` group.

    Columns: keys..., `<metric>` (mean), `<metric>_sd`, `n_seeds`, `seeds` (sorted tuple), `regime`
    (worst_regime over the seeds). Groups keep the order of first appearance; callers sort.
    """
    keys = list(keys)
    require(df, exp, keys + list(metrics))
    check_poolable(df, keys, exp)
    rows = []
    for group, g in df.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, _tuple(group)))
        for m in metrics:
            vals = g[m].to_numpy(dtype=float)
            row[m] = float(np.mean(vals))
            row[f"{m}_sd"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        row["n_seeds"] = len(g)
        row["seeds"] = tuple(sorted(int(s) for s in g[SEED])) if SEED in g else ()
        row[REGIME] = worst_regime(g[REGIME]) if REGIME in g else None
        rows.append(row)
    return pd.DataFrame(rows)
