#!/usr/bin/env bash
# Stop the test cluster that .ci/slurm_up.sh started under $BASE (default /tmp/repro-slurm).
#
# 1. cancels every job still known to the controller and waits for them to end, so no job step
#    (slurmstepd + the job's processes) outlives the daemons;
# 2. stops the daemons by the PIDs slurm_up.sh recorded, in reverse start order: SIGTERM, wait up to
#    10 s, SIGKILL only as a last resort. A PID is signalled only if its start time still matches the
#    recorded one (a recycled PID is never hit);
# 3. kills, by PID, any slurmstepd still running for this cluster (found by its SLURM_CONF).
# Safe to call twice, after a failed bring-up, and when nothing runs. Never kills by name.
# Prints what it stopped and how long it took; exits 0 unless a process survived SIGKILL.
set -uo pipefail
BASE=${BASE:-/tmp/repro-slurm}
T0=$(date +%s.%N)
log() { echo "[slurm_down] $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%5.1f", b - a}')s $*"; }

if [ ! -d "$BASE/pids" ]; then log "nothing to stop under $BASE"; exit 0; fi
export SLURM_CONF="$BASE/slurm.conf"

# alive NAME: the recorded process still exists and is the same process (same start time)
alive() {
  local f="$BASE/pids/$1.pid" pid start now
  [ -f "$f" ] || return 1
  read -r pid start < "$f" || return 1
  local stat
  stat=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || return 1
  # same start time = same process; state Z = exited, waiting to be reaped by PID 1
  [ "$(echo "$stat" | awk '{print $20}')" = "$start" ] && [ "$(echo "$stat" | awk '{print $1}')" != Z ]
}
pid_of() { awk '{print $1}' "$BASE/pids/$1.pid"; }

# ---- 1. jobs ----------------------------------------------------------------------------------------------
if alive slurmctld && [ -f "$SLURM_CONF" ]; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    t=$(date +%s.%N)
    timeout 10 scancel $jobs 2>/dev/null || true
    for _ in $(seq 200); do   # KillWait in slurm.conf is 5 s
      [ -z "$(timeout 5 squeue -h -t R,CG,S -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
    log "jobs ended in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
  fi
fi

# ---- 2. daemons, reverse start order ----------------------------------------------------------------------------
status=0
for d in $(tac "$BASE/pids/order" 2>/dev/null); do
  f="$BASE/pids/$d.pid"
  [ -f "$f" ] || continue
  if alive "$d"; then
    pid=$(pid_of "$d"); t=$(date +%s.%N)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do alive "$d" || break; sleep 0.1; done   # slurmctld needs > 1 s
    if alive "$d"; then
      log "$d ($pid) ignored SIGTERM for 10 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null; sleep 0.2
      alive "$d" && { log "$d ($pid) survived SIGKILL"; status=1; continue; }
    fi
    log "stopped $d ($pid) in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
  fi
  rm -f "$f"
done

# ---- 3. stray job steps of this cluster (slurmstepd outlives slurmd by design) -----------------------------------
# descendants PID: PID and all its descendants, children first
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$c"; done
  echo "$1"
}
for env in /proc/[0-9]*/environ; do
  pid=${env#/proc/}; pid=${pid%/environ}
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] || continue
  { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qx "SLURM_CONF=$SLURM_CONF" || continue
  tree=$(descendants "$pid" | tr '\n' ' ')
  log "killing stray job step: slurmstepd $pid and its processes ($tree)"
  kill -KILL $tree 2>/dev/null || true
done

rm -f "$BASE/pids/order"; rmdir "$BASE/pids" 2>/dev/null || true
log "done in $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s (logs kept in $BASE/log)"
exit $status
