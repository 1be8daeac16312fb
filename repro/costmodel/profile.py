"""The measured step-time profile the cost model is fitted on (`data/h200_profile.json`).

Per model: per-layer prefill times by (new, cached) tokens, decode times by (batch, context),
LM-head times by rows; `repeat_runs` is a second run of the same script (held out by
`repro.costmodel.calibrate`), `ceilings` the card's measured GEMM/copy figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_PROFILE = Path(__file__).resolve().parent / "data" / "h200_profile.json"


@dataclass(frozen=True)
class PrefillPoint:
    new_tokens: int
    cached_tokens: int
    per_layer_s: float

    @property
    def size(self) -> int:
        return self.new_tokens

    @property
    def attn_work(self) -> float:
        return self.new_tokens * (self.cached_tokens + self.new_tokens / 2.0)

    @property
    def has_cached_prefix(self) -> bool:
        return self.cached_tokens > 0


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context: int  # per request (the profile's "context")
    per_layer_s: float

    @property
    def size(self) -> int:
        return self.batch

    @property
    def context_tokens(self) -> int:
        return self.batch * self.context


@dataclass(frozen=True)
class HeadPoint:
    rows: int
    seconds: float


@dataclass(frozen=True)
class ProfileModel:
    name: str
    layers_total: int
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    head: tuple[HeadPoint, ...]


@dataclass(frozen=True)
class Profile:
    path: Path
    info: dict
    ceilings: dict
    models: dict[str, ProfileModel]
    repeats: dict[str, ProfileModel]


def _profile_model(entry: dict) -> ProfileModel:
    return ProfileModel(
        name=entry["model"],
        layers_total=int(entry["layers_total"]),
        prefill=tuple(
            PrefillPoint(int(r["new_tokens"]), int(r["cached_tokens"]), float(r["per_layer_s"]))
            for r in entry["prefill"]
        ),
        decode=tuple(DecodePoint(int(r["batch"]), int(r["context"]), float(r["per_layer_s"])) for r in entry["decode"]),
        head=tuple(HeadPoint(int(r["rows"]), float(r["s"])) for r in entry.get("head") or ()),
    )


def load_profile(path: str | Path = DEFAULT_PROFILE) -> Profile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"calibrate: profile not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"calibrate: profile {path} is not valid JSON: {exc}") from None
    for key in ("info", "ceilings", "models"):
        if key not in raw:
            raise SystemExit(f"calibrate: profile {path} has no '{key}' section")
    models = {e["model"]: _profile_model(e) for e in raw["models"]}
    repeats = {e["model"]: _profile_model(e) for e in raw.get("repeat_runs") or ()}
    return Profile(path, raw["info"], raw["ceilings"], models, repeats)


def run_to_run_spread(profile: Profile) -> dict[str, dict[str, float]]:
    """MRE between the repeat run and the first run on the same points: the measurement noise floor."""
    out = {}
    for name, rp in profile.repeats.items():
        pm = profile.models.get(name)
        if pm is None:
            continue
        first_p = {(p.new_tokens, p.cached_tokens): p.per_layer_s for p in pm.prefill}
        first_d = {(p.batch, p.context): p.per_layer_s for p in pm.decode}
        first_h = {h.rows: h.seconds for h in pm.head}
        out[name] = {
            "prefill": float(
                np.mean([abs(p.per_layer_s / first_p[(p.new_tokens, p.cached_tokens)] - 1) for p in rp.prefill])
            ),
            "decode": float(np.mean([abs(p.per_layer_s / first_d[(p.batch, p.context)] - 1) for p in rp.decode])),
            "head": float(np.mean([abs(h.seconds / first_h[h.rows] - 1) for h in rp.head]))
            if rp.head
            else float("nan"),
        }
    return out
