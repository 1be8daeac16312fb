"""python -m repro.results status|diff|prune|verify — what the results folders hold, and can it be trusted.

  status [--results-dir results] [EXP ...]
      fresh / stale / unfinished cells per experiment (stale: made by other code, data or library
      versions than this checkout; the first reasons are shown). Exit 1 if any cell is stale,
      damaged or unfinished (a folder without summary.json: failed, interrupted or emptied).
  diff A [B]
      cells (same experiment and signature) whose metrics differ between results folders A and B
      (B: the repository's results/), as `metric: old -> new`. Cells whose signature changed (a new
      config key or default) are paired by the settings that vary within their experiment (policy,
      rate, seed, ...) where that pairing is one to one; the rest are counted as found in one
      folder only. Cells whose requests.sha256 differs are listed too (`requests.parquet: a -> b`).
      Exit 1 if any metric or record differs.
  prune [--results-dir results] [--yes] [EXP ...]
      list the folders that hold no finished cell (unfinished: e.g. only the git-ignored
      requests.parquet and wandb/ after `git clean`; failed: error.txt), finished cells that no
      current grid produces (conf/exp/<exp>.yaml; not inverse_search, whose trials draw its cells)
      and experiment folders left empty; --yes deletes them. A cell a live process is computing
      (its lock) is left alone.
  verify [--results-dir results] [--cells N | --all] [--seed S] [EXP ...]
      rerun N random finished cells of every experiment (default 1) from scratch in a temporary
      folder and require byte-identical summary.json, the same requests.sha256 (the hash of
      requests.parquet committed beside it) and the same fingerprint. Exit 1 on any difference.

This is an entry point, like repro.run: it may use the harness (status/verify compute the
checkout's fingerprints with repro.harness.freshness); the library modules of repro.results never do.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import tempfile
from pathlib import Path

from repro.confutil import flatten
from repro.results.store import CellStore

REPO = Path(__file__).resolve().parents[2]
_SIGNATURE = re.compile(r"[0-9a-f]{6,64}")  # a cell folder's name (repro.results.signature); not _hydra/


def _experiments(root: Path, names: list[str]) -> list[str]:
    if names:
        return names
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []


def cell_report(root: Path, exps: list[str]) -> dict[str, list[dict]]:
    """Every finished cell's state: `damaged` (its files do not match its checksum manifest:
    never read, rerun), else freshness's fresh / stale (a cell without a manifest is stale)."""
    from repro.harness.freshness import folder_report
    from repro.results.store import CellStore

    report = folder_report(root, exps)
    for exp, rows in report.items():
        for r in rows:
            integrity, why = CellStore(root, exp, r["sig"]).integrity()
            if integrity == "damaged":
                r["state"], r["why"] = "damaged", why
            elif integrity == "unsealed" and r["state"] == "fresh":
                r["state"], r["why"] = "stale", why
    return report


def cmd_status(a) -> int:
    from repro.results.store import CellStore

    root = Path(a.results_dir)
    report = cell_report(root, _experiments(root, a.exps))
    bad = False
    total_unfinished = 0
    for exp, rows in report.items():
        n_unfinished = sum(  # cell folders (named by a signature) without summary.json
            1
            for d in (root / exp).iterdir()
            if d.is_dir() and _SIGNATURE.fullmatch(d.name) and not (d / CellStore.SUMMARY).is_file()
        )
        n = {s: sum(r["state"] == s for r in rows) for s in ("fresh", "stale", "damaged")}
        bad |= bool(n["stale"] or n["damaged"] or n_unfinished)
        print(
            f"{exp:24s} {n['fresh']:4d} fresh  {n['stale']:4d} stale  {n['damaged']:4d} damaged  "
            f"{n_unfinished:4d} unfinished"
        )
        for r in rows:  # every damaged cell by name: it is rerun, never plotted
            if r["state"] == "damaged":
                print(f"    DAMAGED {root / exp / r['sig']}: {'; '.join(r['why'])}")
        reasons: dict[str, list[str]] = {}
        for r in rows:
            if r["state"] == "stale":
                reasons.setdefault("; ".join(r["why"]), []).append(r["sig"])
        for why, sigs in list(reasons.items())[: a.reasons]:
            print(f"    {len(sigs)} cell(s), e.g. {sigs[0]}: {why}")
        total_unfinished += n_unfinished
    if total_unfinished:
        print(
            f"{total_unfinished} folder(s) hold no finished cell (unfinished or failed: e.g. what `git clean` "
            f"leaves of cells whose committed files it removed): `python -m repro.results prune` lists them, "
            f"--yes deletes them"
        )
    return 1 if bad else 0


