#!/bin/bash
# make bench: benchmarks (not tests). Data is generated once under $EMBER_BENCH_DIR (default
# /var/tmp/ember-bench) and reused. Writes $BUILD/bench/results.md.
#
# 1. bench_suite.sh: Ember side by side with the native file system, bindfs and rclone (warm,
#    cold, metadata, takeover stall, peer transport, memory); updates docs/benchmarks.md.
#    bench_uring.sh: the round-trip-bound cases with --fuse-uring (same data).
# 2. bench_first.sh: first arrival end to end (peer reads through mounts with 1 and 4 readers, an
#    origin read, prefetch to 3 nodes) beside the machine's ceilings in the same run; the
#    scheduler at 500 and 10,000 nodes, remote origins (S3 and HTTP on loopback). Figures for
#    these go into docs/benchmarks.md by hand.
# 3. bench_small.sh: small files at scale (ImageNet-shaped 50,000 x ~110 KB and 200,000 x 1-4 KB):
#    dataset add, prefetch to 3 nodes, memory per file, find, warm and cold epochs, each beside
#    the same-run ceiling or native. Figures go into docs/benchmarks.md by hand.
#    bench_files_memory.sh: agent and meta RSS per file at 200,000 and 1,000,000 files, with
#    dataset add and find at that size.
#    bench_au.sh: how many emulated accelerators (unet3d, resnet50; `ember bench au --find-max`)
#    native, Ember (cold first epoch, warm), bindfs and rclone keep busy.
#    bench_ckpt.sh: checkpoints through writable volumes (save with fsync, restore on a fresh
#    node) beside local disk, O_DIRECT writers, disk reads and raw TCP in the same run.
# 4. bench_meta_ha.sh (when etcd is installed): meta's restart time on its data dir, etcd's write
#    latency and leader failover on 127.0.0.11-13, and meta replicas on them: `dataset add`
#    through a replicated leader and 20 leader kills, each timed until a write is acknowledged.
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

# ---- first arrival: peer reads through mounts, origin reads, prefetch to 3 nodes, each beside
# its ceiling in the same run (bench_first.sh) ----
say "first arrival"
"$(dirname "$0")/bench_first.sh" "$BUILD" | tee -a "$OUT/results.md"
PORT=$((20000 + RANDOM % 20000))

# ---- small files at scale (bench_small.sh) ----
say "small files"
"$(dirname "$0")/bench_small.sh" "$BUILD" | tee -a "$OUT/results.md"
say "memory per file at 1M files"
"$(dirname "$0")/bench_files_memory.sh" "$BUILD" | tee -a "$OUT/results.md"
# ---- accelerators fed, MLPerf-Storage style (bench_au.sh; #22, `ember bench au`) ----
say "accelerator utilization"
"$(dirname "$0")/bench_au.sh" "$BUILD" | tee -a "$OUT/results.md"
# ---- checkpoints (bench_ckpt.sh; #23): save and restore through two nodes' mounts ----
say "checkpoints"
"$(dirname "$0")/bench_ckpt.sh" "$BUILD" | tee -a "$OUT/results.md"
# ---- meta failover's figures (bench_meta_ha.sh; needs etcd: #26 part 2, docs/meta-ha.md) ----
if command -v etcd > /dev/null; then
  say "meta failover"
  "$(dirname "$0")/bench_meta_ha.sh" "$BUILD" | tee -a "$OUT/results.md"
else
  say "meta failover: skipped (apt-get install etcd-server etcd-client)"
fi
trap 'stop_all' EXIT

# ---- RDMA: the transport's own cost per block on the fake device, beside TCP (rdma_bench) ----
say "rdma transport"
{
  echo
  echo "RDMA transport on the fake device vs TCP on loopback (\`rdma_bench FILE 3\`, best of 3):"
  echo
  "$BUILD/bin/rdma_bench" "${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/first-arrival/data/f0.bin" 3 2>/dev/null
} | tee -a "$OUT/results.md"

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
