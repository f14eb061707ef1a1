#!/usr/bin/env bash
# abbin.sh ROUNDS BIN_A BIN_B [bench args]: alternates two bench binaries; prints "A|B dtype style layout GB/s vs-rmw"
rounds=$1; a=$2; b=$3; shift 3
for i in $(seq "$rounds"); do
  for v in A B; do
    bin=$([[ $v == A ]] && echo "$a" || echo "$b")
    "$bin" --reps=11 "$@" | awk -v v=$v '/^rope/{printf "%s %s %s %s %s %s\n", v, $2, $3, $4, $(NF-4), $NF}'
  done
done
