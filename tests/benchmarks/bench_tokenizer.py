"""Tokenising the whole packaged ShareGPT file: Llama-3 `encode_batch` vs one by one vs built-in.

    PYTHONPATH=. python tests/benchmarks/bench_tokenizer.py [--limit N]

Every message of every parsed conversation (129,071 messages, 113.8 M characters in the packaged
file). The batch API spreads texts over the `tokenizers` thread pool (RAYON_NUM_THREADS, all cores
by default); the ids are checked equal to one-by-one encoding. Measured side by side in one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from repro.workloads.sharegpt import packaged_path, parse_conversation  # noqa: E402
from repro.workloads.sources import read_json_array  # noqa: E402
from repro.workloads.tokenizer import BuiltinTokenizer, Llama3Tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="first N messages only")
    a = ap.parse_args()
    rows = read_json_array(packaged_path()).rows
    texts = [v for r in rows if (c := parse_conversation(r)) for _, v in c][: a.limit]
    tok, builtin = Llama3Tokenizer(), BuiltinTokenizer()
    tok.encode("warm up")
    t0 = time.perf_counter()
    batch = tok.encode_batch(texts)
    t_batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [tok.encode(t) for t in texts]
    t_single = time.perf_counter() - t0
    t0 = time.perf_counter()
    n_builtin = sum(len(builtin.encode(t)) for t in texts)
    t_builtin = time.perf_counter() - t0
    assert all((x == y).all() for x, y in zip(batch, single)), "batch and one-by-one ids differ"
    n = sum(map(len, batch))
    print(f"{len(texts)} messages, {sum(map(len, texts)) / 1e6:.1f} M chars -> {n / 1e6:.2f} M Llama-3 tokens "
          f"({n_builtin / 1e6:.2f} M built-in)")
    for name, t in (("llama3 encode_batch", t_batch), ("llama3 one by one", t_single), ("built-in", t_builtin)):
        print(f"  {name:<20} {t:7.1f} s")
    print(f"  batch speed-up {t_single / t_batch:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
