"""The `sglang` backend for the harness: one grid cell on live (or emulated) SGLang workers.

    run_cell(cfg, progress=None) -> CellResult      # repro.backends registry entry point
    validate_cell(cfg) -> list[str]                 # checked for every cell before any runs
    identity(cfg) -> dict                           # the result-affecting config (run signature)

A cell is put together by the same code as the simulator's (repro.backends.assembly: the
seed plan — workload, router and per-worker eviction seeds —, the per-worker KV capacity, the
scheduler config, the workload with its requests checked, the provenance) — and then, instead
of simulating, runs it on a node (repro.backends.sglang.orchestrate): M SGLang servers or emulated
workers, the router service (or the real sglang-router) and the streaming client, whose
per-request records have the simulator's columns. So the same experiment on `backend=sglang`
and `backend=sim` differs only in who serves the requests.

Records are in seconds since the replay started (emulated seconds x time_scale when
emulating). Failed requests are rows with failed=True (num_failed in the summary). Wall-clock
numbers (routing time per decision, send lag, start-up times) go to timings.json.

Emulated workers vs the simulator (the check CI runs, and the slow full-cell variants):

    pytest tests/live/test_live_backend.py -k fig2            # 512 queries, CacheAware+LRU, ~15 s
    pytest -m slow tests/live/test_live_backend.py -k full    # 1024 queries, 2 policies x 2 capacities
    python -m repro.backends.sglang.backend --runs 3 exp=fig2_main workload=gsp policy=lbgr_rlt \
        backend.time_scale=5 cluster.kv_cache_tokens=40000    # prints live runs and the simulator

Hit rates agree within a few points; latencies do not. CacheAware's low-match branch picks the
least-loaded worker (sglang-router 0.3.2), so its choices follow the in-flight counts at decision
time, which wall-clock timing moves (measured: 0.569-0.606 over five emulated runs of one fig6
10-worker cell, simulator 0.575). Each request
crosses three HTTP hops whose wall time (~5 ms per router hop on a loaded 2-core machine,
tests/benchmarks/bench_live.py) counts time_scale times on the emulated clock. Emulated
latencies test the machinery; they are not results.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

from repro.backends import assembly
from repro.backends.sglang.config import backend_config_errors  # keys and defaults: config.py
from repro.confutil import get_path, is_positive, to_plain

# Keys that only say where / how things run, never what a cell measures: out of the signature.
NON_RESULT_BACKEND_KEYS = ("host", "gpus", "log_dir", "python", "placement")


def validate_cell(cfg: Mapping) -> list[str]:
    """Backend-specific configuration errors (no imports of sglang: checked on login nodes too)."""
    cfg = to_plain(cfg)
    errs: list[str] = []
    b = cfg.get("backend") or {}
    errs += backend_config_errors(b)  # unknown keys, sections, timeouts > 0
    emulate = b.get("emulate", False)
    if not isinstance(emulate, bool):
        errs.append(f"backend.emulate must be true or false, got {emulate!r}")
        emulate = False
    ts = b.get("time_scale", 1.0)
    if not is_positive(ts):
        errs.append(f"backend.time_scale must be a number > 0, got {ts!r}")
    elif not emulate and ts != 1.0:
        errs.append(
            f"backend.time_scale={ts} applies to emulated workers only (real SGLang servers run in "
            f"real time): set backend.emulate=true or time_scale=1.0"
        )
    impl = b.get("router_impl", "ours")
    router_name = get_path(cfg, "router.name")
    if impl not in ("ours", "sglang_router"):
        errs.append(f"backend.router_impl must be 'ours' or 'sglang_router', got {impl!r}")
    elif impl == "sglang_router" and get_path(cfg, "router.generation") == "le_0_1_4":
        errs += _sglang_router_014_errors(cfg)
    elif impl == "sglang_router" and router_name not in ("cache_aware", "random", "round_robin"):
        errs.append(
            f"backend.router_impl=sglang_router runs cache_aware, random or round_robin, not router "
            f"{router_name!r}: use router_impl=ours"
        )
    elif impl == "sglang_router" and router_name == "cache_aware":
        errs += _whole_interval_errors(cfg, "0.3.2", "it cannot turn trimming off")
        if get_path(cfg, "router.generation", "v0_3_2") != "v0_3_2":
            errs.append("router.generation: backend.router_impl=sglang_router runs sglang-router 0.3.2 (v0_3_2)")
    if get_path(cfg, "router.tracker") == "exact":
        errs.append(
            "router.tracker=exact reads the workers' real caches, which only the simulator can: "
            "the live backend needs tracker=approximate"
        )
    # emulated workers run our RadixCache (backend "sim" of the eviction registry), servers SGLang's
    errs += assembly.eviction_errors(cfg.get("eviction"), "sim" if emulate else "sglang")
    if b.get("placement", "auto") not in ("auto", "local"):
        errs.append(f"backend.placement must be auto or local, got {b.get('placement')!r}")
    gpus = b.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, (int, str)) for g in gpus)):
        errs.append(f"backend.gpus must be null or a list of GPU ids, got {gpus!r}")
    elif gpus is not None and not emulate:
        tp = int(get_path(cfg, "model.tensor_parallel", 1) or 1)
        need = int(get_path(cfg, "cluster.num_workers", 1) or 1) * tp
        if len(gpus) < need:
            errs.append(f"backend.gpus lists {len(gpus)} GPUs; the cell needs num_workers x tensor_parallel = {need}")
    if not emulate:
        errs += _real_server_errors(cfg)
    send_ref = get_path(b, "client.send_reference_output", "auto")
    if send_ref not in ("auto", True, False):
        errs.append(f"backend.client.send_reference_output must be auto, true or false, got {send_ref!r}")
    rs = b.get("router_service") or {}
    if isinstance(rs, Mapping):
        mr = rs.get("max_retries", 2)
        if isinstance(mr, bool) or not isinstance(mr, int) or mr < 0:
            errs.append(f"backend.router_service.max_retries must be an integer >= 0, got {mr!r}")
    emu = b.get("emulator") or {}
    if isinstance(emu, Mapping) and emulate:
        from repro.backends.sglang.emulated_worker import FAULTS

        faults = [emu.get("fault")] + list((emu.get("faults") or {}).values())
        for f in faults:
            if f is None or f in FAULTS or (isinstance(f, Mapping) and set(f) == {"exit_after_requests"}):
                continue
            errs.append(f"backend.emulator fault {f!r}: use null, one of {FAULTS} or {{exit_after_requests: N}}")
    return errs


def _whole_interval_errors(cfg: Mapping, release: str, why: str) -> list[str]:
    """The real sglang-router takes its trim interval in whole seconds >= 1."""
    interval = get_path(cfg, "router.eviction_interval_secs", 60)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or interval < 1
        or interval != int(interval)
    ):
        return [
            f"router.eviction_interval_secs={interval!r}: sglang-router {release} needs a whole number of "
            f"seconds >= 1 ({why})"
        ]
    return []


def _sglang_router_014_errors(cfg: Mapping) -> list[str]:
    """router_impl=sglang_router with router.generation le_0_1_4: the sglang-router 0.1.4 wheel."""
    errs = _whole_interval_errors(cfg, "0.1.4", "at 0 it trims without pause")
    if get_path(cfg, "router.match_on", "auto") != "none":
        errs.append(
            "router.match_on: the sglang-router 0.1.4 wheel routes every request on the empty key (it compares "
            "the route name without its leading slash): set router.match_on=none to run it, or "
            "router_impl=ours for 0.1.4's rule on the request text"
        )
    return errs


def _real_server_errors(cfg: Mapping) -> list[str]:
    """Real servers: the hardware's server block, a KV budget on CPUs, a model directory that can be had,
    an interpreter that exists (checked here, before any server starts)."""
    import os

    from repro.backends.sglang.config import hardware_server, resolve_python
    from repro.backends.sglang.tiny_model import GENERATE, ModelDirError, hf_config

    errs: list[str] = []
    try:
        hw = hardware_server(cfg.get("hardware"))
    except ValueError as exc:
        return [str(exc)]
    if not hw["uses_gpus"] and get_path(cfg, "cluster.kv_cache_tokens") is None:
        errs.append(
            f"hardware={get_path(cfg, 'hardware.name')} runs servers without GPUs: set cluster.kv_cache_tokens "
            f"(SGLang would size its KV pool from the machine's RAM)"
        )
    model = cfg.get("model") or {}
    srv = get_path(cfg, "backend.server") or {}
    if not srv.get("model_path") and model:  # no model at all: the harness's own check names it
        local = model.get("local_dir")
        if local == GENERATE:
            try:
                hf_config(model)
            except (ModelDirError, KeyError, TypeError) as exc:
                errs.append(f"model {model.get('name')!r} (local_dir: generate): {exc}")
        elif local and not os.path.isdir(os.path.expanduser(str(local))):
            errs.append(f"model.local_dir {local!r} is not a directory")
        elif not local and not model.get("hf_id"):
            errs.append(f"model {model.get('name')!r}: no backend.server.model_path, local_dir or hf_id")
    elif str(srv["model_path"]).startswith(("/", ".", "~")) and not os.path.isdir(
        os.path.expanduser(str(srv["model_path"]))
    ):
        errs.append(f"backend.server.model_path {srv['model_path']!r} is not a directory")
    python = srv.get("python")
    if python and not os.access(resolve_python(python), os.X_OK):
        errs.append(
            f"backend.server.python {python!r} ({resolve_python(python)}) is not an executable file "
            f"(make sglang-server-env builds .venv-sglang)"
        )
    return errs


def identity(cfg: Mapping) -> dict:
    """The whole config minus the backend keys that only place the run (host, GPUs, logs, python)."""
    cfg = dict(to_plain(cfg))
    b = dict(cfg.get("backend") or {})
    for k in NON_RESULT_BACKEND_KEYS:
        b.pop(k, None)
    if isinstance(b.get("server"), dict):
        b["server"] = {k: v for k, v in b["server"].items() if k != "python"}  # where SGLang lives, not what runs
    cfg["backend"] = b
    return cfg


def cell_log_dir(cfg: Mapping) -> Path:
    """backend.log_dir, else <results_dir>/<exp_name>/<signature>/logs (the harness's cell folder)."""
    from repro.results import run_signature

    explicit = get_path(cfg, "backend.log_dir")
    if explicit:
        return Path(str(explicit))
    root = cfg.get("results_dir") or "results"
    exp = cfg.get("exp_name") or "adhoc"
    return Path(str(root)) / str(exp) / run_signature(identity(cfg)) / "logs"


def _versions(emulate: bool, server_python: str | None = None) -> dict:
    """Library versions of the harness; SGLang's as the servers' interpreter has it."""
    import subprocess
    from importlib import metadata

    from repro.backends.assembly import versions

    out = versions()
    for pkg in ("aiohttp",) + (() if emulate else ("sglang", "sglang-router")):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent from the harness interpreter"
    if not emulate and server_python:
        try:
            proc = subprocess.run(
                [server_python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if proc.returncode == 0 and proc.stdout.strip():
                out["sglang"] = proc.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass  # the servers ran, so it is there; the version stays as the harness sees it
    return out


def run_cell(cfg: Any, progress: Callable[[float], None] | None = None):
    """Run one grid cell on this node; CellResult with the simulator's record columns."""
    from omegaconf import OmegaConf

    from repro.backends import assembly
    from repro.backends.base import CellResult
    from repro.backends.sglang import orchestrate
    from repro.backends.sglang.commands import server_preset_gaps
    from repro.backends.sglang.config import hardware_server
    from repro.workloads.trace import trace_rows, write_trace

    errs = validate_cell(cfg)
    if errs:
        raise ValueError("backend=sglang: " + "; ".join(errs))
    dcfg = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)
    # the workers, caches and router are built by the processes that serve the cell
    cell = assembly.assemble(dcfg, components=False)  # bad input fails before any process starts
    seeds, capacities = cell.plan.seeds, list(cell.plan.capacities)
    plain = to_plain(dcfg)
    log_dir = cell_log_dir(plain)  # the harness's cell folder: from the config as the harness signed it
    plain["cluster"]["scheduler"] = asdict(cell.plan.scheduler)  # the processes get every knob, defaults filled in
    plan = orchestrate.plan_cell(plain, capacities, seeds, log_dir)
    client_plan = getattr(cell.workload, "client", None)  # protocol=artifact: the authors' benchmark client
    result = orchestrate.run_plan(plan, cell.requests, progress, client=client_plan)
    if client_plan is None:  # a client's records are its sends, not cell.requests: no one-to-one trace
        # observe: what ran, as a trace the simulator can replay (workload=trace, router=fixed)
        write_trace(
            Path(log_dir) / "trace.jsonl",
            trace_rows(cell.requests, result.records, result.records.attrs.get("output_ids")),
        )

    b = plain["backend"]
    rs = result.router_stats or {}
    report = result.client_report
    provenance = {
        "backend": "sglang",
        "ran_on": "emulated SGLang workers (no GPU)"
        if plan.emulate
        else (
            "SGLang servers on GPUs" if hardware_server(plain.get("hardware"))["uses_gpus"] else "SGLang servers on CPU"
        ),
        "emulate": plan.emulate,
        "time_scale": plan.time_scale,
        "router_impl": plan.router_impl,
        **assembly.cell_provenance(plain, cell),
        "client": {k: report[k] for k in ("num_failed", "failures", "failure_examples")},
        "router_service": {
            k: rs.get(k)
            for k in (
                "completed",
                "failed",
                "retried",
                "failures",
                "callbacks",
                "callbacks_skipped",
                "callback_errors",
                "capacity_notes",
            )
        }
        if result.router_stats
        else None,
        "server": None if plan.emulate else {k: v for k, v in (b.get("server") or {}).items() if k != "env"},
        # the scheduler config's behaviours SGLang 0.5.23 has no flag for (the 0.4.6 preset's): run its way
        "server_preset_gaps": None if plan.emulate else server_preset_gaps(plain["cluster"]["scheduler"]),
        "client_loop": report.get("client"),  # a workload's client (protocol=artifact): what it sent
        # what each real server's radix cache evicted, by its own count (rlt_patch's log line); None: no eviction
        "server_evictions": None if plan.emulate else [w.get("eviction") for w in result.worker_stats or []],
        "versions": _versions(plan.emulate, plan.workers[0].cmd[0] if plan.workers and not plan.emulate else None),
    }
    timings = {
        "routing": rs.get("routing"),
        "completion_callback": rs.get("completion_callback"),
        "client": {"wall_s": report.get("wall_s"), "send_lag_s": report.get("send_lag_s")},
        "startup_s": result.startup_s,
        "router_port_moves": result.router_port_moves,
        "log_dir": str(log_dir),
    }
    return CellResult(records=result.records, provenance=provenance, timings=timings)


def compare_main(argv: list[str] | None = None) -> int:
    """`python -m repro.backends.sglang.backend [--runs N] OVERRIDES...`: one cell on emulated
    workers (N runs) and on the simulator, side by side (hit rate, latency and TTFT p50)."""
    import argparse
    import sys
    import tempfile

    from hydra import compose, initialize_config_dir

    import repro.backends.sim as sim_backend
    from repro.metrics.summary import summarize

    ap = argparse.ArgumentParser(description=compare_main.__doc__)
    ap.add_argument("--runs", type=int, default=1, help="live runs (LBGR's hit rate moves from run to run)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. exp=fig2_main workload=gsp policy=lbgr_rlt")
    args = ap.parse_args(argv)
    conf = Path(__file__).resolve().parents[3] / "conf"
    base = ["backend=sglang", "backend.emulate=true"]
    keys = ("hit_rate", "latency_p50_s", "ttft_p50_s", "num_failed")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        for k in range(args.runs):
            cfg = compose("config", overrides=base + args.overrides + [f"results_dir={tempfile.mkdtemp()}"])
            s = summarize(run_cell(cfg).records)
            print(f"live run {k}: " + "  ".join(f"{key} {s[key]:.4g}" for key in keys), flush=True)
        s = summarize(sim_backend.run_cell(cfg).records)
        print("simulator:  " + "  ".join(f"{key} {s[key]:.4g}" for key in keys), file=sys.stdout, flush=True)
    return 0


__all__ = ["run_cell", "validate_cell", "identity", "cell_log_dir", "compare_main"]

if __name__ == "__main__":
    raise SystemExit(compare_main())
