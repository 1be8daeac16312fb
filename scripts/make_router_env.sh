#!/usr/bin/env bash
# Make the real routers' environments for the `router_binary` tests (tests/router_binary: our routers
# against the real Rust routers, decision by decision) and for `backend.router_impl=sglang_router` runs:
#   .venv-router     sglang-router 0.3.2 and its successor smg 1.13.0, side by side (no shared package
#                    at different versions)
#   .venv-router014  sglang-router 0.1.4 (sglang 0.4.6's router, the paper authors' baseline); its own
#                    venv because it ships the same `sglang_router` module as 0.3.2
#   .venv-router015  sglang-router 0.1.5: the same cache-aware code, but its wheel reads the request
#                    text (0.1.4's wheel routes every request on the empty key), as the authors' build does
#
#   scripts/make_router_env.sh [VENV_DIR [VENV014_DIR [VENV015_DIR]]]   (defaults: .venv-router .venv-router014 .venv-router015)
#   FORCE=1 scripts/make_router_env.sh                    (delete and rebuild both)
#
# Each wheel is a Rust binary (5-37 MB, runs on CPU) plus a Python launcher; every package is pinned
# in scripts/router_env/*.lock and installed with --no-deps (no resolver run). Idempotent: a venv
# whose stamp matches its lock file is only smoke-tested.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${1:-${VENV_DIR:-.venv-router}}"
VENV014="${2:-${VENV014_DIR:-.venv-router014}}"
VENV015="${3:-${VENV015_DIR:-.venv-router015}}"
PYTHON="${PYTHON:-python3}"
T0=$SECONDS
step() { echo "[make_router_env] $* (t=$((SECONDS - T0))s)"; }

version_is() {  # venv dist version
  "$1/bin/python" -c "import importlib.metadata as m, sys; v = m.version('$2'); assert v == '$3', v"
}

smoke_main() {
  version_is "$1" sglang-router 0.3.2 && version_is "$1" smg 1.13.0 \
    && "$1/bin/python" -m sglang_router.launch_router --help >/dev/null \
    && "$1/bin/python" -m smg.launch_router --help >/dev/null
}

smoke_014() {  # 0.1.4's launcher has no --prometheus-port (0.3.2's has): the right binary answers
  version_is "$1" sglang-router 0.1.4 \
    && "$1/bin/python" -m sglang_router.launch_router --help | grep -q -- "--balance-rel-threshold" \
    && ! "$1/bin/python" -m sglang_router.launch_router --help | grep -q -- "--prometheus-port"
}

smoke_015() {
  version_is "$1" sglang-router 0.1.5 \
    && "$1/bin/python" -m sglang_router.launch_router --help | grep -q -- "--pd-disaggregation"
}

build() {  # venv lock smoke-function [pip options]
  local venv="$1" lock="$2" smoke="$3"
  shift 3
  local stamp="$venv/.repro-router-env" want
  want="$(sha256sum "$lock" | cut -d' ' -f1)"
  if [ "${FORCE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$smoke" "$venv"; then
    step "$venv is up to date"
    return 0
  fi
  step "building $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$@" -r "$lock"
  "$smoke" "$venv"
  echo "$want" > "$stamp"
  step "$venv done"
}

build "$VENV" scripts/router_env/requirements.lock smoke_main
build "$VENV014" scripts/router_env/requirements-014.lock smoke_014 --require-hashes
build "$VENV015" scripts/router_env/requirements-015.lock smoke_015 --require-hashes
