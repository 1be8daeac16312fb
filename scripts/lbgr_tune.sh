#!/usr/bin/env bash
# LBGR tuning protocol (REPRODUCE.md "LBGR reconstruction"), one command: every candidate value of
# LBGR's free parameters (one at a time around conf/router/lbgr.yaml; TUNE_PARAMS in
# repro/analysis/lbgr_tune.py) on the TUNING cells only — GSP / ShareGPT / UltraChat at their
# limited KV budgets and half of them, LooGLE at the memory formula, 4-20 req/s, seeds 100-102,
# never the figures' cells or seeds — chosen by LBGR's prediction error (predicted vs realised
# end-to-end latency of the chosen worker), with the ratio to Cache-Aware+LRU reported next to it.
# Runs are cached per run signature in $CACHE (a rerun computes only what changed).
# Usage: scripts/lbgr_tune.sh [--quick] [--param KEY=V1,V2 ...] [--design factorial] [--out DIR]
set -euo pipefail
exec ${PYTHON:-python3} -m repro.analysis.lbgr_diagnostics tune --cache-dir "${CACHE:-.cache/lbgr_tune}" \
  --n-jobs "${N_JOBS:-2}" "$@"
