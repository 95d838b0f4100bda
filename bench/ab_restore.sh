#!/bin/bash
# A/B of a checkpoint restore on one cluster: 4 x 512 MiB saved through node a's mount into a
# volume, then restored by 4 readers on node b and on node c in turn, ROUNDS times (page cache
# dropped before each), printing MiB/s and the CPU ticks of the reading node and of node a (the
# holder) per restore. Alternating two nodes of one cluster takes the VM's minute-to-minute drift
# out of a comparison that separate runs of bench_ckpt.sh cannot make. Not part of `make bench`.
#   NODE_B_ARGS / NODE_C_ARGS  extra `ember node` flags of node b / c
#   EMBER_B=PATH               another ember binary for node b (e.g. a build with a change)
#   EMBER_A=PATH               another ember binary for node a, the holder (a change to serving:
#                              compare runs, alternating)
#   READER=CMD                 reads one file to stdout (default cat)
#   ROUNDS=N (4), CHECK=1      compare every restored file with its source at the end
#   HOLD=S                     keep the cluster S seconds at the end (for perf), printing pids
# Usage: bench/ab_restore.sh [BUILD_DIR]
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_init ab_restore ab "${1:-}"
RANKS=4
SHARD_MIB=512
BYTES=$((RANKS * SHARD_MIB << 20))
trap stop_all EXIT
PORT=$((20000 + RANDOM % 20000))
stop_all
rm -rf "$WORK/a" "$WORK/b" "$WORK/c" "$WORK/meta" "$WORK/upload"
mkdir -p "$WORK/upload"
[ -f "$WORK/src" ] || "$B/read_bench" gen "$WORK/src" $((SHARD_MIB << 20)) 11 > /dev/null
start_meta
"$B/ember" volume add ckpt "$WORK/upload" > /dev/null
B0=$B
if [ -n "${EMBER_A:-}" ]; then
  mkdir -p "$WORK/bin_a"
  cp "$EMBER_A" "$WORK/bin_a/ember"
  B=$WORK/bin_a
fi
start_node a 2 16GiB
PA=$NODE_PID
B=$B0
if [ -n "${EMBER_B:-}" ]; then
  mkdir -p "$WORK/bin_b"
  cp "$EMBER_B" "$WORK/bin_b/ember"
  B=$WORK/bin_b
fi
NODE_ARGS="${NODE_B_ARGS:-}" start_node b 3 16GiB
PB=$NODE_PID
B=$B0
NODE_ARGS="${NODE_C_ARGS:-}" start_node c 4 16GiB
PC=$NODE_PID
mkdir -p "$WORK/a/mnt/ckpt/step"
w=()
for i in $(seq 0 $((RANKS - 1))); do
  dd if="$WORK/src" of="$WORK/a/mnt/ckpt/step/rank$i.pt" bs=1M conv=fsync status=none &
  w+=($!)
done
wait "${w[@]}"
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
readers() {  # DIR: RANKS readers at once; prints seconds
  local t0 r=()
  t0=$(now)
  for i in $(seq 0 $((RANKS - 1))); do
    ${READER:-cat} "$1/rank$i.pt" > /dev/null &
    r+=($!)
  done
  wait "${r[@]}"
  secs "$t0" "$(now)"
}
for r in $(seq 1 "${ROUNDS:-4}"); do
  for n in b c; do
    p=$PB
    [ $n = c ] && p=$PC
    drop_caches
    "$B/restore_floor" --touch $((3 * BYTES >> 20))
    ta=$(ticks "$PA")
    tn=$(ticks "$p")
    s=$(readers "$WORK/$n/mnt/ckpt/step")
    echo "round $r node $n: $(awk -v b=$BYTES -v s="$s" 'BEGIN { printf "%.0f", b / 1048576 / s }') MiB/s, CPU ticks: reader node $(($(ticks "$p") - tn)), node a $(($(ticks "$PA") - ta))"
  done
done
if [ "${CHECK:-0}" = 1 ]; then
  for n in b c; do
    for i in $(seq 0 $((RANKS - 1))); do
      cmp -s "$WORK/src" "$WORK/$n/mnt/ckpt/step/rank$i.pt" || { say "node $n: rank$i restored wrong"; exit 1; }
    done
  done
  say "every restored file matches its source"
fi
if [ -n "${HOLD:-}" ]; then
  echo "holding ${HOLD}s: node a $PA, b $PB, c $PC; mounts under $WORK"
  sleep "$HOLD"
fi
