#!/usr/bin/env bash
# Bring up a throwaway Slurm cluster on this one machine (CI and local tests of the Slurm launchers).
#
#   munged -> MariaDB -> slurmdbd -> slurmctld -> one slurmd per node (NNODES "nodes", all on this host), from
#   Debian 12 packages, each started by hand in the
#   foreground mode and backgrounded here (no systemd: the images' policy-rc.d forbids service starts).
#   Everything it creates lives under $BASE: config, state, spool, logs, the munge key and socket, the
#   database, and the recorded PIDs that .ci/slurm_down.sh stops (same BASE). Nothing global is touched
#   except installing packages, so a system munged/MariaDB, if any, is left alone.
#
# Usage:   BASE=/tmp/repro-slurm bash .ci/slurm_up.sh && source /tmp/repro-slurm/env.sh   # exports SLURM_CONF
#          BASE=/tmp/repro-slurm bash .ci/slurm_down.sh
# Env:     BASE       state dir (absolute; default /tmp/repro-slurm). Wiped on start, but only if it holds
#                     the marker file this script writes (never an unrelated directory).
#          WITH_DBD   1 (default): accounting through slurmdbd + MariaDB. Needed: without it submitit cannot
#                     see a hard-killed job (SIGKILL, OOM, time limit, scancel) and the sweep waits forever.
#          NNODES     compute nodes node1..nodeN (default 2), one slurmd each, all on this host (Debian's
#                     Slurm is built with multiple-slurmd): lets a test place one cell on two nodes.
#          GPUS_PER_NODE  fake GPUs per node (default 5: a 10-worker cell fits two nodes; 0 = none): gres entries backed by /dev/null clones, so
#                     --gpus-per-node requests are scheduled and CUDA_VISIBLE_DEVICES is set; no real GPU.
#          NCPU, MEM_MB   CPUs per node (default nproc: the nodes oversubscribe the host) and memory of the
#                     whole host split over the nodes (default 90% of MemTotal; RealMemory must be set or
#                     any --mem request is rejected)
#          PORT_CTLD, PORT_DBD, PORT_DB, PORT_SLURMD  TCP ports (6817, 6819, 3306; slurmd of node i listens
#                     on PORT_SLURMD+i-1, default 6820..); all checked free first.
#          SKIP_APT   1: never call apt-get (fail if a binary is missing).
# Prints the time of each step and the total. On any failure it prints the daemon logs, stops whatever it
# started (by PID) and exits non-zero.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${BASE:-/tmp/repro-slurm}
WITH_DBD=${WITH_DBD:-1}
NCPU=${NCPU:-$(nproc)}
MEM_MB=${MEM_MB:-$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)}
PORT_CTLD=${PORT_CTLD:-6817}
PORT_SLURMD=${PORT_SLURMD:-6820}
NNODES=${NNODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-5}
PORT_DBD=${PORT_DBD:-6819}
PORT_DB=${PORT_DB:-3306}
CLUSTER=repro
MARKER=.repro-slurm-base

log() { echo "[slurm_up] $*"; }
die() { echo "[slurm_up] ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.1 s; fail with DESCRIPTION on timeout.
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${limit}s waiting for: $what"
    sleep 0.1
  done
}

# ---- 0. preflight -----------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (installs packages, runs munged as user munge)"
case "$BASE" in /?*) ;; *) die "BASE must be an absolute path, got '$BASE'" ;; esac
[ "$BASE" != / ] || die "BASE=/ refused"
if [ -e "$BASE" ] && [ ! -e "$BASE/$MARKER" ]; then
  die "$BASE exists and was not made by this script (no $MARKER): refusing to wipe it"
fi
[ "${#BASE}" -le 80 ] || die "BASE too long for a unix socket path: $BASE"

T0=$(now)
log "BASE=$BASE WITH_DBD=$WITH_DBD NNODES=$NNODES NCPU=$NCPU GPUS_PER_NODE=$GPUS_PER_NODE MEM_MB=$MEM_MB"
if [ -d "$BASE/pids" ]; then   # a previous cluster in this BASE: stop it first (no-op if it is gone)
  BASE="$BASE" bash "$HERE/slurm_down.sh"
fi

# ---- 1. packages ------------------------------------------------------------------------------------------
BINS="slurmctld slurmd slurmstepd sbatch srun sacct sinfo munged mungekey munge unmunge"
PKGS="slurmctld slurmd slurm-client munge"
if [ "$WITH_DBD" = 1 ]; then BINS="$BINS slurmdbd sacctmgr mariadbd mariadb-install-db mariadb"; PKGS="$PKGS slurmdbd mariadb-server"; fi
missing=""; for b in $BINS; do command -v "$b" >/dev/null 2>&1 || missing="$missing $b"; done
if [ -n "$missing" ]; then
  [ "${SKIP_APT:-0}" != 1 ] || die "missing binaries:$missing (and SKIP_APT=1)"
  log "installing$missing ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  # "invoke-rc.d: policy-rc.d denied execution of start" is expected: the daemons are started below.
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $PKGS >/dev/null
fi
T1=$(now); log "packages: $(secs "$T0" "$T1")s"

