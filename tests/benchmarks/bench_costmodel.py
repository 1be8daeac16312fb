"""Speed of the step-cost model (called on every simulated step and by LBGR per request x worker).

    PYTHONPATH=. python tests/benchmarks/bench_costmodel.py

Prints microseconds per call and, measured side by side in the same run, the ratio to an empty
Python function call with the same arguments (the floor of any Python implementation) and to the
straightforward reference implementation in tests/costmodel/costmodel_reference.py.
Target: a few microseconds per call.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from repro.costmodel import StepCostModel  # noqa: E402
from tests.costmodel.costmodel_reference import reference_step_time_s  # noqa: E402
from tests.costmodel.costmodel_support import load_conf  # noqa: E402

CASES = {
    "prefill 2048 on 2048 cached": (2048, 2048 * (2048 + 1024.0), 0, 0),
    "decode 32 x 2k": (0, 0, 32, 32 * 2048),
    "mixed prefill + decode": (512, 512 * (1024 + 256.0), 64, 64 * 1500),
}


def empty(prefill_tokens, prefill_attn_work, decode_batch, decode_context_tokens):
    return 0.0


def best_of(fn, args, number=20000, repeat=5) -> float:
    """Seconds per call (best of `repeat` runs of `number` calls)."""
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)) / number


def main() -> None:
    hw = load_conf("hardware", "l40")
    print(f"{'model':<14}{'case':<30}{'us/call':>9}{'x empty call':>14}{'reference us':>14}{'ref / fast':>12}")
    for model in ("llama31_8b", "mixtral_8x7b"):
        cfg = load_conf("model", model)
        cm = StepCostModel.from_config(cfg, hw)
        for name, args in CASES.items():
            fast = best_of(cm.step_time_s, args)
            floor = best_of(empty, args)
            ref = best_of(lambda *a: reference_step_time_s(cfg, hw, cfg["cost_model"], *a), args, number=2000)
            print(f"{model:<14}{name:<30}{fast * 1e6:>9.2f}{fast / floor:>14.1f}{ref * 1e6:>14.2f}{ref / fast:>12.1f}")
        for name, fn, args in (
            ("prefill_time_s(128, 2048)", cm.prefill_time_s, (128, 2048)),
            ("decode_time_s(32, 65536)", cm.decode_time_s, (32, 65536)),
        ):
            t = best_of(fn, args)
            print(f"{model:<14}{name:<30}{t * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
