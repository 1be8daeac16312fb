#!/usr/bin/env bash
# Make the real router environment (.venv-router: sglang-router 0.3.2 and its successor smg 1.13.0,
# side by side, no shared package at different versions) for the `router_binary` tests
# (tests/router_binary: our routers against the real Rust routers, decision by decision) and for
# `backend.router_impl=sglang_router` runs.
#
#   scripts/make_router_env.sh [VENV_DIR]     (default: .venv-router, relative to the repo root)
#   FORCE=1 scripts/make_router_env.sh        (delete and rebuild)
#
# Each wheel is a Rust binary (~30-37 MB, runs on CPU) plus a Python launcher; every package is
# pinned in scripts/router_env/requirements.lock and installed with --no-deps (no resolver run).
# Idempotent: a venv whose stamp matches the lock file is only smoke-tested.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${1:-${VENV_DIR:-.venv-router}}"
LOCK="scripts/router_env/requirements.lock"
STAMP="$VENV/.repro-router-env"
PYTHON="${PYTHON:-python3}"
T0=$SECONDS
step() { echo "[make_router_env] $* (t=$((SECONDS - T0))s)"; }

smoke() {
  "$VENV/bin/python" -c "import importlib.metadata as m; v = m.version('sglang-router'); assert v == '0.3.2', v" \
    && "$VENV/bin/python" -c "import importlib.metadata as m; v = m.version('smg'); assert v == '1.13.0', v" \
    && "$VENV/bin/python" -m sglang_router.launch_router --help >/dev/null \
    && "$VENV/bin/python" -m smg.launch_router --help >/dev/null
}

WANT="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ "${FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && smoke; then
  step "$VENV is up to date"
  exit 0
fi
step "building $VENV"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$LOCK"
smoke
echo "$WANT" > "$STAMP"
step "done"
