#!/bin/bash
# Runs each libFuzzer target for a bounded time: `tools/fuzz.sh BUILD_DIR SECONDS [TARGET...]`.
# Starts from the kept corpus in tests/fuzz/corpus/NAME (never modified here); new interesting
# inputs go to BUILD_DIR/fuzz-corpus/NAME. A crash is saved as
# tests/fuzz/corpus/NAME/crash-<hash> so `make test` replays it from then on, and the run fails.
set -uo pipefail
build=$1
seconds=$2
shift 2
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(wire manifest index_record units)
root=$(cd "$(dirname "$0")/.." && pwd)
failed=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/fuzz_$t"
  work="$build/fuzz-corpus/$t"
  kept="$root/tests/fuzz/corpus/$t"
  mkdir -p "$work" "$kept"
  log="$build/fuzz-$t.log"
  echo "fuzz: $t for ${seconds}s (log: $log)"
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$kept/" "$work" "$kept" > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FOUND A CRASH (exit $rc); input kept under $kept:"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5
    failed=1
  else
    echo "fuzz: $t ok: ${runs:-?} runs, $cov"
  fi
done
exit $failed
