"""A step-time profile of a model measured FROM A REAL SGLang SERVER (CPU: the tiny Llama), in the format
of repro/costmodel/profile.py, for `python -m repro.costmodel.calibrate --profile ... --hardware cpu`.

    python -m repro.analysis.profile_server --python /work/main/.venv-sglang/bin/python \\
        --out repro/costmodel/data/cpu_profile.json [--model tiny_llama] [--hardware cpu] [--url URL]

Starts one server (conf/model + conf/hardware server flags, `--radix-eviction-policy lru`) or uses `--url`,
then measures, twice (the second pass is the profile's `repeat_runs`):
- prefill (new n, cached c): /flush_cache, the c-token prefix sent alone (1 output token) so it is
  cached, then prefix + n fresh tokens, streamed, 1 output token; the step time is the client's time to
  the first token (median of `--reps`). It therefore includes the per-request path outside the
  scheduler's forward (HTTP, tokenizer manager, IPC, detokenizer) -- once per request, as every point
  is a one-request step; `info.request_overhead_s` estimates that part (see below).
- decode (batch b, context L): b requests of L fresh tokens sent at once with 1 output token, then b
  other such requests with `--decode-tokens` K outputs; decode step = (median time to the K-th token -
  median time to the single token) / (K - 1); median over reps. This is the scheduler's whole step
  period (forward, sampling, scheduler loop, output) as the streaming client sees it. (Gaps between
  stream events are not used: on a loaded machine the detokenizer delivers tokens in bursts.)
- LM head and ceilings: in the server's interpreter, one thread like the servers (OMP_NUM_THREADS=1):
  a bf16 [rows, hidden] x [hidden, vocab] matmul, a bf16 square GEMM and a tensor copy (fastest of
  `reps` runs each: the ops' own cost on a shared machine).
Per-layer times = (step - LM head on the step's sampled rows) / num_layers (`info.method` says so).
`info.request_overhead_s`: the one-request prefill of `--overhead-tokens` tokens minus a decode step of
batch 1 at that context (the forward of a few tokens costs about a decode step; the rest is the
request's path), a measured estimate, not a fitted coefficient.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

PREFILL_NEW = (16, 64, 256, 512, 1024, 2048)
PREFILL_CACHED = (0, 512, 2048)
DECODE_BATCH = (1, 2, 4, 8, 16)
DECODE_CONTEXT = (128, 512)
HEAD_ROWS = (1, 2, 4, 8, 16)
TOKEN_RANGE = (1000, 120000)  # random ids of the Llama-3 vocabulary (no special tokens)

# Runs in the server's interpreter (torch there): LM-head times by rows, bf16 GEMM and copy ceilings.
_TORCH_SCRIPT = r"""
import json, sys, time, torch
torch.set_num_threads(1)
hidden, vocab, rows_list, reps = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
def best(fn, n):  # the fastest run: the op's own cost on a shared, loaded machine
    fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
w = torch.randn(vocab, hidden, dtype=torch.bfloat16)
head = {r: best(lambda x=torch.randn(r, hidden, dtype=torch.bfloat16): torch.nn.functional.linear(x, w), reps)
        for r in rows_list}
