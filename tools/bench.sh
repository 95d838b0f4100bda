#!/bin/bash
# make bench: the node agent's read benchmarks (not tests). Data is generated once under
# $EMBER_BENCH_DIR (default /var/tmp/ember-bench) and reused. Prints a table and writes it to
# $BUILD/bench/results.md; copy the figures into docs/benchmarks.md.
#
# Cases (issue: node agent):
#   seq   warm sequential read, 1 MiB reads of a 1 GiB file
#   small warm small-file read, 10,000 files of 112 KiB, open-read-close in random order, 2 workers
# Each through the mount (page cache of the mount dropped before each run, so the daemon is
# measured) against reading the same bytes directly from the cache directory (warm), interleaved,
# RUNS runs each (default 5), medians and the ratio.
set -euo pipefail
BUILD=$(realpath "${1:-build}")
EMBER=$BUILD/bin/ember
RB=$BUILD/bin/read_bench
WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}
RUNS=${RUNS:-5}
OUT=$BUILD/bench
mkdir -p "$WORK/data/big" "$WORK/data/small" "$OUT"

say() { echo "bench: $*" >&2; }
PIDS=()
stop_all() {
  [ ${#PIDS[@]} -gt 0 ] && { kill "${PIDS[@]}" 2>/dev/null || true; }
  wait 2>/dev/null || true
}

# ---- data (once) ----
if [ ! -f "$WORK/data/big/large.bin" ]; then
  say "generating 1 GiB file"
  "$RB" gen "$WORK/data/big/large.bin" $((1 << 30)) 1
fi
if [ ! -f "$WORK/data/small/.done" ]; then
  say "generating 10,000 files of 112 KiB"
  for d in $(seq -w 0 99); do
    mkdir -p "$WORK/data/small/d$d"
    for f in $(seq -w 0 99); do "$RB" gen "$WORK/data/small/d$d/f$f.jpg" 114688 "1$d$f"; done
  done
  touch "$WORK/data/small/.done"
fi

# ---- ember up ----
rm -rf "$WORK/state" "$WORK/mnt"
mkdir -p "$WORK/mnt"
PORT=$((20000 + RANDOM % 20000))
"$EMBER" up --mount "$WORK/mnt" --data-dir "$WORK/state" --listen "127.0.0.1:$PORT" \
  --node-listen "127.0.0.1:$((PORT + 1))" --cache-size 4GiB \
  --dataset "big=$WORK/data/big" --dataset "small=$WORK/data/small" > "$OUT/ember.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null || true; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  grep -q "serving datasets at" "$OUT/ember.log" 2>/dev/null && break
  kill -0 $UP 2>/dev/null || { cat "$OUT/ember.log"; exit 1; }
  sleep 0.1
done
export EMBER_META=127.0.0.1:$PORT

# ---- warm the cache (first epoch, from the origin) ----
find "$WORK/mnt/small" -type f -name '*.jpg' | sort > "$OUT/mount-small.txt"
say "cold first read through the mount (fills the cache)"
cold_seq=$("$RB" seq "$WORK/mnt/big/large.bin" drop)
cold_small=$("$RB" small "$OUT/mount-small.txt" 2 1 drop)

ds_id() { "$EMBER" dataset show "$1" --json | sed -n 's/^  "id": \([0-9]*\),*/\1/p'; }
BIG_DIR=$WORK/state/cache/blocks/$(ds_id big)/1
SMALL_DIR=$WORK/state/cache/blocks/$(ds_id small)/1
CACHE_LARGE=$(find "$BIG_DIR" -type f | head -1)
find "$SMALL_DIR" -type f | sort > "$OUT/cache-small.txt"
[ "$(wc -l < "$OUT/cache-small.txt")" -eq 10000 ] || { say "cache does not hold all small files"; exit 1; }
# Warm the cache files in the page cache (the daemon reads them from there too).
"$RB" seq "$CACHE_LARGE" keep > /dev/null
"$RB" small "$OUT/cache-small.txt" 2 1 keep > /dev/null

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

: > "$OUT/seq-mount.txt"; : > "$OUT/seq-direct.txt"; : > "$OUT/small-mount.txt"; : > "$OUT/small-direct.txt"
for i in $(seq "$RUNS"); do
  say "run $i/$RUNS"
  "$RB" seq "$WORK/mnt/big/large.bin" drop >> "$OUT/seq-mount.txt"
  "$RB" seq "$CACHE_LARGE" keep >> "$OUT/seq-direct.txt"
  "$RB" small "$OUT/mount-small.txt" 2 "$i" drop >> "$OUT/small-mount.txt"
  "$RB" small "$OUT/cache-small.txt" 2 "$i" keep >> "$OUT/small-direct.txt"
done

sm=$(median < "$OUT/seq-mount.txt"); sd=$(median < "$OUT/seq-direct.txt")
fm=$(median < "$OUT/small-mount.txt"); fd=$(median < "$OUT/small-direct.txt")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
{
  echo "| case | through the mount | direct from cache dir | ratio |"
  echo "| --- | --- | --- | --- |"
  echo "| warm sequential, 1 MiB reads of 1 GiB (MiB/s) | $sm | $sd | $(ratio "$sm" "$sd") |"
  echo "| warm small files, 10,000 x 112 KiB, 2 workers (files/s) | $fm | $fd | $(ratio "$fm" "$fd") |"
  echo
  echo "Cold first read through the mount (from the origin, page cache warm): sequential $cold_seq MiB/s, small files $cold_small files/s."
  echo "Runs: $RUNS each, interleaved; medians. Raw: seq-mount=[$(paste -sd, "$OUT/seq-mount.txt")] seq-direct=[$(paste -sd, "$OUT/seq-direct.txt")] small-mount=[$(paste -sd, "$OUT/small-mount.txt")] small-direct=[$(paste -sd, "$OUT/small-direct.txt")]"
} | tee "$OUT/results.md"
"$EMBER" status
kill $UP 2>/dev/null || true; wait $UP 2>/dev/null || true
trap - EXIT

# ---- peer sharing ----
# Transport level: the Ember protocol vs a raw TCP stream of the same file on the same loopback.
say "peer fill goodput vs raw TCP"
{
  echo
  echo "| case | Ember | baseline | ratio |"
  echo "| --- | --- | --- | --- |"
  "$BUILD/bin/peer_bench" "$WORK/data/big/large.bin" "$RUNS" 1 | head -1
  "$BUILD/bin/peer_bench" "$WORK/data/big/large.bin" "$RUNS" 2
} | tee -a "$OUT/results.md"

# End to end: node B reads a 1 GiB file through its mount, every block from node A's cache,
# against node A's own first read of it from the origin (page cache of the origin warm).
say "two nodes: B reads from A"
rm -rf "$WORK/cluster"; mkdir -p "$WORK/cluster/a/mnt" "$WORK/cluster/b/mnt"
MPORT=$((PORT + 7))
"$EMBER" meta --listen "127.0.0.1:$MPORT" --data-dir "$WORK/cluster/meta" --lease 3s > "$OUT/meta.log" 2>&1 &
PIDS=($!)
trap 'stop_all' EXIT
export EMBER_META=127.0.0.1:$MPORT
for _ in $(seq 100); do "$EMBER" dataset ls > /dev/null 2>&1 && break; sleep 0.1; done
"$EMBER" dataset add big "$WORK/data/big" > /dev/null
for n in a b; do
  host=$([ $n = a ] && echo 127.0.0.2 || echo 127.0.0.3)
  "$EMBER" node --listen "$host:$((MPORT + 1))" --cache-dir "$WORK/cluster/$n/cache" \
    --cache-size 2GiB --mount "$WORK/cluster/$n/mnt" --node-id "$n" > "$OUT/node-$n.log" 2>&1 &
  PIDS+=($!)
done
for n in a b; do
  for _ in $(seq 100); do grep -q "serving datasets" "$OUT/node-$n.log" && break; sleep 0.1; done
done
a_origin=$("$RB" seq "$WORK/cluster/a/mnt/big/large.bin" drop)
sleep 1.5  # A's block report reaches meta
b_peer=$("$RB" seq "$WORK/cluster/b/mnt/big/large.bin" drop)
sleep 1.5
{
  echo
  echo "Two nodes, 1 GiB file through the mount: A's first read (from the origin) $a_origin MiB/s; B's first read (every block from A) $b_peer MiB/s."
} | tee -a "$OUT/results.md"
"$EMBER" status

stop_all

# ---- prefetch: ~2 GiB (the 1 GiB file and the 10,000 small files) to 3 nodes, --mode full ----
# Run twice: caches on this machine's one disk (three nodes share it), and on tmpfs, which stands
# in for each node writing to its own NVMe.
prefetch_run() {  # CACHE_ROOT LABEL
  local root=$1 label=$2
  say "prefetch to 3 nodes, caches on $label"
  rm -rf "$WORK/pf" "$root/ember-pf"; mkdir -p "$WORK/pf" "$root/ember-pf"
  PPORT=$((PORT + 13 + RANDOM % 100))
  "$EMBER" meta --listen "127.0.0.1:$PPORT" --data-dir "$WORK/pf/meta" --lease 3s > "$OUT/pf-meta.log" 2>&1 &
  PIDS=($!)
  export EMBER_META=127.0.0.1:$PPORT
  for _ in $(seq 100); do "$EMBER" dataset ls > /dev/null 2>&1 && break; sleep 0.1; done
  "$EMBER" dataset add mix "$WORK/data" > /dev/null
  for i in 1 2 3; do
    mkdir -p "$WORK/pf/n$i/mnt"
    "$EMBER" node --listen "127.0.0.$((i + 1)):$((PPORT + 1))" --cache-dir "$root/ember-pf/n$i" \
      --cache-size 4GiB --mount "$WORK/pf/n$i/mnt" --node-id "n$i" > "$OUT/pf-node-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in 1 2 3; do
    for _ in $(seq 100); do grep -q "registered with meta" "$OUT/pf-node-$i.log" && break; sleep 0.1; done
  done
  # Baseline: one sequential read of the origin, page cache warm.
  find "$WORK/data" -type f ! -name .done | sort > "$OUT/origin-files.txt"
  xargs -a "$OUT/origin-files.txt" cat > /dev/null
  t0=$(date +%s.%N); xargs -a "$OUT/origin-files.txt" cat > /dev/null; t1=$(date +%s.%N)
  t2=$(date +%s.%N); "$EMBER" prefetch mix --mode full > "$OUT/prefetch.txt"; t3=$(date +%s.%N)
  sleep 3.5
  origin_bytes=$("$EMBER" status --json | sed -n 's/.*"bytes_from_origin": \([0-9]*\).*/\1/p' | paste -sd+ | bc)
  data_bytes=$(xargs -a "$OUT/origin-files.txt" stat -c %s | paste -sd+ | bc)
  {
    echo
    cat "$OUT/prefetch.txt"
    awk -v ob="$origin_bytes" -v db="$data_bytes" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v l="$label" 'BEGIN {
      printf "Prefetch of %.2f GiB to 3 nodes (--mode full, caches on %s): origin bytes / dataset bytes = %.3f; wall %.1fs vs one sequential read of the origin %.1fs (%.1fx).\n", db/2^30, l, ob/db, d-c, b-a, (d-c)/(b-a) }'
  } | tee -a "$OUT/results.md"
  stop_all
  rm -rf "$root/ember-pf"
}
prefetch_run "$WORK" "the one disk"
shm_free=$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1 || echo 0)
if [ "${shm_free:-0}" -gt $((8 << 30)) ]; then prefetch_run /dev/shm "tmpfs"; fi

# ---- scheduler: 500 nodes / 1000 pods and 10,000 / 10,000 through the real gRPC API ----
say "scheduler"
{
  echo
  echo "| cluster, pods | end to end through gRPC | in-process scheduling | data resident on chosen nodes: ours vs first-fit |"
  echo "| --- | --- | --- | --- |"
  "$BUILD/bin/sched_bench" 500 1000 2>/dev/null
  "$BUILD/bin/sched_bench" 10000 10000 2>/dev/null
} | tee -a "$OUT/results.md"
stop_all
trap - EXIT

# ---- remote origins: S3-compatible server on loopback (s3rver), see tools/bench_origins.sh ----
say "remote origins"
"$(dirname "$0")/bench_origins.sh" "$BUILD" | tee -a "$OUT/results.md" || echo "origins benchmark failed"
