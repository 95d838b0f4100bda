#!/bin/bash
# bench_first.sh BUILD: a block's first arrival on a node, end to end through mounts of separate
# node processes, beside this machine's ceilings for the same work measured in the same run.
# Not a test. Part of `make bench` (bench.sh); RUNS (default 3) interleaved runs, medians with
# min-max; NODE_ARGS are added to every `ember node`. Writes a markdown table to stdout and one JSON object per figure to
# $BUILD/bench/first.json.
#
# Data: 4 files of 256 MiB (1 GiB), origin warm in the page cache. Each run starts a fresh meta
# and three fresh nodes (127.0.0.2-4, caches on this machine's one disk) and measures:
#   origin  node a's first read of the 1 GiB through its mount (cat of the 4 files, 1 reader),
#           against read-and-store: the same reads with each 4 MiB stored O_DIRECT, no FUSE;
#   peer-1  node b's first read of what a holds (a's cache pages re-read into memory first),
#           1 reader; "stored" is until b's cache holds every block;
#   peer-4  node c the same with 4 readers (one per file), from a and b (both warm);
#   prefetch  after a restart with empty caches, `ember prefetch --mode full` to the 3 nodes:
#           wall time of the command;
# and the ceilings: the 1 GiB written with O_DIRECT by one writer (1 node's cache write; right
# before peer-1), by three writers at once (3 nodes' cache writes; right before the prefetch:
# this virtual disk writes slower after gigabytes were written and deleted, so each ceiling is
# taken in the state its case meets), raw TCP over loopback (peer_bench), read-and-store
# (read_bench store).
set -euo pipefail
. "$(dirname "$0")/common.sh"
BUILD=$(realpath "${1:-build}")
B=$BUILD/bin
RUNS=${RUNS:-3}
WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/first-arrival
OUT=$BUILD/bench
mkdir -p "$WORK/data" "$OUT"
: > "$OUT/first.json"
RAW=$OUT/first.raw
: > "$RAW"
say() { echo "bench_first: $*" >&2; }

for i in 0 1 2 3; do
  [ -f "$WORK/data/f$i.bin" ] || "$B/read_bench" gen "$WORK/data/f$i.bin" $((256 << 20)) "$((70 + i))"
