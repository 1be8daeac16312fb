"""Compare two results dirs cell by cell: per-request worker choices and byte identity.

    python scripts/compare_requests.py OLD_RESULTS_DIR NEW_RESULTS_DIR

For every <exp>/<signature>/requests.parquet in OLD that NEW also has: the number of requests
routed to a different worker ("flips"), and whether requests.parquet and summary.json are
byte-identical. Used to check that a speed-up changes no result (issue 20).
"""

from __future__ import annotations

import filecmp
import sys
from pathlib import Path

import pandas as pd


def main(old: str, new: str) -> int:
    cells = flips_total = identical = 0
    for p in sorted(Path(old).glob("*/*/requests.parquet")):
        q = Path(new) / p.relative_to(old)
        if not q.exists():
            print(f"{p.parent.relative_to(old)}: missing in {new}")
            continue
        a, b = pd.read_parquet(p), pd.read_parquet(q)
        flips = int((a["worker"].to_numpy() != b["worker"].to_numpy()).sum()) if len(a) == len(b) else -1
        same = filecmp.cmp(p, q, shallow=False) and filecmp.cmp(p.with_name("summary.json"), q.with_name("summary.json"), shallow=False)
        print(f"{p.parent.relative_to(old)}: {len(a)} requests, {flips} flips, byte-identical {same}")
        cells += 1
        flips_total += max(flips, 0)
        identical += same
    print(f"{cells} cells, {flips_total} flips, {identical} byte-identical")
    return 0 if cells and identical == cells else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
