#!/bin/bash
# bench_small.sh BUILD: small files at scale (#21), end to end through mounts of separate node
# processes, beside the machine's ceilings for the same work measured in the same run. Not a
# test. Part of `make bench` (bench.sh). SETS (default "imagenet tiny") picks the datasets
# (bench/gen_small.py, made once under $EMBER_BENCH_DIR/small): imagenet = 50,000 files of
# ~110 KB in 1,000 folders; tiny = 200,000 files of 1-4 KB. NODE_ARGS go to every `ember node`
# (default --fuse-no-open --readdirplus, as a node serving small-file datasets is set up;
# NODE_ARGS= for none).
# Writes a markdown table to stdout and one JSON object per figure to $BUILD/bench/small.json.
#
# Per dataset, one run:
#   walk      `ember dataset add` of the local tree, against `find -printf '%s %p'` of it (both
#             with the tree's inodes in memory);
#   prefetch  `ember prefetch --all --mode full` to 3 fresh nodes (127.0.0.2-4, empty caches,
#             origin in the page cache), wall time of the command and until `sync` returns (the
#             cache writes on disk), against three O_DIRECT appenders writing the same number of
#             bytes at once in 4 MiB writes (taken right before, same disk state), and against
#             the least CPU work any prefetch does first: every origin file opened, read and
#             closed once (2 threads, page cache); origin bytes read / dataset bytes (the
#             origin-once guarantee); and against prefetch_floor, the same bytes moved with nothing
#             of Ember in it (each origin file read once by one of 3 threads, sent over loopback
#             TCP to the 2 others, all 3 appending with O_DIRECT: no checksum, index or meta);
#   memory    RSS of each agent and of meta after the prefetch, per file;
#   find      `find` over node a's mount against `find` over the tree (second run of each);
#   warm      every file read through node a's mount by 4 readers (`xargs -P4 cat`), against the
#             same of the tree: page cache warm (second read of each), and dropped;
#   cold      node a alone (fresh meta, empty cache), page cache dropped: the first epoch
#             through its mount (4 readers; blocks come from the origin on disk), against the
#             tree read cold.
set -euo pipefail
export NODE_ARGS=${NODE_ARGS---fuse-no-open --readdirplus}
. "$(dirname "$0")/common.sh"
bench_init bench_small small "${1:-}"
SETS=${SETS:-imagenet tiny}
: > "$OUT/small.json"

NODE_PIDS=()
trap stop_all EXIT
PORT=$((20000 + RANDOM % 20000))

