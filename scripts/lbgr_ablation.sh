#!/usr/bin/env bash
# LBGR design study (REPRODUCE.md "LBGR reconstruction"): every open choice of conf/router/lbgr.yaml
# switched back one at a time, on the TUNING cells (seeds 100-102; never the paper's figure cells),
# printed as geometric-mean ratios to Cache-Aware+LRU: 15 policies x 19 cells x 3 seeds = 855 simulated runs
# (the LooGLE cell is the slow one); results are cached per run signature in $CACHE, so a rerun only
# computes what changed (a changed default changes the signature, a changed code path does not).
# Usage: scripts/lbgr_ablation.sh [tuning|evaluation]
set -euo pipefail
SET=${1:-tuning}
L="policy=lbgr_lru"
exec ${PYTHON:-python3} -m repro.analysis.lbgr_diagnostics sweep "$SET" --cache-dir "${CACHE:-.cache/lbgr_sweep}" --n-jobs "${N_JOBS:-2}" \
  --variant "final=$L" \
  --variant "first=$L router.tracker_update=dispatch router.service_model=batch1 router.rls_regularization=0 router.min_load_weight=null" \
  --variant "tracker_update:dispatch=$L router.tracker_update=dispatch" \
  --variant "service_model:batch1=$L router.service_model=batch1" \
  --variant "rls_pooled:false=$L router.rls_pooled=false" \
  --variant "rls_regularization:0=$L router.rls_regularization=0" \
  --variant "min_load_weight:null=$L router.min_load_weight=null" \
  --variant "learner:none=$L router.learner=none" \
  --variant "tracker:exact=$L router.tracker=exact" \
  --variant "decay_factor:0.8=$L router.decay_factor=0.8" \
  --variant "decay_factor:0.95=$L router.decay_factor=0.95" \
  --variant "decay:drain=$L router.decay=drain" \
  --variant "LBGR+RLT=policy=lbgr_rlt" \
  --variant "CacheAware+RLT=policy=cache_aware_rlt"