def cmd_prune(a) -> int:
    """List (or with --yes delete) the folders that hold no finished cell, and cells of no current grid."""
    from repro.harness.grids import grid_signatures
    from repro.results import prune

    root = Path(a.results_dir)
    exps = _experiments(root, a.exps)
    grids = grid_signatures([e for e in exps if e not in prune.NOT_GRIDS])
    for exp, g in grids.items():
        if isinstance(g, str):
            print(f"{exp}: its grid does not compose ({g.splitlines()[0]}): its finished cells are kept")
    found = prune.scan(root, exps, {e: g for e, g in grids.items() if not isinstance(g, str)})
    for p in found:
        print(f"{p.kind:24s} {p.path}  ({p.why})")
    counts = {k: sum(p.kind == k for p in found) for k in prune.KINDS}
    print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" under {root}")
    if not found:
        return 0
    if not a.yes:
        print("dry run: nothing deleted (--yes deletes them)")
        return 0
    print(f"deleted {prune.remove(found)} folder(s)")
    return 0


def _metrics(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "provenance" and not isinstance(v, (dict, list))}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _flat(d: dict) -> dict:
    """Dotted keys -> canonical JSON of the value; empty mappings leave no key."""
    return {k: json.dumps(v, sort_keys=True) for k, v in flatten(d).items() if v != {}}


def _settings(cells: dict[str, Path]) -> dict[str, dict]:
    """Each cell's flattened config.yaml (empty when it has none)."""
    import yaml

    out = {}
    for sig, summary in cells.items():
        cfg = summary.parent / CellStore.CONFIG
        out[sig] = _flat(yaml.safe_load(cfg.read_text()) or {}) if cfg.is_file() else {}
    return out


def _pair_by_settings(sa: dict[str, Path], sb: dict[str, Path]) -> list[tuple[str, str, str]]:
    """Cells whose signature changed (a new config key, a new default) paired by what tells the
    cells of one experiment apart: the keys present in both folders whose values vary within the
    experiment (policy, rate, seed, ...). Pairs only where that key is unique on both sides."""
    ca, cb = _settings(sa), _settings(sb)
    common = set.intersection(*(set(c) for c in (*ca.values(), *cb.values()))) if ca and cb else set()
    # varying WITHIN a folder: a key constant on each side but different between them (results_dir,
    # n_jobs, a changed default) tells no cells apart
    varying = sorted(k for k in common if len({c[k] for c in ca.values()}) > 1 or len({c[k] for c in cb.values()}) > 1)

    def index(cfgs: dict[str, dict]) -> dict[tuple, list[str]]:
        idx: dict[tuple, list[str]] = {}
        for sig, c in cfgs.items():
            idx.setdefault(tuple(c[k] for k in varying), []).append(sig)
        return idx

    ia, ib = index(ca), index(cb)
    pairs = []
    for key, sigs in ia.items():
        if len(sigs) == 1 and len(ib.get(key, [])) == 1:
            label = " ".join(
                f"{k}={json.loads(v)}"
                for k, v in zip(varying, key)
                if len({c[k] for c in ca.values()}) > 1 or len({c[k] for c in cb.values()}) > 1
            )
            pairs.append((sigs[0], ib[key][0], label))
    return pairs


def _records_sha(cell: Path) -> str | None:
    return CellStore.at(cell).requests_sha256()


def diff_folders(a: Path, b: Path, exps: list[str]) -> tuple[list[str], dict[str, int]]:
    lines: list[str] = []
    counts = {"compared": 0, "differ": 0, "only_a": 0, "only_b": 0, "by_settings": 0}
    for exp in sorted(set(_experiments(a, exps)) | set(_experiments(b, exps))):
        sa = {p.parent.name: p for p in (a / exp).glob("*/summary.json")}
        sb = {p.parent.name: p for p in (b / exp).glob("*/summary.json")}
        pairs = [(sig, sig, "") for sig in sorted(set(sa) & set(sb))]
        changed_sig = _pair_by_settings({s: sa[s] for s in set(sa) - set(sb)}, {s: sb[s] for s in set(sb) - set(sa)})
        counts["by_settings"] += len(changed_sig)
        pairs += sorted(changed_sig, key=lambda p: p[2])
        counts["only_a"] += len(set(sa) - set(sb)) - len(changed_sig)
        counts["only_b"] += len(set(sb) - set(sa)) - len(changed_sig)
        for sig_a, sig_b, label in pairs:
            counts["compared"] += 1
            where = sig_a if sig_a == sig_b else f"{sig_a}->{sig_b} [{label}]"
            try:
                ma, mb = _metrics(json.loads(sa[sig_a].read_text())), _metrics(json.loads(sb[sig_b].read_text()))
            except (OSError, ValueError) as exc:  # a truncated summary: listed, the others still compared
                counts["differ"] += 1
                lines.append(f"{exp}/{where}: unreadable summary.json ({type(exc).__name__}: {exc})")
                continue
            changed = [k for k in sorted(set(ma) | set(mb)) if not _same(ma.get(k), mb.get(k))]
            ra, rb = _records_sha(sa[sig_a].parent), _records_sha(sb[sig_b].parent)
            if ra and rb and ra != rb:  # the per-request records moved (a cell without them is not compared)
                changed.append("requests.parquet")
                ma["requests.parquet"], mb["requests.parquet"] = ra[:12], rb[:12]
            if changed:
                counts["differ"] += 1
                shown = ", ".join(f"{k}: {ma.get(k)!r} -> {mb.get(k)!r}" for k in changed[:6])
                more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
                lines.append(f"{exp}/{where}: {shown}{more}")
    return lines, counts


