#!/usr/bin/env bash
# run_fuzzer.sh BINARY SEED_CORPUS DICT SECONDS WORK_DIR
# Fuzzes from the seed corpus for SECONDS (new inputs go to WORK_DIR/corpus,
# so the committed corpus stays as it is) and leaves libFuzzer's final
# statistics in WORK_DIR/stats. Any crash, leak, timeout or out-of-memory
# fails the run; the reproducer is kept in WORK_DIR/.
set -euo pipefail
bin=$1 seeds=$2 dict=$3 seconds=$4 work=$5
mkdir -p "$work/corpus"
args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
      -print_final_stats=1 -artifact_prefix="$work/")
[ -f "$dict" ] && args+=(-dict="$dict")
set +e
"$bin" "${args[@]}" "$work/corpus" "$seeds" >"$work/log" 2>&1
rc=$?
set -e
grep -E '^stat::' "$work/log" >"$work/stats" || true
cat "$work/stats"
if [ $rc -ne 0 ]; then
  tail -60 "$work/log"
  echo "run_fuzzer: $(basename "$bin") failed (exit $rc); see $work/"
  exit 1
fi
