#!/bin/bash
# bench_files_memory.sh BUILD: memory per file at 1,000,000 files (#21), and the namespace walks at
# that size. Not a test. Part of `make bench` (bench.sh). Datasets (bench/gen_small.py, made once
# under $EMBER_BENCH_DIR/small): tiny (200,000 x 1-4 KB) and tiny1m (1,000,000 x 1-4 KB).
#
# Per dataset: a fresh meta (RSS read before anything), `ember dataset add` against a
# `find -printf '%s %p'` of the tree (second run of each); a fresh node with an empty cache (RSS
# read when it serves), `ember prefetch --all --mode full` to it, every file looked up (`find`
# over the mount, second run timed against `find` over the tree), then RSS of both processes.
# Reported: bytes per file over each process's start RSS, and the marginal bytes per file
# between the two sizes (what each further file costs beyond a fixed base).
# Writes a markdown table to stdout and one JSON object per figure to $BUILD/bench/files_memory.json.
set -euo pipefail
# No memory held from start (--warm-memory): the files' memory would be carved from it and the
# RSS over the agent's start would not show it.
export NODE_ARGS="${NODE_ARGS---fuse-no-open} --warm-memory 0"
. "$(dirname "$0")/common.sh"
bench_init bench_files_memory small "${1:-}"
: > "$OUT/files_memory.json"
json() { echo "{\"set\":\"$1\",\"case\":\"$2\",\"value\":$3,\"unit\":\"$4\"}" >> "$OUT/files_memory.json"; }
trap stop_all EXIT
PORT=$((20000 + RANDOM % 20000))

for s in tiny:200000 tiny1m:1000000; do
  set=${s%%:*}
  if [ ! -f "$WORK/$set.done" ]; then
    say "generating $set (once)"
    rm -rf "${WORK:?}/$set"
    FILES=${s##*:} python3 "$(dirname "$0")/gen_small.py" "$WORK/$set" tiny
    touch "$WORK/$set.done"
  fi
done

echo
echo "Memory per file and namespace walks at 1M files (\`bench/bench_files_memory.sh\`, one node, --fuse-no-open):"
echo
echo "| dataset | figure | Ember | native | Ember / native |"
echo "|---|---|---|---|---|"
declare -A AGENT META
for s in tiny:200000 tiny1m:1000000; do
  set=${s%%:*} FILES=${s##*:}
  DATA=$WORK/$set
  stop_all
  rm -rf "$WORK/meta" "$WORK/a"
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
  META_PID=$!
  PIDS+=($META_PID)
  wait_for_log "$WORK/meta.log" "serving on" $META_PID
  export EMBER_META=127.0.0.1:$PORT
  meta0=$(rss_kib $META_PID)
  say "$set: walk"
  find "$DATA" -printf '%s %p\n' > /dev/null
  t0=$(now); find "$DATA" -printf '%s %p\n' > /dev/null; t_find=$(secs "$t0" "$(now)")
  t0=$(now); "$B/ember" dataset add "$set" "$DATA" > /dev/null; t_add=$(secs "$t0" "$(now)")
  echo "| $set | dataset add of $FILES files (s) | $t_add | $t_find (find -printf) | $(awk -v a="$t_add" -v b="$t_find" 'BEGIN { printf "%.2f", a / b }') |"
  json "$set" walk "$t_add" s
  start_node a 2 12GiB
  agent0=$(rss_kib $NODE_PID)
  say "$set: prefetch to one node"
  "$B/ember" prefetch "$set" --all --mode full > "$WORK/prefetch.out" 2>&1
  MNT=$WORK/a/mnt/$set
  find "$MNT" > /dev/null; find "$DATA" > /dev/null
  t0=$(now); find "$MNT" > /dev/null; t_fm=$(secs "$t0" "$(now)")
  t0=$(now); find "$DATA" > /dev/null; t_fn=$(secs "$t0" "$(now)")
  echo "| $set | find over the mount (s) | $t_fm | $t_fn | $(awk -v a="$t_fm" -v b="$t_fn" 'BEGIN { printf "%.2f", a / b }') |"
  json "$set" find "$t_fm" s
  sleep 3  # the prefetch's buffers handed back
  AGENT[$set]=$(rss_kib $NODE_PID) META[$set]=$(rss_kib $META_PID)
  a=$(awk -v k="${AGENT[$set]}" -v k0="$agent0" -v f="$FILES" 'BEGIN { printf "%.0f", (k - k0) * 1024 / f }')
  m=$(awk -v k="${META[$set]}" -v k0="$meta0" -v f="$FILES" 'BEGIN { printf "%.0f", (k - k0) * 1024 / f }')
  echo "| $set | agent RSS over its start (bytes per file; start $((agent0 / 1024)) MiB, now $((AGENT[$set] / 1024)) MiB) | $a | | |"
  echo "| $set | meta RSS over its start (bytes per file; start $((meta0 / 1024)) MiB, now $((META[$set] / 1024)) MiB) | $m | | |"
  json "$set" agent-bytes-per-file "$a" B
  json "$set" meta-bytes-per-file "$m" B
done
stop_all
a=$(awk -v x="${AGENT[tiny1m]}" -v y="${AGENT[tiny]}" 'BEGIN { printf "%.0f", (x - y) * 1024 / 800000 }')
m=$(awk -v x="${META[tiny1m]}" -v y="${META[tiny]}" 'BEGIN { printf "%.0f", (x - y) * 1024 / 800000 }')
echo "| 200k -> 1M | agent RSS per further file (bytes) | $a | | |"
echo "| 200k -> 1M | meta RSS per further file (bytes) | $m | | |"
json marginal agent-bytes-per-file "$a" B
json marginal meta-bytes-per-file "$m" B