# ---- 2. layout, ports, config ------------------------------------------------------------------------------
for p in $PORT_CTLD $(seq "$PORT_SLURMD" $((PORT_SLURMD + NNODES - 1))) $([ "$WITH_DBD" = 1 ] && echo "$PORT_DBD $PORT_DB"); do
  command -v ss >/dev/null || break   # iproute2 missing: the daemons will say so themselves
  if ss -Hltn "( sport = :$p )" | grep -q .; then die "TCP port $p is already in use (another Slurm or MariaDB?)"; fi
done
rm -rf "$BASE"
mkdir -p "$BASE"/{state,spool,log,pids,munge}
touch "$BASE/$MARKER"
chmod 755 "$BASE"

# From here on a failure stops what was started and shows why.
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] && return 0
  trap - EXIT
  echo "[slurm_up] FAILED (rc=$rc); last log lines:" >&2
  for f in "$BASE"/log/*; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done
  BASE="$BASE" bash "$HERE/slurm_down.sh" >&2 || true
  exit "$rc"
}
trap on_exit EXIT   # set -e and die() both end in exit, which runs this

# record NAME PID: "PID STARTTIME" so slurm_down.sh never signals a recycled PID.
record() {
  local start
  start=$(sed 's/^.*) //' "/proc/$2/stat" | awk '{print $20}')
  echo "$2 $start" > "$BASE/pids/$1.pid"
  echo "$1" >> "$BASE/pids/order"   # slurm_down.sh stops them in reverse order
}

SLURM_CONF="$BASE/slurm.conf"
MUNGE_SOCKET="$BASE/munge/munge.socket"
if [ "$WITH_DBD" = 1 ]; then
  ACCOUNTING="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$PORT_DBD
JobAcctGatherType=jobacct_gather/linux"
else
  ACCOUNTING="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
NODE_LINES=""; GRES=""; GRES_TYPES=""
[ "$GPUS_PER_NODE" -gt 0 ] && { GRES=" Gres=gpu:$GPUS_PER_NODE"; GRES_TYPES="GresTypes=gpu
AccountingStorageTRES=gres/gpu"; }
for i in $(seq "$NNODES"); do
  NODE_LINES="$NODE_LINES
NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_SLURMD + i - 1)) CPUs=$NCPU RealMemory=$((MEM_MB / NNODES))$GRES State=UNKNOWN"
  mkdir -p "$BASE/spool/node$i"
done
cat > "$SLURM_CONF" <<EOF
# Generated by .ci/slurm_up.sh: single-node test cluster, everything under $BASE.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$PORT_CTLD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also delays the restart of a requeued job (default 120 s)
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
CredType=cred/munge
# for connections to slurmdbd Slurm takes the munge socket from here, not from AuthInfo
AccountingStoragePass=$MUNGE_SOCKET
MpiDefault=none
# no cgroups in a container without systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCOUNTING
SchedulerType=sched/backfill
# a tiny cluster: schedule every 2 s (defaults 60 s / 30 s), so a requeued or newly eligible job starts at once
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
# memory is consumable as on real clusters; a job without --mem gets DefMemPerCPU per CPU
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( MEM_MB / NNODES / NCPU ))
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
MinJobAge=3600
# scancel/time limit: SIGTERM, then SIGKILL after KillWait (default 30 s; short here to keep tests quick)
KillWait=5
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmdPidFile=$BASE/slurmd-%n.pid
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
$GRES_TYPES
$NODE_LINES
PartitionName=debug Nodes=node[1-$NNODES] Default=YES MaxTime=INFINITE State=UP
EOF
if [ "$GPUS_PER_NODE" -gt 0 ]; then   # gres.conf is read from the directory of SLURM_CONF
  for i in $(seq "$NNODES"); do
    mkdir -p "$BASE/fakegpu/node$i"
    # slurmd wants character devices: clones of /dev/null (1,3)
    for g in $(seq 0 $((GPUS_PER_NODE - 1))); do mknod -m 666 "$BASE/fakegpu/node$i/gpu$g" c 1 3; done
    echo "NodeName=node$i Name=gpu File=$BASE/fakegpu/node$i/gpu[0-$((GPUS_PER_NODE - 1))]"
  done > "$BASE/gres.conf"
fi
cat > "$BASE/env.sh" <<EOF
# source me: every Slurm client (sbatch, sacct, submitit's calls, srun inside jobs) must find this config
export SLURM_CONF=$SLURM_CONF
EOF
T2=$(now); log "config: $(secs "$T1" "$T2")s"

# ---- 3. munge (own key and socket under BASE) ----------------------------------------------------------------
mungekey --create --keyfile="$BASE/munge/munge.key" --force
chown -R munge:munge "$BASE/munge"
chmod 711 "$BASE/munge"; chmod 400 "$BASE/munge/munge.key"   # 711: clients must reach the socket
# setpriv execs (runuser would fork), so $! is munged itself
setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground \
  --socket="$MUNGE_SOCKET" --key-file="$BASE/munge/munge.key" --pid-file="$BASE/munge/munged.pid" \
  --seed-file="$BASE/munge/munged.seed" --log-file="$BASE/log/munged.log" --num-threads=10 > "$BASE/log/munged.stdout" 2>&1 &
record munged $!
munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
wait_for 20 "munged answering on $MUNGE_SOCKET" munge_ok
T3=$(now); log "munged: $(secs "$T2" "$T3")s"

# ---- 4. MariaDB + slurmdbd ---------------------------------------------------------------------------------
if [ "$WITH_DBD" = 1 ]; then
  DB="$BASE/mysql"; mkdir -p "$DB"
  mariadb-install-db --no-defaults --user=root --datadir="$DB/data" --auth-root-authentication-method=socket \
    --skip-test-db > "$BASE/log/mariadb-install.log" 2>&1
  # the innodb values are the ones slurmdbd checks for (else it logs "Database settings not recommended")
  mariadbd --no-defaults --user=root --datadir="$DB/data" --socket="$DB/mysqld.sock" --port="$PORT_DB" \
    --bind-address=127.0.0.1 --pid-file="$DB/mariadbd.pid" --log-error="$BASE/log/mariadbd.log" \
    --innodb-buffer-pool-size=512M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 > /dev/null 2>&1 &
  record mariadbd $!
  wait_for 60 "MariaDB socket" mariadb --no-defaults -S "$DB/mysqld.sock" -u root -e 'select 1'
  mariadb --no-defaults -S "$DB/mysqld.sock" -u root -e "
    CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm-ci';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  T4a=$(now); log "mariadb: $(secs "$T3" "$T4a")s"
  # slurmdbd reads slurmdbd.conf from the directory of SLURM_CONF and refuses it unless mode 0600
  cat > "$BASE/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$PORT_DBD
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$PORT_DB
StorageUser=slurm
StoragePass=slurm-ci
StorageLoc=slurm_acct_db
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/slurmdbd.pid
EOF
  chmod 600 "$BASE/slurmdbd.conf"
  SLURM_CONF="$SLURM_CONF" slurmdbd -D > "$BASE/log/slurmdbd.stdout" 2>&1 &
  record slurmdbd $!
  wait_for 60 "slurmdbd answering" env SLURM_CONF="$SLURM_CONF" sacctmgr -n list cluster
else
  T4a=$(now)
fi
T4=$(now); log "slurmdbd: $(secs "$T4a" "$T4")s"

# ---- 5. controller + node --------------------------------------------------------------------------------------
export SLURM_CONF
slurmctld -D -f "$SLURM_CONF" > "$BASE/log/slurmctld.stdout" 2>&1 &
record slurmctld $!
# one slurmd per node; -N: the node name is not the host name (e.g. 'vm')
for i in $(seq "$NNODES"); do
  slurmd -D -N "node$i" -f "$SLURM_CONF" > "$BASE/log/slurmd-node$i.stdout" 2>&1 &
  record "slurmd-node$i" $!
done
nodes_idle() { [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NNODES" ]; }
wait_for 60 "$NNODES nodes idle" nodes_idle
if [ "$WITH_DBD" = 1 ]; then   # slurmctld registers the cluster in slurmdbd by itself; sacct needs it
  cluster_registered() { sacctmgr -n -P list cluster format=cluster,controlport | grep -qx "$CLUSTER|$PORT_CTLD"; }
  wait_for 60 "cluster $CLUSTER registered in slurmdbd" cluster_registered
fi
T5=$(now); log "slurmctld+slurmd x$NNODES: $(secs "$T4" "$T5")s"

srun -N"$NNODES" -n"$NNODES" --time=1 true
T6=$(now); log "srun smoke test: $(secs "$T5" "$T6")s"
trap - EXIT
log "up in $(secs "$T0" "$T6")s total (daemons: $(secs "$T2" "$T6")s). Now: source $BASE/env.sh   (SLURM_CONF=$SLURM_CONF)"
