"""SGLang server with RLT: `python -m repro.backends.sglang.server --radix-eviction-policy rlt <sglang server args>`.

Applies `rlt_patch` and then starts SGLang 0.5.23's own HTTP server, exactly as
`python -m sglang.launch_server` does (load_plugins -> prepare_server_args -> run_server).

Why the patch reaches the scheduler: SGLang 0.5.23's engine (`sglang/srt/entrypoints/engine.py`)
sets `mp.set_start_method("spawn", force=True)` and starts each scheduler (and the data-parallel
controller) with `mp.Process`. A spawned child is a fresh interpreter that re-imports the
parent's main module under the name `__mp_main__` before it unpickles its target; this module
is that main module and calls `rlt_patch.apply()` at import time, outside the `__main__` guard,
so every scheduler process is patched before it builds its radix cache. `sglang serve` (the
console script) does not go through this module and gets no patch.

Argument handling (everything else is passed to SGLang unchanged):
* `--radix-eviction-policy rlt` (or `rlt_shipped`) adds `--radix-cache-backend repro_radix` (SGLang's plain
  RadixCache, where the RLT hooks live; 0.5.23's default chain would build UnifiedRadixCache).
  Another explicit `--radix-cache-backend`, or `--disable-radix-cache`, is an error.
* Without `--radix-eviction-policy-config`, `--random-seed S` seeds RLT (`{"seed": S}`);
  otherwise the seed is 0. Every TP rank uses the same seed, so their trees stay identical.
* `--radix-eviction-policy lru` (or any SGLang policy) adds `--radix-cache-backend repro_radix`
  too, so the paper's two systems run on the same tree class (SGLang's plain RadixCache) and
  differ only in the eviction policy; REPRODUCE.md ("SGLang's two radix caches") says why.
  `--radix-cache-backend sglang-default` (ours) leaves the choice to SGLang (UnifiedRadixCache).
* `--check-spawn` (ours, alone): start one child the way the engine starts a scheduler, print
  what the child sees (is `rlt` registered?) as JSON, exit 0 iff the patch reached it. A
  pre-flight check for GPU nodes; the CPU tests run it too.

On a CPU-only machine (hardware=cpu: SGLANG_USE_CPU_ENGINE=1, REPRO_SGLANG_CPU_SHIMS=1) the import
shims of cpu_shims.py are installed first, here at module level, so the spawned scheduler and
detokenizer processes get them too; the GPU path never sets REPRO_SGLANG_CPU_SHIMS.
"""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("REPRO_SGLANG_CPU_SHIMS") == "1":  # hardware=cpu: before anything imports sglang
    from repro.backends.sglang import cpu_shims

    cpu_shims.install(sgl_kernel=True)

from repro.backends.sglang import rlt_patch  # noqa: E402  (after the shims)

# Module level on purpose (see the docstring): runs again in every spawned SGLang process.
rlt_patch.apply()


def _flag_value(argv: list[str], flag: str) -> str | None:
    """Value of `--flag v` or `--flag=v` (the last one wins, as in argparse); None if absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv):
                raise SystemExit(f"error: {flag} needs a value")
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


SGLANG_DEFAULT_BACKEND = "sglang-default"  # ours: leave the tree to SGLang's chain (UnifiedRadixCache in 0.5.23)


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def build_sglang_argv(argv: list[str]) -> list[str]:
    """The SGLang argv for our argv (see the module docstring); raises SystemExit on a bad combination."""
    argv = list(argv)
    policy = _flag_value(argv, "--radix-eviction-policy")
    backend = _flag_value(argv, "--radix-cache-backend")
    if backend == SGLANG_DEFAULT_BACKEND:
        if policy is not None and policy.lower() in rlt_patch.PATCHED_POLICY_NAMES:
            raise SystemExit(
                f"error: --radix-cache-backend {SGLANG_DEFAULT_BACKEND} builds UnifiedRadixCache, "
                f"which RLT's hooks do not reach"
            )
        return _drop_flag(argv, "--radix-cache-backend")  # SGLang's own selection chain
    if policy is None or policy.lower() not in rlt_patch.PATCHED_POLICY_NAMES:
        if "--disable-radix-cache" not in argv and backend is None:
            argv += ["--radix-cache-backend", rlt_patch.RADIX_BACKEND_NAME]  # the same tree as RLT's
        return argv
    if "--disable-radix-cache" in argv:
        raise SystemExit("error: --radix-eviction-policy rlt needs the radix cache; drop --disable-radix-cache")
    backend = _flag_value(argv, "--radix-cache-backend")
    if backend is None:
        argv += ["--radix-cache-backend", rlt_patch.RADIX_BACKEND_NAME]
    elif backend != rlt_patch.RADIX_BACKEND_NAME:
        raise SystemExit(
            f"error: --radix-eviction-policy rlt runs on SGLang's RadixCache (--radix-cache-backend "
            f"{rlt_patch.RADIX_BACKEND_NAME}); --radix-cache-backend {backend} would ignore RLT's marks"
        )
    if _flag_value(argv, "--radix-eviction-policy-config") is None:
        seed = _flag_value(argv, "--random-seed")
        if seed is not None:
            try:
                seed_int = int(seed)
            except ValueError:
                raise SystemExit(f"error: --random-seed must be an int, got {seed!r}") from None
            argv += ["--radix-eviction-policy-config", json.dumps({"seed": seed_int})]
    return argv


def check_spawn() -> int:
    state = rlt_patch.spawn_check()
    print(json.dumps(state, indent=2, sort_keys=True))
    keys = ("rlt_in_name_table", "rlt_in_cli_choices", "radix_backend_registered", "radix_cache_hooked")
    return 0 if "error" not in state and all(state.get(k) for k in keys) else 1


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--check-spawn"]:
        sys.exit(check_spawn())
    argv = build_sglang_argv(argv)

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
