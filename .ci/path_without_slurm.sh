#!/usr/bin/env bash
# Print a PATH that has every program of the current PATH except Slurm's client and daemon binaries
# (a farm of symlinks in a temp folder), to run the README's test command as on a machine without
# Slurm:  PATH="$(bash .ci/path_without_slurm.sh)" make test
set -euo pipefail
SLURM_BINS=" srun sbatch salloc scancel squeue sinfo scontrol sacct sacctmgr sattach sbcast sstat strigger sprio sshare sdiag sreport sview smap sjobexitmod slurmd slurmctld slurmdbd slurmstepd "
dir="$(mktemp -d "${TMPDIR:-/tmp}/path-without-slurm.XXXXXX")"
IFS=: read -r -a parts <<< "$PATH"
out=""
for p in "${parts[@]}"; do
  [ -d "$p" ] || continue
  if [ -e "$p/../pyvenv.cfg" ]; then  # a venv's bin: kept as is (its python finds its venv that way)
    ls "$p" | grep -qxE "srun|sbatch" && { echo "Slurm binaries in venv $p" >&2; exit 1; }
    out="$out$p:"
    continue
  fi
  for f in "$p"/*; do
    name="${f##*/}"
    [[ "$SLURM_BINS" == *" $name "* ]] && continue
    [ -x "$f" ] && [ ! -e "$dir/$name" ] && ln -s "$f" "$dir/$name"
  done
done
echo "$out$dir"
