#!/usr/bin/env bash
# Make .venv-sglang046: SGLang 0.4.6 for the 0.4.6 scheduler parity test (tests/sglang/test_sched_parity046.py).
#
#   scripts/make_sglang046_env.sh [DIR]        (default: .venv-sglang046, relative to the repo root)
#   FORCE=1 scripts/make_sglang046_env.sh      (delete and rebuild it)
#
# Not a second venv: one pinned wheel (scripts/sglang_env/sglang046.lock, 1.2 MB, --no-deps,
# --require-hashes) in DIR/site, run by .venv-sglang's interpreter with DIR/site first on sys.path
# (tests/sglang/sched046_driver.py, in a process of its own: one sglang per process). 0.4.6's import
# chain of schedule_policy loads with .venv-sglang's torch 2.13.0 CPU and packages; what it needs
# beyond them (vLLM, its quantization layers, torch.compile, triton) is stubbed by the driver.
# So a second torch and closure (~1.8 GB) are not needed. Needs .venv-sglang (make sglang-env).
# Idempotent: an existing DIR whose stamp matches the lock is only smoke-tested.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
DIR="${1:-.venv-sglang046}"
LOCK="scripts/sglang_env/sglang046.lock"
BASE=".venv-sglang"
STAMP="$DIR/.repro-sglang046-env"
T0=$SECONDS
step() { echo "[make_sglang046_env] $* (t=$((SECONDS - T0))s)"; }
fail() { echo "[make_sglang046_env] FAILED: $*" >&2; exit 1; }

[ -f "$LOCK" ] || fail "missing $LOCK"
[ -x "$BASE/bin/python" ] || fail "$BASE is missing (make sglang-env first)"
WANT="$(sha256sum "$LOCK" | cut -d' ' -f1)"

smoke_test() {
  REPRO_SGLANG046_SITE="$DIR/site" PYTHONPATH="$REPO_ROOT" "$BASE/bin/python" -W ignore -c '
from tests.sglang import sched046_driver as E
sg = E.import_sglang046()
print(f"[make_sglang046_env] ok: sglang {sg.version} ({sg.file})")'
}

if [ "${FORCE:-0}" = "1" ] && [ -d "$DIR" ]; then
  step "FORCE=1: removing $DIR"
  rm -rf "$DIR"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  step "$DIR is up to date with $LOCK; smoke test"
  smoke_test || fail "existing $DIR does not work; rebuild with FORCE=1 $0 $DIR"
  exit 0
fi
rm -rf "$DIR/site"
mkdir -p "$DIR"
step "installing $LOCK into $DIR/site (--no-deps --require-hashes)"
"$BASE/bin/pip" install --no-deps --require-hashes --disable-pip-version-check --progress-bar off -q \
  --target "$DIR/site" -r "$LOCK"
step "smoke test (0.4.6's schedule_policy import chain)"
smoke_test || fail "sglang 0.4.6's scheduling modules do not import"
echo "$WANT" > "$STAMP"
step "done: $DIR ($(du -sh "$DIR" | cut -f1))"
