"""What a cell's W&B run is called and holds, from the cell's files alone (no wandb import).

- Run id `<exp>-<sig>-<root id>`: the root id is 8 hex digits kept in `<results root>/.tracking_id`
  (created once, atomically; committed with results/), so two results folders never share a
  run while the same cell of the same root always has the same id (a resubmitted or re-uploaded
  cell continues its run). Not a hash of the path: clones of one results folder agree.
- group = experiment, job_type = backend, display name "LBGR+RLT · gsp · 12 req/s · seed 0"
  (policy · workload · rate · the other swept keys · seed), tags `workload:gsp`, `policy:...`,
  `router:`, `eviction:`, `model:`, `hardware:`, `seed:`, `backend:`, `protocol:` (text for cells
  without the key) + tracking.tags.
- Config flattened to dotted keys (`workload.request_rate`), so W&B groups and plots by them.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from pathlib import Path
from typing import Any, Mapping

from repro.confutil import flatten

ROOT_ID_FILE = ".tracking_id"
TAG_KEYS = (
    ("workload", "workload.name"),
    ("policy", "policy_name"),
    ("router", "router.name"),
    ("eviction", "eviction.name"),
    ("model", "model.name"),
    ("hardware", "hardware.name"),
    ("seed", "seed"),
    ("backend", "backend.name"),
)
# keys never worth showing in a name or config grouping
_NOISE = ("tracking", "results_dir", "n_jobs", "local", "hydra", "limited_kv_cache_tokens")
_NAMED_ELSEWHERE = {"policy", "policy_name", "seed", "workload", "workload.name", "workload.request_rate"}


def root_id(root: str | os.PathLike, *, create: bool = True) -> str:
    """The results root's id (ROOT_ID_FILE), created on first use; concurrent creators agree."""
    path = Path(root) / ROOT_ID_FILE
    try:
        text = path.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{8}", text):
            return text
        raise ValueError(f"{path} holds {text!r}, expected 8 hex digits")
    except FileNotFoundError:
        if not create:
            raise
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{ROOT_ID_FILE}-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.write_text(secrets.token_hex(4) + "\n")
    try:
        os.link(tmp, path)  # appears with its content or not at all; the first process wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return root_id(root, create=False)


def run_id(exp_name: str, signature: str, root: str) -> str:
    """W&B run id (<= 64 characters of [A-Za-z0-9_.-])."""
    exp = re.sub(r"[^A-Za-z0-9_.-]+", "_", exp_name)[:40]
    return f"{exp}-{signature}-{root}"


def flat_config(cfg: Mapping[str, Any], signature: str) -> dict[str, Any]:
    """The cell config as dotted keys (tracking/paths left out) + its signature."""
    flat = {k: v for k, v in flatten(cfg).items() if k.split(".", 1)[0] not in _NOISE}
    return {"signature": signature, **flat}


def swept_from_label(label: str) -> dict[str, str]:
    """The `key=value` overrides of a cell label ("policy=lbgr_rlt workload.request_rate=12.0")."""
    out = {}
    for tok in (label or "").split():
        key, eq, value = tok.partition("=")
        if eq and key:
            out[key.lstrip("+~")] = value
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}" if math.isfinite(v) else str(v)
    return str(v)


def _render(key: str, value: Any) -> str:
    short = key.rsplit(".", 1)[-1]
    if short == "num_workers":
        return f"{_fmt(value)} workers"
    if short == "kv_cache_tokens":
        return f"{_fmt(value)} KV tokens"
    if short == "name" or key in ("model", "hardware"):  # model.name=llama31_70b, model=llama31_70b
        return _fmt(value)
    return f"{short}={_fmt(value)}"


def display_name(cfg: Mapping[str, Any], swept: Mapping[str, Any] | None = None) -> str:
    """'LBGR+RLT · gsp · 12 req/s · seed 0' (+ the other swept keys, before the seed)."""
    flat = flatten(cfg)
    parts = []
    policy = flat.get("policy_name") or flat.get("router.name")
    if policy and (flat.get("backend.name") != "theory"):
        parts.append(str(policy))
    if flat.get("backend.name") != "theory":
        if flat.get("workload.name"):
            parts.append(str(flat["workload.name"]))
        if flat.get("workload.request_rate") is not None:
            parts.append(f"{_fmt(flat['workload.request_rate'])} req/s")
    for key, value in (swept or {}).items():
        if key in _NAMED_ELSEWHERE or key.split(".", 1)[0] in ("router", "eviction", "exp", *_NOISE):
            continue
        parts.append(_render(key, flat.get(key, value)))
    if flat.get("seed") is not None:
        parts.append(f"seed {flat['seed']}")
    return " · ".join(parts) or "(defaults)"


def tags(cfg: Mapping[str, Any], extra=()) -> list[str]:
    flat = flatten(cfg)
    out = [f"{tag}:{flat[key]}"[:64] for tag, key in TAG_KEYS if flat.get(key) not in (None, "")]
    out.append(f"protocol:{flat.get('protocol.name') or 'text'}"[:64])  # conf/protocol/; cells before it: text
    out += [str(t)[:64] for t in extra or ()]
    return list(dict.fromkeys(out))


def swept_from_siblings(configs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Dotted keys whose values differ between the cells of one experiment (old results lack
    the swept keys in their series metadata)."""
    values: dict[str, set[str]] = {}
    for cfg in configs.values():
        for k, v in flatten(cfg).items():
            if k.split(".", 1)[0] in _NOISE:
                continue
            values.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    keys = {k for k, vs in values.items() if len(vs) > 1}
    for group, kept in (("workload.", ("workload.name", "workload.request_rate")), ("model.", ("model.name",))):
        if kept[0] in keys:  # a switch of the whole group: its other keys follow from its name
            keys = {k for k in keys if not k.startswith(group) or k in kept}
            keys.discard("cluster.kv_cache_tokens")
    # a policy switch changes router.* / eviction.* / policy_name together: named by policy_name
    return {k for k in keys if not k.startswith(("router.", "eviction.", "hardware."))}


__all__ = [
    "ROOT_ID_FILE",
    "display_name",
    "flat_config",
    "root_id",
    "run_id",
    "swept_from_label",
    "swept_from_siblings",
    "tags",
]
