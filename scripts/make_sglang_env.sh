#!/usr/bin/env bash
# Make the CPU SGLang environment used by the `sglang`-marked tests and tests/benchmarks/bench_sglang.py.
#
#   scripts/make_sglang_env.sh [VENV_DIR]        (default: .venv-sglang, relative to the repo root)
#   FORCE=1 scripts/make_sglang_env.sh           (delete and rebuild the venv)
#
# A separate venv, never the default install: CPU torch 2.13.0 (the wheel on local disk),
# `sglang==0.5.23` installed with --no-deps (its declared deps are CUDA torch 2.14.1, flashinfer
# and friends: several GB, GPU only), the small pure-Python packages the import chains of
# `sglang.srt.mem_cache.radix_cache` and `sglang.srt.managers.schedule_policy` (the scheduler
# parity test) need, and our tests' light deps (numpy, pandas, pyarrow,
# hydra-core, omegaconf, pytest, hypothesis, pytest-timeout). Every version is pinned in
# scripts/sglang_env/requirements.lock and installed with --no-deps: no resolver run, the same
# closure every time. The project itself is not installed: run from the repo root with
# PYTHONPATH=. (pytest's `pythonpath = ["."]` does that for tests).
# The two import obstacles left (triton, torchvision ops) are handled at import time by
# repro/backends/sglang/cpu_shims.py, which only tests and benchmarks use.
#
# Idempotent: an existing venv whose stamp matches the lock file is only smoke-tested (seconds).
# Measured here (2 cores shared, load ~5): from scratch with an empty pip cache 7 min 22 s (PIP_NO_CACHE_DIR=1;
# ~600 MB downloaded), 3 min 43 s with a warm pip cache; 1.8 GB on disk; re-run on a good venv 23 s (the smoke test).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${1:-${VENV_DIR:-.venv-sglang}}"
LOCK="scripts/sglang_env/requirements.lock"
SERVER_LOCK="scripts/sglang_env/server.lock"  # the HTTP server's extra imports (make sglang-server-env)
STAMP="$VENV/.repro-sglang-env"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

T0=$SECONDS
step() { echo "[make_sglang_env] $* (t=$((SECONDS - T0))s)"; }
fail() { echo "[make_sglang_env] FAILED: $*" >&2; exit 1; }
trap 'echo "[make_sglang_env] FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

[ -f "$LOCK" ] || fail "missing $LOCK"
[ -f "$SERVER_LOCK" ] || fail "missing $SERVER_LOCK"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' \
  || fail "$PYTHON is not Python 3.11 (the lock pins cp311 wheels); set PYTHON=/path/to/python3.11"

WANT="$(cat "$LOCK" "$SERVER_LOCK" | sha256sum | cut -d' ' -f1)"

smoke_test() {
  # The exact thing the tests need: the shimmed import, a simulated RadixCache, one insert/match/evict.
  PYTHONPATH="$REPO_ROOT" "$VENV/bin/python" -W ignore - <<'EOF' || return 1
from repro.backends.sglang import cpu_shims
cpu_shims.install()
from array import array
import sglang, torch
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams, EvictParams

class Allocator:
    device = torch.device("cpu")
    def free_segment(self, value, start_pos=0):
        pass

cache = RadixCache.create_simulated(mock_allocator=Allocator())
cache.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3]))))
assert cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 9])))).device_prefix_len == 2
assert cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted == 3
import sglang.srt.managers.schedule_policy  # the scheduler parity test's import chain
from importlib import metadata
try:
    metadata.distribution("triton")
    raise SystemExit("triton must not be installed (the CPU shims stub it; xgrammar with deps pulls it)")
except metadata.PackageNotFoundError:
    pass
EOF
  # the real HTTP server's import chain, as repro.backends.sglang.server loads it on a CPU (hardware=cpu)
  PYTHONPATH="$REPO_ROOT" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -W ignore - <<'EOF'
from repro.backends.sglang import cpu_shims
cpu_shims.install(sgl_kernel=True)
import sglang, torch
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.llama
print(f"[make_sglang_env] ok: sglang {sglang.__version__}, torch {torch.__version__}, HTTP server imports")
EOF
}

if [ "${FORCE:-0}" = "1" ] && [ -d "$VENV" ]; then
  step "FORCE=1: removing $VENV"
  rm -rf "$VENV"
fi

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  step "$VENV is up to date with $LOCK; smoke test"
  smoke_test || fail "existing $VENV does not work; rebuild with FORCE=1 $0 $VENV"
  step "done"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating venv $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/pip" install --no-deps --disable-pip-version-check --progress-bar off -q)

# Our own constraint on top of the machine's pip config: nothing may replace the CPU torch.
CONSTRAINT="$(mktemp)"
trap 'rm -f "$CONSTRAINT"' EXIT
echo "torch==2.13.0" > "$CONSTRAINT"

step "installing torch==2.13.0 (CPU build, local wheel)"
"${PIP[@]}" -c "$CONSTRAINT" "torch==2.13.0" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
step "installing the pinned closure of $LOCK (--no-deps: sglang, torchvision and ~95 small packages)"
"${PIP[@]}" -c "$CONSTRAINT" -r "$LOCK" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
step "installing the HTTP server's extras, $SERVER_LOCK (--no-deps: no triton)"
"${PIP[@]}" -c "$CONSTRAINT" -r "$SERVER_LOCK" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
# pip exits non-zero on a real failure, but the grep above hides its status: check what it produced.
"$VENV/bin/python" - "$LOCK" "$SERVER_LOCK" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
missing = []
for line in (ln for path in sys.argv[1:] for ln in open(path)):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        missing.append(f"{name} (not installed)")
        continue
    if have.split("+")[0] != want:
        missing.append(f"{name} {have} != {want}")
if missing:
    sys.exit("[make_sglang_env] lock not satisfied: " + ", ".join(missing))
EOF

"$VENV/bin/python" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") and not torch.cuda.is_available() else f"torch {v} is not the CPU 2.13.0 build")'

step "smoke test (shimmed import of sglang.srt.mem_cache.radix_cache)"
smoke_test || fail "the new venv cannot import SGLang's radix cache"
echo "$WANT" > "$STAMP"
step "done: $VENV ($(du -sh "$VENV" | cut -f1)); run the sglang tests with $VENV/bin/python -m pytest -m sglang tests/sglang"
