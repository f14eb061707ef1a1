#!/usr/bin/env bash
# abn.sh ROUNDS "NAME=BIN ..." [bench args]: alternates several bench binaries
rounds=$1; bins=$2; shift 2
for i in $(seq "$rounds"); do
  for nb in $bins; do
    v=${nb%%=*}; bin=${nb#*=}
    "$bin" --reps=11 "$@" | awk -v v=$v '/^rope/{printf "%s %s %s %s %s %s\n", v, $2, $3, $4, $(NF-4), $NF}'
  done
done
