#!/usr/bin/env bash
# ab.sh ROUNDS "ENV_A" "ENV_B" [bench args] : alternates the two, prints fp32 rope rows' vs-rmw
rounds=$1; a=$2; b=$3; shift 3
bin=${BIN:-/work/main/build/bench/posenc-bench-cpu}
for i in $(seq "$rounds"); do
  for v in A B; do
    e=$([[ $v == A ]] && echo "$a" || echo "$b")
    env $e "$bin" --reps=11 --only=rope "$@" | awk -v v=$v -v l="$(cut -d' ' -f1 /proc/loadavg)" '/^rope/{printf "%s %s %s %s %s %s\n", v, $2, $3, $4, $(NF-4), $NF}'
  done
done
