#!/usr/bin/env bash
# The measurements the claims table's Why texts cite (repro/figures/claims_why.yaml), one command:
# realised queue wait / prefill / decode per request against LBGR's prediction parts
# (repro/analysis/lbgr_highload.py), written to results_analysis/<name>/{table.md,cells.csv}.
# Rerun after anything that moves results (simulator, cost model, routers); about a minute on 2 cores.
set -euo pipefail
run() { ${PYTHON:-python3} -m repro.analysis.lbgr_diagnostics highload "$@" > /dev/null; }
# why LBGR+RLT loses at 24-32 req/s on the regime map (GSP, 32k tokens per worker)
run --out results_analysis/lbgr_highload
# fig2's operating point (12 req/s, limited budgets): how much of the latency is queueing
run --rates 12 --seeds 0,1,2 --workloads gsp,sharegpt,ultrachat \
  --systems CacheAware+LRU,CacheAware+RLT,LBGR+RLT,RoundRobin+LRU,Random+LRU --out results_analysis/fig2_queueing
# the same with 262,144 tokens per worker: the hit rate the limited budgets cost
run --rates 12 --seeds 0,1,2 --workloads gsp,sharegpt,ultrachat --budget 262144 \
  --systems CacheAware+LRU,CacheAware+RLT --out results_analysis/fig2_large_kv
# fig14: LBGR's queue-load estimate against the realised wait per decay interval
run --rates 12 --seeds 0,1,2 --systems LBGR+RLT --vary router.decay_interval_s=0.01,0.05,0.1,0.5,1.0,5.0 \
  --out results_analysis/fig14_decay
# the regime map's 24-32 req/s with LBGR reading the workers' true caches (is tracker error the cause?)
run --rates 24,32 --systems LBGR+RLT --vary router.tracker=approximate,exact --out results_analysis/lbgr_highload_tracker
# fig6's overloaded point: 2 workers at 12 req/s
run --rates 12 --seeds 0,1,2 --override cluster.num_workers=2 --out results_analysis/fig6_two_workers