done
FILES=("$WORK"/data/f?.bin)
warm_origin() { cat "${FILES[@]}" > /dev/null; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
mibs() { awk -v s="$1" 'BEGIN { printf "%.0f", 1024 / s }'; }
record() { echo "$1 $2" >> "$RAW"; }  # CASE VALUE

trap stop_all EXIT

PORT=$((20000 + RANDOM % 20000))
cluster_up() {  # fresh meta and nodes a, b, c; the dataset "first"
  stop_all
  rm -rf "$WORK/meta" "$WORK/a" "$WORK/b" "$WORK/c"
  PORT=$((PORT + 10))
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" \
    --http "127.0.0.1:$((PORT + 3))" > "$WORK/meta.log" 2>&1 &
  PIDS+=($!)
  wait_for_log "$WORK/meta.log" "serving on" $!
  export EMBER_META=127.0.0.1:$PORT
  "$B/ember" dataset add first "$WORK/data" > /dev/null
  local h=2
  for n in a b c; do
    start_node "$n" "$h" 4GiB
    h=$((h + 1))
  done
}
metric() {  # NODE(2..4) NAME: a metric's value on node 127.0.0.NODE (1: meta)
  local at="127.0.0.$1:$((PORT + 2))"
  [ "$1" = 1 ] && at="127.0.0.1:$((PORT + 3))"
  curl -s "http://$at/metrics" | awk -v m="$2" '$1 == m { print $2 }'
}
wait_stored() {  # NODE BLOCKS: until the node's cache holds BLOCKS blocks (60 s at most)
  for _ in $(seq 600); do
    [ "$(metric "$1" ember_cache_resident_blocks)" = "$2" ] && return 0
    sleep 0.01
  done
  say "node 127.0.0.$1 never stored $2 blocks"
  return 1
}
write1() {  # the 1 GiB written O_DIRECT by one writer: one node's cache writes
  warm_origin
  t0=$(date +%s.%N)
  for i in 0 1 2 3; do
    dd if="${FILES[$i]}" of="$WORK/ceil1" bs=4M seek=$((i * 64)) oflag=direct conv=notrunc status=none
  done
  t1=$(date +%s.%N)
  rm -f "$WORK/ceil1"
  record write1 "$(mibs "$(secs "$t0" "$t1")")"
}
write3() {  # the 1 GiB written O_DIRECT by three writers at once: three nodes' cache writes
  warm_origin
  W=()
  t0=$(date +%s.%N)
  for n in 1 2 3; do
    (for i in 0 1 2 3; do
      dd if="${FILES[$i]}" of="$WORK/ceil3.$n" bs=4M seek=$((i * 64)) oflag=direct conv=notrunc status=none
    done) &
    W+=($!)
  done
  wait "${W[@]}"
  t1=$(date +%s.%N)
  rm -f "$WORK"/ceil3.*
  record write3-s "$(secs "$t0" "$t1")"
}
settle() { sync; sleep 2; }  # the last case's disk writes and deletions done before the next

for run in $(seq "$RUNS"); do
  say "run $run/$RUNS"
  # ---- ceilings ----
  settle
  ls "${FILES[@]}" > "$WORK/list"
  rm -rf "$WORK/store"; mkdir -p "$WORK/store"
  warm_origin
  record store "$("$B/read_bench" store "$WORK/list" 1 0 "$WORK/store" mib)"
  rm -rf "$WORK/store"
  record tcp "$("$B/peer_bench" "${FILES[0]}" 1 1 2>/dev/null | awk -F'|' '/raw TCP/ { sub(/.*: /, "", $4); print $4 + 0; exit }')"

  # ---- origin, peer-1, peer-4 ----
  cluster_up
  warm_origin
  t0=$(date +%s.%N); cat "$WORK"/a/mnt/first/f?.bin > /dev/null; t1=$(date +%s.%N)
  record origin "$(mibs "$(secs "$t0" "$t1")")"
  wait_stored 2 256
  sleep 0.5                                  # a's last blocks reach meta
  settle; write1; settle                     # b's ceiling, in the same disk state
  drop_caches; cat "$WORK"/a/cache/blocks/*/*/* > /dev/null  # a serves from memory
  t0=$(date +%s.%N); cat "$WORK"/b/mnt/first/f?.bin > /dev/null; t1=$(date +%s.%N)
  wait_stored 3 256; t2=$(date +%s.%N)
  record peer1 "$(mibs "$(secs "$t0" "$t1")")"
  record peer1-stored "$(mibs "$(secs "$t0" "$t2")")"
  cat "$WORK"/a/cache/blocks/*/*/* "$WORK"/b/cache/blocks/*/*/* > /dev/null
  R=()
  t0=$(date +%s.%N)
  for i in 0 1 2 3; do cat "$WORK/c/mnt/first/f$i.bin" > /dev/null & R+=($!); done
  wait "${R[@]}"
  t1=$(date +%s.%N)
  wait_stored 4 256; t2=$(date +%s.%N)
  record peer4 "$(mibs "$(secs "$t0" "$t1")")"
  record peer4-stored "$(mibs "$(secs "$t0" "$t2")")"
  record peer-from-origin "$(metric 3 'ember_read_bytes_total{source="origin"}')"

  # ---- prefetch to 3 nodes, and its ceiling measured just before (the same disk state) ----
  cluster_up
  settle
  write3
  settle
  warm_origin
  t0=$(date +%s.%N)
  "$B/ember" prefetch first --all --mode full > "$WORK/prefetch.out" 2>&1
  t1=$(date +%s.%N)
  record prefetch-s "$(secs "$t0" "$t1")"
  origin_bytes=0
  for h in 2 3 4; do
    origin_bytes=$((origin_bytes + $(metric $h 'ember_read_bytes_total{source="origin"}' | cut -d. -f1)))
  done
  record prefetch-origin-bytes "$origin_bytes"
  record prefetch-locates "$(metric 1 'ember_meta_rpc_seconds_count{method="Locate"}')"
  stop_all
done

# ---- report ----
med() { awk -v c="$1" '$1 == c { print $2 }' "$RAW" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%s", v[int((NR + 1) / 2)] }'; }
rng() { awk -v c="$1" '$1 == c { print $2 }' "$RAW" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%s-%s", v[1], v[NR] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }
min2() { awk -v a="$1" -v b="$2" 'BEGIN { print (a < b ? a : b) }'; }
W1=$(med write1); W3=$(med write3-s); TCP=$(med tcp); STORE=$(med store)
PEER_CEIL=$(min2 "$W1" "$TCP")
json() {  # CASE UNIT CEILING_NAME CEILING RATIO
  printf '{"case":"%s","unit":"%s","median":%s,"min_max":"%s","ceiling":"%s","ceiling_value":%s,"ratio":%s}\n' \
    "$1" "$2" "$(med "$1")" "$(rng "$1")" "$3" "$4" "$5" >> "$OUT/first.json"
}
echo
echo "First arrival, end to end through mounts of separate node processes (1 GiB as 4 files, 3 nodes on 127.0.0.x, caches on this machine's one disk); $RUNS interleaved runs, median (min-max):"
echo
echo "| case | Ember | ceiling in the same run | Ember / ceiling |"
echo "| --- | --- | --- | --- |"
row() {  # CASE LABEL UNIT CEILING_LABEL CEILING (higher is better)
  local r; r=$(ratio "$(med "$1")" "$5")
  echo "| $2 | $(med "$1") ($(rng "$1")) $3 | $4: $5 $3 | $r |"
  json "$1" "$3" "$4" "$5" "$r"
}
row origin "origin (in RAM) first read, 1 reader" MiB/s "read and store, no FUSE" "$STORE"
row peer1 "peer first read, 1 reader (reader's time)" MiB/s "min(O_DIRECT write, raw TCP)" "$PEER_CEIL"
row peer1-stored "peer first read, 1 reader, until stored" MiB/s "min(O_DIRECT write, raw TCP)" "$PEER_CEIL"
row peer4 "peer first read, 4 readers (readers' time)" MiB/s "min(O_DIRECT write, raw TCP)" "$PEER_CEIL"
row peer4-stored "peer first read, 4 readers, until stored" MiB/s "min(O_DIRECT write, raw TCP)" "$PEER_CEIL"
PF=$(med prefetch-s)
r=$(ratio "$PF" "$W3")
echo "| prefetch --mode full to 3 nodes, wall time (lower is better) | $PF ($(rng prefetch-s)) s | 3 O_DIRECT writers at once: $W3 s | $r |"
json prefetch-s s "3 O_DIRECT writers at once" "$W3" "$r"
echo
echo "Ceilings: one O_DIRECT writer $W1 MiB/s ($(rng write1)), raw TCP $TCP MiB/s ($(rng tcp)), read and store $STORE MiB/s ($(rng store)), three writers $W3 s ($(rng write3-s)). Origin bytes read by the prefetch: $(med prefetch-origin-bytes) for 1073741824 bytes of data (256 blocks), with $(med prefetch-locates) Locate calls to meta from the 3 nodes; origin bytes read by node b's peer reads: $(med peer-from-origin)."
echo
echo "Raw: $(awk '{ printf "%s%s=%s", (NR > 1 ? ", " : ""), $1, $2 }' "$RAW")."
