#!/usr/bin/env bash
# Run one experiment's grid on Slurm, one job (array task) per cell, and wait for it.
#
#   launchers/slurm_sweep.sh EXP [hydra overrides...]
#   launchers/slurm_sweep.sh fig5_request_rate                       # simulator, hydra/launcher=slurm
#   launchers/slurm_sweep.sh fig6_workers backend=sglang             # GPUs: hydra/launcher=slurm_gpu
#   launchers/slurm_sweep.sh fig5_request_rate hydra.launcher.timeout_min=120 seed=0,1,2
#
# Run it on a login node, from anywhere; it works in the repository root. Re-running it after a failure,
# a time limit or a scancel resubmits the grid: finished cells are skipped, so only the missing ones run.
# Exit status: 0 when every cell finished, non-zero otherwise (Hydra prints which cell failed and why; the
# cell's own log is in <sweep dir>/.submitit/<jobid>_<task>/).
#
# Launcher: hydra/launcher=... if given; slurm_gpu when backend=sglang is given; else slurm.
# With slurm_gpu the grid is split by worker count (launchers/plan_gpu_arrays.py): one array per count N,
# each cell on ceil(N / node_gpus) nodes, all arrays submitted at once, each waited for in the background
# with its output in <sweep dir>/workers_<N>.log.
#
# Environment (all optional):
#   REPRO_RESULTS_DIR  where results go; default <repo>/results. Must be on a filesystem the compute
#                      nodes share with this machine (so must the sweep dir).
#   SWEEP_DIR          Hydra's sweep dir (submitit pickles + logs); default <repo>/multirun/EXP/<date_time>
#   WANDB_MODE         default offline: compute nodes often have no internet; `wandb sync` later
#   REPRO_RUN          the Hydra app; default "python -m repro.run" (tests run a fixture app this way)
#   NODE_GPUS          GPUs per node of the GPU partition (else conf/local/slurm.yaml, else sinfo)
set -euo pipefail

die() { echo "slurm_sweep: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || die "usage: launchers/slurm_sweep.sh EXP [overrides...]"
EXP=$1; shift

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
read -r -a RUN <<< "${REPRO_RUN:-$PYTHON -m repro.run}"
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this where Slurm's client commands work"
command -v sacct >/dev/null 2>&1 || die "sacct not found: submitit needs it to follow the jobs"

# Jobs inherit this environment (sbatch --export=ALL): make it independent of where the script was called.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export REPRO_RESULTS_DIR=${REPRO_RESULTS_DIR:-$REPO/results}
case "$REPRO_RESULTS_DIR" in /*) ;; *) REPRO_RESULTS_DIR="$PWD/$REPRO_RESULTS_DIR" ;; esac
export WANDB_MODE=${WANDB_MODE:-offline}
SWEEP_DIR=${SWEEP_DIR:-$REPO/multirun/$EXP/$(date +%Y-%m-%d_%H-%M-%S)}
case "$SWEEP_DIR" in /*) ;; *) SWEEP_DIR="$PWD/$SWEEP_DIR" ;; esac
cd "$REPO"

LAUNCHER=slurm
for a in "$@"; do
  case "$a" in
    hydra/launcher=*) LAUNCHER=${a#hydra/launcher=} ;;
    hydra.sweep.dir=*) die "set SWEEP_DIR instead of hydra.sweep.dir" ;;
  esac
done
if [ "$LAUNCHER" = slurm ]; then
  for a in "$@"; do [ "$a" = backend=sglang ] && LAUNCHER=slurm_gpu; done
fi
ARGS=()
for a in "$@"; do case "$a" in hydra/launcher=*) ;; *) ARGS+=("$a") ;; esac; done

echo "slurm_sweep: exp=$EXP launcher=$LAUNCHER results=$REPRO_RESULTS_DIR sweep_dir=$SWEEP_DIR"
if [ "$LAUNCHER" != slurm_gpu ]; then
  exec "${RUN[@]}" -m "exp=$EXP" "hydra/launcher=$LAUNCHER" "hydra.sweep.dir=$SWEEP_DIR" "${ARGS[@]}"
fi

# ---- GPU cells: one array per worker count -----------------------------------------------------------------
PLAN=$("$PYTHON" "$REPO/launchers/plan_gpu_arrays.py" --app "${RUN[*]}" -- "exp=$EXP" "${ARGS[@]}")
PINNED=()   # the user's arguments minus any worker-count override: each array pins its own
for a in "${ARGS[@]}"; do case "${a#+}" in cluster.num_workers=*) ;; *) PINNED+=("$a") ;; esac; done
mkdir -p "$SWEEP_DIR"
declare -A PIDS=()
# stop the waiting Hydra processes if we are interrupted (the jobs stay queued: scancel them by name if wanted)
trap 'kill "${PIDS[@]}" 2>/dev/null' INT TERM
while IFS=$'\t' read -r n nodes per_node shape; do
  [ -n "$n" ] || continue
  echo "slurm_sweep: workers=$n -> $nodes node(s) x $per_node GPU(s); log: $SWEEP_DIR/workers_$n.log"
  read -r -a SHAPE <<< "$shape"
  "${RUN[@]}" -m "exp=$EXP" hydra/launcher=slurm_gpu "hydra.sweep.dir=$SWEEP_DIR/workers_$n" "${PINNED[@]}" \
    "${SHAPE[@]}" > "$SWEEP_DIR/workers_$n.log" 2>&1 &
  PIDS[$n]=$!
done <<< "$PLAN"
status=0
for n in "${!PIDS[@]}"; do
  if wait "${PIDS[$n]}"; then
    echo "slurm_sweep: workers=$n: all cells finished"
  else
    status=1
    echo "slurm_sweep: workers=$n: FAILED, last lines of $SWEEP_DIR/workers_$n.log:" >&2
    tail -n 20 "$SWEEP_DIR/workers_$n.log" >&2
  fi
done
exit $status
