"""What `python -m repro.costmodel.calibrate` prints and writes: the MRE report, the anchor
step times, and the coefficient block it writes below COEF_MARKER in `conf/model/<model>.yaml`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from repro.costmodel.model import StepCostModel
from repro.costmodel.profile import Profile, run_to_run_spread
from repro.costmodel.specs import Coefficients, CostModelConfigError, HardwareSpec, kv_capacity_tokens
from repro.fileio import write_atomic

if TYPE_CHECKING:
    from repro.costmodel.calibrate import ModelReport

COEF_MARKER = "# === step-cost coefficients: written by `python -m repro.costmodel.calibrate --write` ==="
TARGET_MRE = 0.10


# ---------------------------------------------------------------------------- writing
def _fmt(value: float) -> str:
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.4e}"
    text = f"{value:.5g}"
    return text if any(ch in text for ch in ".e") else text + ".0"


_COEF_COMMENTS = {
    "eta_gemm": "weight GEMMs, compute-bound side (fraction of dense bf16 tensor peak)",
    "eta_weights": "weight reads, dense and expert (fraction of DRAM bandwidth)",
    "eta_attn": "attention FLOPs (fraction of dense bf16 tensor peak)",
    "eta_kv": "decode KV-cache reads (fraction of DRAM bandwidth)",
    "eta_expert": "MoE grouped expert GEMMs, compute-bound side",
    "eta_head": "LM head weight read (fraction of DRAM bandwidth)",
    "t_cpu_s": "host launch time per layer of an (eager) prefill, overlapped with GPU work",
    "t_cpu_prefix_s": "extra host time per layer when the prefill attends to a cached prefix",
    "t_floor_s": "fixed GPU time per layer and step (small kernels, gaps)",
    "p": "soft-max sharpness between overlapping bounds (inf = hard max)",
}


def _ordered_names(moe: bool) -> tuple[str, ...]:
    """Efficiencies first (eta_expert among them), then the floors and p."""
    dense = Coefficients.NAMES_DENSE
    return dense[:5] + (("eta_expert",) if moe else ()) + dense[5:]


def coefficient_block(report: ModelReport, profile: Profile, command: str, today: str) -> str:
    c = report.coefficients
    lines = [
        COEF_MARKER,
        f"# Produced by `{command}` on {today}",
        f"# from {_display_path(profile.path)} ({profile.info.get('device', '?')}, measured {profile.info.get('measured', '?')}).",
        "# Form and assumptions: repro/costmodel/model.py. Efficiencies are fractions of the datasheet peak and carry",
        "# over to other GPUs; floors are seconds per layer. t_cpu_prefix_s is host time of the profiled eager",
        "# PyTorch layer's cached-prefix attention path (SDPA with a lower-right causal mask instead of is_causal),",
        "# charged once per prefill step that attends to a cached prefix; like t_cpu_s it is a property of that",
        "# implementation and host, assumed the same on every GPU. Mean relative error of the per-layer times:",
    ]
    for phase in ("prefill", "decode"):
        parts = [f"fit {report.fit[phase]:.1%}"]
        if report.repeat:
            parts.append(f"repeat run {report.repeat[phase]:.1%}")
        if phase in report.loso:
            parts.append(f"leave-one-size-out {report.loso[phase].mre:.1%}")
        lines.append(f"#   {phase}: " + ", ".join(parts))
    (nl, el), (ng, eg) = report.prefill_split["launch-bound"], report.prefill_split["gpu-bound"]
    if nl:
        lines.append(
            f"#   prefill fit split: {nl} launch-bound points (host launch time >= GPU work) {el:.1%}, "
            f"{ng} GPU-bound points {eg:.1%}"
        )
    lines.append("cost_model:")
    lines.append(f"  fitted_on: {c.fitted_on}")
    for name in _ordered_names(report.spec.is_moe):
        lines.append(f"  {name}: {_fmt(getattr(c, name))}".ljust(30) + f"# {_COEF_COMMENTS[name]}")
    return "\n".join(lines) + "\n"


def write_coefficients(path: Path, block: str) -> None:
    text = path.read_text()
    head = text.split(COEF_MARKER)[0].rstrip("\n")
    if "\ncost_model:" in "\n" + head:
        raise SystemExit(f"calibrate: {path} has a hand-written 'cost_model:' above the marker; remove it first")
    write_atomic(path, head + "\n\n" + block)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------- report
def _pct(x: float | None) -> str:
    return "   -  " if x is None or x != x else f"{x:6.1%}"


def format_report(
    reports: Sequence[ModelReport], profile: Profile, hardware: HardwareSpec, compute_cap: float, floor_prior: float
) -> str:
    out = [
        f"Step-cost fit on {_display_path(profile.path)} ({profile.info.get('device', '?')}, measured {profile.info.get('measured', '?')})",
        f"efficiencies = fraction of {hardware.name} datasheet peak ({hardware.bf16_flops / 1e12:.1f} bf16 TFLOP/s, "
        f"{hardware.mem_bandwidth / 1e12:.2f} TB/s); caps: compute <= {compute_cap:.3f} (measured GEMM ceiling), "
        f"memory <= 1.0; floor prior {floor_prior}",
        "",
        "coefficients",
    ]
    names = _ordered_names(True)
    out.append(f"  {'model':<14}" + "".join(f"{n:>15}" for n in names))
    for r in reports:
        cells = []
        for n in names:
            v = getattr(r.coefficients, n)
            cells.append(f"{'-' if v is None else _fmt(v):>15}")
        out.append(f"  {r.config_name:<14}" + "".join(cells))
    out += [
        "",
        "mean relative error of per-layer times (head: full LM head time); repeat and loso are HELD OUT",
        f"  {'model':<14}{'phase':<9}{'points':>7}{'fit':>8}{'repeat':>8}{'loso':>8}   loso per left-out size",
    ]
    verdicts = []
    for r in reports:
        for phase in ("prefill", "decode", "head"):
            lo = r.loso.get(phase)
            rep = r.repeat.get(phase) if r.repeat else None
            per = "  ".join(f"{s}:{e:.0%}" for s, e in lo.per_size.items()) if lo else ""
            out.append(
                f"  {r.config_name:<14}{phase:<9}{r.counts[phase]:>7}{_pct(r.fit[phase]):>8}{_pct(rep):>8}{_pct(lo.mre if lo else None):>8}   {per}"
            )
            if phase != "head":
                held = [x for x in (rep, lo.mre if lo else None) if x is not None]
                worst = max(held + [r.fit[phase]])
                if worst > TARGET_MRE:
                    verdicts.append(f"{r.config_name} {phase}: MRE {worst:.1%} > {TARGET_MRE:.0%}")
    out.append("")
    out.append("prefill split (launch-bound: host time t_cpu [+ t_cpu_prefix] >= predicted GPU work), in-sample")
    for r in reports:
        (nl, el), (ng, eg) = r.prefill_split["launch-bound"], r.prefill_split["gpu-bound"]
        out.append(f"  {r.config_name:<14}launch-bound {nl:>2} points {_pct(el)}   gpu-bound {ng:>2} points {_pct(eg)}")
    spread = run_to_run_spread(profile)
    if spread:
        out.append("")
        out.append("measurement noise: MRE between the repeat run and the first run on the same points")
        for name, s in spread.items():
            out.append(
                f"  {name:<14}prefill {_pct(s['prefill'])}   decode {_pct(s['decode'])}   head {_pct(s['head'])}"
            )
    out.append("")
    if verdicts:
        out.append(f"target MRE <= {TARGET_MRE:.0%} (fit and held out): NOT met for")
        out += [f"  {v}" for v in verdicts]
    elif any(not r.loso for r in reports):
        out.append(
            f"target MRE <= {TARGET_MRE:.0%}: met on the points checked, but the leave-one-size-out check was skipped"
        )
    else:
        out.append(f"target MRE <= {TARGET_MRE:.0%} (fit and held out): met for every model and phase")
    return "\n".join(out)


def format_anchors(model_cfgs: dict[str, dict], hardware_cfgs: dict[str, dict]) -> str:
    """Predicted full-model times of a few anchor cases with the committed/fitted coefficients."""
    cases = (
        ("prefill 2048 new", lambda m: m.prefill_time_s(2048, 0)),
        ("prefill 128 on 2048 cached", lambda m: m.prefill_time_s(128, 2048)),
        ("decode b=1, 2k ctx", lambda m: m.decode_time_s(1, 2048)),
        ("decode b=32 x 2k ctx", lambda m: m.decode_time_s(32, 32 * 2048)),
    )
    out = [
        "predicted full-model step times, ms (anchors for sanity checks)",
        f"  {'model':<14}{'gpu':<6}" + "".join(f"{c[0]:>28}" for c in cases),
    ]
    for mname, mcfg in model_cfgs.items():
        if "cost_model" not in mcfg:
            continue
        for hname, hcfg in hardware_cfgs.items():
            model = StepCostModel.from_config(mcfg, hcfg)
            row = "".join(f"{f(model) * 1e3:>28.2f}" for _, f in cases)
            try:
                kv_capacity_tokens(mcfg, hcfg, 0.9)
            except CostModelConfigError:
                row += "   (weights do not fit this GPU at mem_fraction 0.9)"
            out.append(f"  {mname:<14}{hname:<6}" + row)
    return "\n".join(out)