m = 1024
a = torch.randn(m, m, dtype=torch.bfloat16); b = torch.randn(m, m, dtype=torch.bfloat16)
g = best(lambda: a @ b, max(3, reps // 2))
src = torch.empty(64 * 2**20, dtype=torch.uint8); dst = torch.empty_like(src)
c = best(lambda: dst.copy_(src), reps)
print(json.dumps({"head": {str(k): v for k, v in head.items()}, "bf16_gemm_tflops": 2 * m**3 / g / 1e12,
                  "copy_tb_s": 2 * src.numel() / c / 1e12, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


class ProfileError(RuntimeError):
    pass


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


async def _stream(session: Any, url: str, ids: Sequence[int], max_new: int) -> tuple[list[tuple[float, int]], int]:
    """One streamed /generate: [(seconds since send, completion_tokens so far)] per event with tokens, cached."""
    from repro.backends.sglang import protocol

    body = protocol.generate_body(list(ids), max_new, stream=True)
    tracker = protocol.OutputTracker(where=f"{url} profile request")
    marks: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    async with session.post(f"{url}/generate", json=body) as resp:
        if resp.status != 200:
            raise ProfileError(f"{url}/generate: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in protocol.iter_sse_lines(resp.content):
            ev = protocol.parse_sse_line(line, tracker.where)
            if ev is protocol.DONE or ev is None:
                continue
            if tracker.add(ev) > 0:
                marks.append((time.perf_counter() - t0, int(tracker.completion_tokens)))
    if not tracker.finished or int(tracker.completion_tokens) != max_new:
        raise ProfileError(f"{url}: request ended with {tracker.completion_tokens} of {max_new} tokens")
    return marks, int(tracker.cached_tokens)


async def _flush(session: Any, url: str) -> None:
    async with session.post(f"{url}/flush_cache") as resp:
        if resp.status != 200:
            raise ProfileError(f"{url}/flush_cache: HTTP {resp.status}")


async def prefill_time(session: Any, url: str, rng: random.Random, new: int, cached: int) -> float:
    await _flush(session, url)
    prefix = _ids(rng, cached)
    if cached:
        await _stream(session, url, prefix, 1)
    marks, hit = await _stream(session, url, prefix + _ids(rng, new), 1)
    if hit < cached:  # the server cached less than the prefix: the point would be mislabelled
        raise ProfileError(f"{url}: prefill point (new={new}, cached={cached}) found only {hit} cached tokens")
    return marks[0][0]


def decode_step(one_token_s: Sequence[float], k_tokens_s: Sequence[float], tokens: int) -> float:
    """Seconds per decode step: (median time to the last of `tokens` tokens - median time to a single token)
    / (tokens - 1), over the requests of two same-shaped batches (same batch size and prompt length)."""
    if tokens < 2:
        raise ProfileError(f"a decode step needs at least 2 output tokens, got {tokens}")
    return (statistics.median(k_tokens_s) - statistics.median(one_token_s)) / (tokens - 1)


async def decode_time(session: Any, url: str, rng: random.Random, batch: int, context: int, tokens: int) -> float:
    times = {}
    for k in (1, tokens):
        await _flush(session, url)
        runs = await asyncio.gather(*(_stream(session, url, _ids(rng, context), k) for _ in range(batch)))
        times[k] = [marks[-1][0] for marks, _ in runs]
    return decode_step(times[1], times[tokens], tokens)


async def measure_pass(url: str, rng: random.Random, reps: int, decode_tokens: int, log=print) -> dict:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    out: dict = {"prefill": [], "decode": []}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for cached in PREFILL_CACHED:
            for new in PREFILL_NEW:
                ts = [await prefill_time(session, url, rng, new, cached) for _ in range(reps)]
                out["prefill"].append(
                    {"new_tokens": new, "cached_tokens": cached, "step_s": statistics.median(ts), "runs_s": ts}
                )
                log(
                    f"  prefill new={new:5d} cached={cached:5d}: {statistics.median(ts) * 1e3:8.2f} ms "
                    f"(runs {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})"
                )
        for context in DECODE_CONTEXT:
            for batch in DECODE_BATCH:
                ts = [await decode_time(session, url, rng, batch, context, decode_tokens) for _ in range(reps)]
                out["decode"].append(
                    {"batch": batch, "context": context, "step_s": statistics.median(ts), "runs_s": ts}
                )
                log(
                    f"  decode batch={batch:3d} context={context:5d}: {statistics.median(ts) * 1e3:8.2f} ms "
                    f"(runs {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})"
                )
    return out


def torch_measurements(python: str, hidden: int, vocab: int, reps: int = 20) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [python, "-c", _TORCH_SCRIPT, str(hidden), str(vocab), json.dumps(list(HEAD_ROWS)), str(reps)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise ProfileError(f"torch measurements in {python} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def profile_entry(name: str, layers: int, raw: dict, head_s: dict[int, float]) -> dict:
    """A profile model entry (repro/costmodel/profile.py) from one pass: per layer = (step - head) / layers."""

    def per_layer(step: float, rows: int) -> float:
        value = (step - head_s[rows]) / layers
        if value <= 0:
            raise ProfileError(f"{name}: step {step:.6f}s is not longer than its LM head ({head_s[rows]:.6f}s)")
        return value

    return {
        "model": name,
        "layers_total": layers,
        "layers_measured": layers,
        "prefill": [
            {
                "new_tokens": p["new_tokens"],
                "cached_tokens": p["cached_tokens"],
                "per_layer_s": per_layer(p["step_s"], 1),
                "step_s": p["step_s"],
            }
            for p in raw["prefill"]
        ],
        "decode": [
            {
                "batch": d["batch"],
                "context": d["context"],
                "per_layer_s": per_layer(d["step_s"], d["batch"]),
                "step_s": d["step_s"],
            }
            for d in raw["decode"]
        ],
        "head": [{"rows": r, "s": s} for r, s in sorted(head_s.items())],
        "moe": None,
    }


def request_overhead_s(raw: dict) -> float:
    """Smallest one-request prefill minus the batch-1 decode step at the shortest context (see the docstring)."""
    p = min((x for x in raw["prefill"] if x["cached_tokens"] == 0), key=lambda x: x["new_tokens"])
    d = min((x for x in raw["decode"] if x["batch"] == 1), key=lambda x: x["context"])
    return p["step_s"] - d["step_s"]


def _start_server(python: str, model_cfg: dict, hardware_cfg: dict, port: int, kv_tokens: int, log_dir: str):
    from repro.backends.sglang.planning import ProcessSpec, hardware_server, resolve_python, sglang_server_command
    from repro.backends.sglang.processes import ManagedProcess, wait_healthy
    from repro.backends.sglang.tiny_model import model_path

    path = model_path(model_cfg)
    if path is None:
        raise ProfileError(f"model {model_cfg.get('name')!r} has no local model directory to serve")
    hw = hardware_server(hardware_cfg)
    cmd = sglang_server_command(
        resolve_python(python),
        path,
        "127.0.0.1",
        port,
        "lru",
        {},
        kv_cache_tokens=kv_tokens,
        mem_fraction=None,
        random_seed=1,
        load_format=model_cfg.get("load_format"),
        extra_args=hw["extra_args"],
    )
    env = dict(hw["env"], SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="false")
    proc = ManagedProcess(
        ProcessSpec("profile-server", cmd, env, os.path.join(log_dir, "server.log"), f"http://127.0.0.1:{port}/health")
    )
    proc.start()
    try:
        wait_healthy([proc], timeout_s=900)
    except BaseException:
        proc.stop(10)
        raise
    return proc


def _load_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise SystemExit(f"profile_server: no config {path}")
    return yaml.safe_load(path.read_text())


def build_profile(
    raw_passes: list[dict],
    torch_runs: list[dict],
    model_cfg: dict,
    *,
    url: str,
    load: str,
    reps: int,
    decode_tokens: int,
) -> dict:
    arch = model_cfg["architecture"]
    layers = int(arch["num_layers"])
    name = model_cfg["profile_name"]
    entries = [
        profile_entry(name, layers, raw, {int(k): v for k, v in t["head"].items()})
        for raw, t in zip(raw_passes, torch_runs)
    ]
    first = torch_runs[0]
    best = {k: max(t[k] for t in torch_runs) for k in ("bf16_gemm_tflops", "copy_tb_s")}  # ceilings: best run
    return {
        "info": {
            "device": "CPU (real SGLang server, SGLang's CPU engine, torch_native attention)",
            "torch": first["torch"],
            "measured": _dt.date.today().isoformat(),
            "server": url,
            "load_average_at_start": load,
            "reps": reps,
            "decode_tokens": decode_tokens,
            "method": (
                "whole scheduler steps of a real SGLang 0.5.23 server seen by a streaming client, "
                "per_layer_s = (step - LM head time on the step's sampled rows) / num_layers (the server's "
                "layers are not timed one by one). Prefill: time to the first token of one request alone "
                "(1 output token, prefix cached first), so it includes the request's HTTP/tokenizer/IPC path "
                "once; decode: (median time to the K-th token of `batch` requests sent at once - the same for "
                "1 output token) / (K - 1) (the whole step period). LM head: a bf16 "
                "[rows, hidden] x [hidden, vocab] matmul in the server's torch, 1 thread, fastest of 20 runs. Server "
                "steps: medians of `reps`."
            ),
            "request_overhead_s": [request_overhead_s(r) for r in raw_passes],
        },
        "ceilings": {**best, "threads": first["threads"]},  # the best of the runs below
        "ceilings_runs": [{"bf16_gemm_tflops": t["bf16_gemm_tflops"], "copy_tb_s": t["copy_tb_s"]} for t in torch_runs],
        "models": [entries[0]],
        "repeat_runs": entries[1:],
    }


def main(argv: Sequence[str] | None = None) -> int:
    from repro.confutil import CONF_DIR

    ap = argparse.ArgumentParser(prog="python -m repro.analysis.profile_server", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the SGLang server's interpreter (.venv-sglang/bin/python)")
    ap.add_argument("--out", required=True, help="profile JSON to write")
    ap.add_argument("--model", default="tiny_llama")
    ap.add_argument("--hardware", default="cpu")
    ap.add_argument("--url", default=None, help="profile this running server instead of starting one")
    ap.add_argument("--port", type=int, default=31190)
    ap.add_argument("--kv-tokens", type=int, default=16384, help="the started server's --max-total-tokens")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.decode_tokens < 3:
        ap.error("--reps must be >= 1 and --decode-tokens >= 3")
    python = args.python
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        ap.error(f"--python {python}: not an executable file")
    model_cfg = _load_yaml(CONF_DIR / "model" / f"{args.model}.yaml")
    hardware_cfg = _load_yaml(CONF_DIR / "hardware" / f"{args.hardware}.yaml")
    if not model_cfg.get("profile_name"):
        ap.error(f"model {args.model} has no profile_name")
    need = max(PREFILL_NEW) + max(PREFILL_CACHED) + 8
    need = max(need, max(DECODE_BATCH) * (max(DECODE_CONTEXT) + args.decode_tokens))
    if args.url is None and args.kv_tokens < need:
        ap.error(f"--kv-tokens {args.kv_tokens} < {need}, what the largest point holds")
    out = Path(args.out)
    load = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else "unknown"
    arch = model_cfg["architecture"]

    print(f"torch measurements in {python} (1 thread) ...", flush=True)
    torch_runs = [torch_measurements(python, int(arch["hidden_size"]), int(arch["vocab_size"])) for _ in range(2)]
    proc = None
    url = args.url
    with tempfile.TemporaryDirectory(prefix="profile_server_") as log_dir:
        try:
            if url is None:
                print(f"starting a {args.model} server on port {args.port} (log {log_dir}/server.log) ...", flush=True)
                t = time.monotonic()
                proc = _start_server(python, model_cfg, hardware_cfg, args.port, args.kv_tokens, log_dir)
                print(f"healthy after {time.monotonic() - t:.0f} s", flush=True)
                url = f"http://127.0.0.1:{args.port}"
            rng = random.Random(args.seed)
            passes = []
            for i in range(2):
                print(f"pass {i + 1} of 2 (the second is repeat_runs)", flush=True)
                passes.append(asyncio.run(measure_pass(url.rstrip("/"), rng, args.reps, args.decode_tokens)))
        finally:
            if proc is not None:
                proc.stop(15)
    profile = build_profile(
        passes,
        torch_runs,
        model_cfg,
        url=url if args.url else "started by profile_server",
        load=load,
        reps=args.reps,
        decode_tokens=args.decode_tokens,
    )
    from repro.fileio import write_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out}; load average at the end: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