def cmd_diff(a) -> int:
    left, right = Path(a.a), Path(a.b) if a.b else REPO / "results"
    lines, c = diff_folders(left, right, a.exps or [])
    for line in lines:
        print(line)
    print(
        f"{c['compared']} cell(s) in both ({left} -> {right}; {c['by_settings']} of them paired by their "
        f"swept settings, the signature having changed): {c['differ']} differ; "
        f"{c['only_a']} only in {left}, {c['only_b']} only in {right}"
    )
    return 1 if c["differ"] else 0


def _verify_cell(root: Path, exp: str, d: Path, tmp: Path) -> list[str]:
    """What differs between cell folder `d` and a rerun of it from scratch in `tmp` ([]: nothing)."""
    from repro.harness.cell import CellSpec, run_cell_spec
    from repro.harness.compose import cell_signature
    from repro.results.fingerprint import read_fingerprint
    from repro.results.store import CellStore

    store = CellStore(root, exp, d.name)
    problems = []
    integrity, why = store.integrity()  # a local requests.parquet included
    if integrity == "damaged":
        problems.append("damaged: " + "; ".join(why))
    cfg = store.read_config()
    cfg["tracking"] = {**(cfg.get("tracking") or {}), "mode": "disabled"}  # not in the signature
    sig = cell_signature(cfg)
    if sig != d.name:
        problems.append(f"config.yaml signs as {sig}, not {d.name}")
    out = run_cell_spec(CellSpec(0, d.name, cfg, d.name, str(tmp), exp))
    new = CellStore(tmp, exp, d.name)
    if out.status != "ran":
        return problems + [f"rerun {out.status}: {out.error}"]
    if new.summary_path.read_bytes() != store.summary_path.read_bytes():
        lines, _ = diff_folders(root, tmp, [exp])
        problems.append("summary.json differs: " + ("; ".join(lines) or "(provenance only)"))
    old_sha, new_sha = store.requests_sha256(), new.requests_sha256()
    if old_sha != new_sha:
        problems.append(f"requests.parquet sha256 {old_sha or 'none'} -> {new_sha or 'none'}")
    if (read_fingerprint(d) or {}).get("fingerprint") != (read_fingerprint(new.dir) or {}).get("fingerprint"):
        problems.append("fingerprint differs (stale cell)")
    return problems


def cmd_verify(a) -> int:
    root = Path(a.results_dir)
    seed = a.seed if a.seed is not None else random.randrange(10**9)
    if not a.all:
        print(f"verify: {a.cells} random cell(s) per experiment (--seed {seed} draws them again)", flush=True)
    rng = random.Random(seed)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="repro-verify-") as tmp:
        for exp in _experiments(root, a.exps):
            cells = sorted(p.parent for p in (root / exp).glob("*/summary.json"))
            if not cells:
                continue
            picked = cells if a.all else rng.sample(cells, min(a.cells, len(cells)))
            for d in picked:
                try:  # a folder of its own: a twin rerun before (same signature, other experiment) is not copied
                    problems = _verify_cell(root, exp, d, Path(tmp) / f"{exp}-{d.name}")
                except Exception as exc:  # a damaged cell is listed; the others are still checked
                    problems = [f"{type(exc).__name__}: {exc}"]
                bad += bool(problems)
                print(
                    f"{exp}/{d.name}: " + ("identical" if not problems else "DIFFERENT: " + " | ".join(problems)),
                    flush=True,
                )
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.results", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prune", help="list (--yes: delete) unfinished and failed cells and cells of no grid")
    pr.add_argument("--results-dir", default=str(REPO / "results"))
    pr.add_argument("--yes", action="store_true", help="delete what is listed (default: dry run)")
    pr.add_argument("exps", nargs="*")
    s = sub.add_parser("status", help="fresh / stale / unfinished cells per experiment")
    s.add_argument("--results-dir", default=str(REPO / "results"))
    s.add_argument("--reasons", type=int, default=3, help="distinct staleness reasons shown per experiment")
    s.add_argument("exps", nargs="*")
    d = sub.add_parser("diff", help="cells whose metrics differ between two results folders")
    d.add_argument("a")
    d.add_argument("b", nargs="?", help="default: the repository's results/")
    d.add_argument("--exp", dest="exps", action="append")
    v = sub.add_parser("verify", help="rerun random finished cells from scratch and compare byte for byte")
    v.add_argument("--results-dir", default=str(REPO / "results"))
    v.add_argument("--cells", type=int, default=1, help="cells per experiment")
    v.add_argument("--all", action="store_true", help="every finished cell")
    v.add_argument("--seed", type=int, default=None, help="which cells are drawn (default: random)")
    v.add_argument("exps", nargs="*")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from repro.harness.freshness import use_project_cache

    use_project_cache()
    return {"status": cmd_status, "diff": cmd_diff, "verify": cmd_verify, "prune": cmd_prune}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
