"""Run signature = hash of the result-affecting part of a config.

Keys that never change a result (tracking, output paths, launcher, parallelism, the
experiment's display name) are dropped before hashing; the rest is serialised as
canonical JSON (sorted keys), so the same cell gets the same signature on a laptop,
in a joblib pool or in a Slurm array task.
"""

from __future__ import annotations

from typing import Any, Mapping

from repro.confutil import to_plain
from repro.fileio import sha256_json

# Top-level config keys that do not affect results.
NON_RESULT_KEYS: frozenset[str] = frozenset(
    {
        "tracking",
        "hydra",
        "paths",
        "launcher",
        "n_jobs",
        "results_dir",
        "exp_name",
        "local",
        "run",
        "keep_stale",
        "limited_kv_cache_tokens",  # an input table: the resolved cluster.kv_cache_tokens is hashed
        "reuse_twins",
        "ladder",  # gap_ladder's labels (rung, factor, side): its cells are other experiments' twins
    }
)


def signature_payload(cfg: Mapping[str, Any]) -> dict:
    cfg = to_plain(cfg)
    out = {k: v for k, v in cfg.items() if k not in NON_RESULT_KEYS}
    # protocol=text (the default, conf/protocol/text.yaml) sets nothing else: today's cells keep
    # their signatures; any other protocol is part of its cells' signatures
    if isinstance(out.get("protocol"), Mapping) and out["protocol"].get("name") == "text":
        del out["protocol"]
    return out


def run_signature(cfg: Mapping[str, Any], length: int = 12) -> str:
    return sha256_json(signature_payload(cfg))[:length]