fresh_node() {  # NAME HOST: a node on 127.0.0.HOST with an empty cache
  rm -rf "$WORK/$1"
  start_node "$1" "$2" 12GiB
  NODE_PIDS[$2]=$NODE_PID
}
epoch() {  # DIR: every file under DIR read by 4 readers; prints seconds
  local t0
  t0=$(now)
  (cd "$1" && find . -type f -print0 | xargs -0 -P4 -n 500 cat > /dev/null)
  secs "$t0" "$(now)"
}
# 3 writers appending BYTES each (rounded up to 4 MiB) with O_DIRECT in 4 MiB writes, from a
# 256 MiB random source in the page cache read again for each 256 MiB: `dd` reading the file,
# no pipes (a `cat | head | dd` pipeline of the same bytes was CPU-bound on 2 cores, 2.9-3.2 s
# where the disk took 0.72-0.75 s for the tiny set's 1.43 GB).
ceiling() {
  local blocks=$((($1 + (4 << 20) - 1) >> 22)) t0 n
  [ -f "$WORK/rnd" ] || "$B/read_bench" gen "$WORK/rnd" $((256 << 20)) 5 > /dev/null
  cat "$WORK/rnd" > /dev/null
  sync; sleep 2
  local W=()
  t0=$(now)
  for n in 1 2 3; do
    (k=0
     while [ "$k" -lt "$blocks" ]; do
       c=$((blocks - k < 64 ? blocks - k : 64))
       dd if="$WORK/rnd" of="$WORK/ceil.$n" bs=4M count="$c" seek="$k" oflag=direct \
         conv=notrunc status=none
       k=$((k + c))
     done) &
    W+=($!)
  done
  wait "${W[@]}"
  secs "$t0" "$(now)"
  rm -f "$WORK"/ceil.*
  sync; sleep 2
}
json() { echo "{\"set\":\"$1\",\"case\":\"$2\",\"ember\":$3,\"ceiling\":$4,\"unit\":\"$5\"}" >> "$OUT/small.json"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo
echo "| dataset | case | Ember | ceiling (same run) | Ember / ceiling |"
echo "| --- | --- | --- | --- | --- |"
for set in $SETS; do
  DATA=$WORK/$set
  small_dataset "$set"
  FILES=$(find "$DATA" -type f | wc -l)
  BYTES=$(find "$DATA" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f\n", s }')
  stop_all
  rm -rf "$WORK/meta"
  PORT=$((PORT + 10))
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
  PIDS+=($!)
  META_PID=$!
  wait_for_log "$WORK/meta.log" "serving on" $!
  export EMBER_META=127.0.0.1:$PORT

  # ---- walk: dataset add vs find -printf ----
  say "$set: walk ($FILES files)"
  find "$DATA" -printf '%s %p\n' > /dev/null
  t0=$(now); find "$DATA" -printf '%s %p\n' > /dev/null; t_find=$(secs "$t0" "$(now)")
  t0=$(now); "$B/ember" dataset add "$set" "$DATA" > /dev/null; t_add=$(secs "$t0" "$(now)")
  echo "| $set | dataset add of $FILES files (s) | $t_add | $t_find (find -printf) | $(ratio "$t_add" "$t_find") |"
  json "$set" walk "$t_add" "$t_find" s

  # ---- prefetch to 3 nodes vs 3 O_DIRECT appenders ----
  say "$set: ceiling"
  t_ceil=$(ceiling "$BYTES")
  h=2
  for n in a b c; do fresh_node $n $h; h=$((h + 1)); done
  find "$DATA" -type f -print0 | xargs -0 cat > /dev/null  # origin in the page cache
  # The origin read once, alone: every file opened, read and closed by 2 threads (one per
  # core) from the page cache, what any prefetch that reads each origin file once does first.
  find "$DATA" -type f > "$WORK/files.list"
  t_orig=$(awk -v f="$FILES" -v r="$("$B/read_bench" small "$WORK/files.list" 2 0 keep)" \
    'BEGIN { printf "%.2f", f / r }')
  # The same work with nothing of Ember in it: each origin file read once by one of 3 "nodes",
  # packed into 2 MiB buffers, appended with O_DIRECT and sent over loopback TCP to the 2 others,
  # which append it too (prefetch_floor: no checksums, index, locations or claims).
  say "$set: the same bytes moved with no bookkeeping"
  t_floor=$(cd / && "$B/prefetch_floor" "$WORK/files.list" 3 "$WORK")
  say "$set: prefetch to 3 nodes"
  t0=$(now)
  "$B/ember" prefetch "$set" --all --mode full > "$WORK/prefetch.out" 2>&1
  t_pf=$(secs "$t0" "$(now)")
  sync
  t_pfs=$(secs "$t0" "$(now)")
  origin=0
  for h in 2 3 4; do
    o=$(curl -s "http://127.0.0.$h:$((PORT + 2))/metrics" | awk '$1 == "ember_read_bytes_total{source=\"origin\"}" { print $2 }')
    origin=$(awk -v a="$origin" -v b="${o:-0}" 'BEGIN { printf "%.0f", a + b }')
  done
  echo "| $set | prefetch to 3 nodes (s) | $t_pf | $t_ceil (3 O_DIRECT appenders) | $(ratio "$t_pf" "$t_ceil") |"
  echo "| $set | prefetch to 3 nodes, until synced (s) | $t_pfs | $t_ceil | $(ratio "$t_pfs" "$t_ceil") |"
  echo "| $set | prefetch to 3 nodes vs the origin's files read once (s) | $t_pf | $t_orig (open, read, close each, 2 threads, page cache) | $(ratio "$t_pf" "$t_orig") |"
  echo "| $set | prefetch to 3 nodes vs the same bytes moved with no bookkeeping (s) | $t_pf | $t_floor (prefetch_floor: read once, sent to 2, 3 O_DIRECT appenders) | $(ratio "$t_pf" "$t_floor") |"
  echo "| $set | origin bytes / dataset bytes | $(ratio "$origin" "$BYTES") | 1.00 | |"
  json "$set" prefetch "$t_pf" "$t_ceil" s
  json "$set" prefetch-synced "$t_pfs" "$t_ceil" s
  json "$set" prefetch-origin-floor "$t_pf" "$t_orig" s
  json "$set" prefetch-no-bookkeeping "$t_pf" "$t_floor" s
  json "$set" origin-bytes "$origin" "$BYTES" bytes

  # ---- memory per file ----
  # With the memory each agent holds from start for blocks in flight (--warm-memory), which the
  # files' memory is carved from too: bench_files_memory.sh measures per-file memory without it.
  warm=$(grep -o "blocks in flight: [0-9]* MiB" "$WORK/a.log" | grep -o "[0-9]*" || echo 0)
  for h in 2 3 4; do
    echo "| $set | agent 127.0.0.$h RSS, $warm MiB of it held from start (bytes per file) | $(awk -v k="$(rss_kib "${NODE_PIDS[$h]}")" -v f="$FILES" 'BEGIN { printf "%.0f", k * 1024 / f }') | | |"
  done
  echo "| $set | meta RSS (bytes per file) | $(awk -v k="$(rss_kib "$META_PID")" -v f="$FILES" 'BEGIN { printf "%.0f", k * 1024 / f }') | | |"

  # ---- find over the mount vs the tree ----
  MNT=$WORK/a/mnt/$set
  find "$MNT" > /dev/null; find "$DATA" > /dev/null
  t0=$(now); find "$MNT" > /dev/null; t_fm=$(secs "$t0" "$(now)")
  t0=$(now); find "$DATA" > /dev/null; t_fn=$(secs "$t0" "$(now)")
  echo "| $set | find over the mount (s) | $t_fm | $t_fn (find of the tree) | $(ratio "$t_fm" "$t_fn") |"
  json "$set" find "$t_fm" "$t_fn" s

  # ---- warm epochs ----
  say "$set: warm epochs"
  # Each read again right before it is timed: pages untouched for a minute are reclaimed here.
  epoch "$MNT" > /dev/null; t_wm=$(epoch "$MNT")
  epoch "$DATA" > /dev/null; t_wn=$(epoch "$DATA")
  echo "| $set | warm epoch, page cache warm, 4 readers (files/s) | $(ratio "$FILES" "$t_wm") | $(ratio "$FILES" "$t_wn") (native) | $(ratio "$t_wn" "$t_wm") |"
  json "$set" warm "$t_wm" "$t_wn" s
  drop_caches; t_dm=$(epoch "$MNT")
  drop_caches; t_dn=$(epoch "$DATA")
  echo "| $set | warm epoch, page cache dropped, 4 readers (files/s) | $(ratio "$FILES" "$t_dm") | $(ratio "$FILES" "$t_dn") (native) | $(ratio "$t_dn" "$t_dm") |"
  json "$set" warm-dropped "$t_dm" "$t_dn" s

  # ---- cold first epoch: node a restarted empty, blocks from the origin on disk ----
  say "$set: cold epoch"
  stop_all  # no peer holds anything: a fresh meta, node a alone
  rm -rf "$WORK/meta" "$WORK/b" "$WORK/c"
  PORT=$((PORT + 10))
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
  PIDS+=($!)
  wait_for_log "$WORK/meta.log" "serving on" $!
  export EMBER_META=127.0.0.1:$PORT
  "$B/ember" dataset add "$set" "$DATA" > /dev/null
  fresh_node a 2
  drop_caches; t_cm=$(epoch "$MNT")
  drop_caches; t_cn=$(epoch "$DATA")
  echo "| $set | cold first epoch, 4 readers (files/s) | $(ratio "$FILES" "$t_cm") | $(ratio "$FILES" "$t_cn") (native, from disk) | $(ratio "$t_cn" "$t_cm") |"
  json "$set" cold "$t_cm" "$t_cn" s
  stop_all
  rm -rf "$WORK/a" "$WORK/b" "$WORK/c" "$WORK/meta"
done
