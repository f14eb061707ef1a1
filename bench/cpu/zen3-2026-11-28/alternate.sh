#!/usr/bin/env bash
# Runs posenc-bench-cpu binaries in turn, N rounds, each output to
# OUTDIR/<label>-<round>.txt with /proc/loadavg before it:
#   alternate.sh OUTDIR N label=BINARY [label=BINARY ...] [-- bench args]
set -euo pipefail
out=$1; n=$2; shift 2
bins=(); args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; args=("$@"); break; fi
  bins+=("$1"); shift
done
mkdir -p "$out"
for ((i = 1; i <= n; i++)); do
  for b in "${bins[@]}"; do
    label=${b%%=*}; bin=${b#*=}
    { echo "loadavg $(cat /proc/loadavg)"; "$bin" --reps=11 "${args[@]}"; } > "$out/$label-$i.txt" 2>&1
  done
done
