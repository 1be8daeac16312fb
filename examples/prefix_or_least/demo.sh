#!/usr/bin/env bash
# Fig. 2's GSP cells with the paper's six systems plus this example's two, the figure, the run table.
#   examples/prefix_or_least/demo.sh RESULTS_DIR        (PYTHON=... to choose the interpreter)
# Cells go to RESULTS_DIR/fig2_gsp_prefix_or_least/<signature>/, the figure to RESULTS_DIR/figures/.
# Pointed at a results folder that already holds fig2_main's finished GSP cells (the repository's
# results/ after `make figures`), the six systems' cells are copied from them, not rerun.
# The example is found through PYTHONPATH here; `pip install -e examples/prefix_or_least` works too.
set -euo pipefail
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 RESULTS_DIR" >&2
    exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
mkdir -p "$1"
RESULTS=$(cd "$1" && pwd)
export PYTHONPATH="$HERE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
EXP=fig2_gsp_prefix_or_least
cd "$ROOT"

# The six systems (conf/exp/shared/six_systems.yaml) plus PrefixOrLeast+LRU and LBGR+OldestOrRandom.
rc=0
# protocol=text: our reconstructions of the paper's systems (fig2_main defaults to the authors' protocol), seeds 0-2
"$PYTHON" -m repro.run +exp=fig2_main protocol=text 'seed=0,1,2' workload=gsp exp_name=$EXP tracking=disabled results_dir="$RESULTS" \
    'hydra.sweeper.params.policy=${systems:prefix_or_least_lru,lbgr_oldest_or_random}' \
    > "$RESULTS/$EXP.run.txt" || rc=$?
if [ $rc -ne 0 ]; then
    cat "$RESULTS/$EXP.run.txt"
    exit $rc
fi
"$PYTHON" -m repro.figures $EXP --results-dir "$RESULTS" --figures-dir "$RESULTS/figures" --tracking disabled
cat "$RESULTS/$EXP.run.txt"   # the run table; its last line counts the cells that ran, were copied, were skipped
