#!/usr/bin/env bash
# abn.sh ROUNDS FILTER "ENV1" "ENV2" ... : cycles configs (BIN may be set per config as BIN=path inside ENV)
rounds=$1; filter=$2; shift 2
for i in $(seq "$rounds"); do
  j=0
  for e in "$@"; do
    j=$((j+1))
    bin=/work/main/build/bench/posenc-bench-cpu
    for kv in $e; do [[ $kv == BIN=* ]] && bin=${kv#BIN=}; done
    env $e "$bin" --reps=7 --only=rope --filter="$filter" | awk -v v="c$j" '/^rope/{printf "%s %s %s %s %s %s\n", v, $2, $3, $4, $(NF-4), $NF}'
  done
done
