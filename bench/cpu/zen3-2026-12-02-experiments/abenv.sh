#!/usr/bin/env bash
# abenv.sh ROUNDS BIN "NAME=ENV[,ENV] ..." [bench args]: alternates one bench
# binary under several environments (an experiment build's switches), rope rows.
rounds=$1; bin=$2; vars=$3; shift 3
for i in $(seq "$rounds"); do
  for nv in $vars; do
    v=${nv%%=*}; envs=${nv#*=}
    env ${envs//,/ } "$bin" --reps=11 "$@" |
      awk -v v=$v '/^rope/{printf "%s %s %s %s %s %s\n", v, $2, $3, $4, $(NF-4), $NF}'
  done
done
