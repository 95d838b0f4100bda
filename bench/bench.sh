#!/bin/bash
# make bench: benchmarks (not tests). Data is generated once under $EMBER_BENCH_DIR (default
# /var/tmp/ember-bench) and reused. Writes $BUILD/bench/results.md.
#
# 1. bench_suite.sh: Ember side by side with the native file system, bindfs and rclone (warm,
#    cold, metadata, takeover stall, peer transport, memory); updates docs/benchmarks.md.
#    bench_uring.sh: the round-trip-bound cases with --fuse-uring (same data).
# 2. Two nodes end to end (B reads from A), prefetch to 3 nodes, the scheduler at 500 and 10,000
#    nodes, remote origins (S3 and HTTP on loopback). Figures for these go into
#    docs/benchmarks.md by hand.
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

# ---- the side-by-side suite: Ember vs native, bindfs, rclone (writes docs/benchmarks.md) ----
"$(dirname "$0")/bench_suite.sh" "$BUILD" | tee "$OUT/results.md"
# Requests over io_uring against the default agent (needs the suite's data; writes its own part
# of docs/benchmarks.md).
"$(dirname "$0")/bench_uring.sh" "$BUILD" | tee -a "$OUT/results.md"
PORT=$((20000 + RANDOM % 20000))

# ---- peer sharing ----
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

# ---- remote origins: S3-compatible server on loopback (s3rver), see bench/bench_origins.sh ----
say "remote origins"
"$(dirname "$0")/bench_origins.sh" "$BUILD" | tee -a "$OUT/results.md" || echo "origins benchmark failed"
