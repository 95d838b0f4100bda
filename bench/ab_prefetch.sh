#!/bin/bash
# ab_prefetch.sh [BUILD]: a swarm prefetch A/B, the script behind the small-files tuning figures
# (docs/benchmarks.md, Small files). Each round starts a fresh meta and 3 fresh nodes on
# 127.0.0.2-4 (NODE_ARGS, default --fuse-no-open --readdirplus), adds the dataset, warms the
# origin in the page cache, and times `ember prefetch SET --all --mode full`; it prints the wall
# time, the CPU ticks of meta and each agent over the prefetch (/proc/PID/stat) and the origin
# bytes the nodes read. Not a test.
#   SET=tiny|imagenet   dataset (bench/gen_small.py, made once under $EMBER_BENCH_DIR/small)
#   ROUNDS=2            rounds; each runs every variant in VARIANTS, in turn
#   VARIANTS="A"        A = BUILD's binaries; B = the ember binary at $EMBER_B (its folder is
#                       used as bin/), so "A B" alternates two builds
#   META_HTTP=1         also print meta's gRPC calls by method (ember_meta_rpc_seconds)
#   PERF=S              run `perf ${PERFCMD:-record} ${PERFARGS:--a -g}` for S seconds from the
#                       prefetch's start into /work/scratch/perf.data; PERFPID=b or meta: that
#                       process only
set -euo pipefail
export NODE_ARGS=${NODE_ARGS---fuse-no-open --readdirplus}
. "$(dirname "$0")/common.sh"
bench_init ab_prefetch small "${1:-}"
SET=${SET:-tiny}
DATA=$WORK/$SET
small_dataset "$SET"
trap stop_all EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
B0=$B
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-A}; do
    B=$B0
    [ "$v" = B ] && B=$(dirname "$EMBER_B")
    stop_all
    PORT=$((20000 + RANDOM % 20000))
    [ -n "${META_HTTP:-}" ] && META_ARGS="--http 127.0.0.1:$((PORT + 5))"
    rm -rf "$WORK/meta" "$WORK/a" "$WORK/b" "$WORK/c"
    start_meta
    MP=${PIDS[-1]}
    "$B/ember" dataset add "$SET" "$DATA" > /dev/null
    start_node a 2 12GiB; PA=$NODE_PID
    start_node b 3 12GiB; PB=$NODE_PID
    start_node c 4 12GiB; PC=$NODE_PID
    find "$DATA" -type f -print0 | xargs -0 cat > /dev/null  # origin in the page cache
    c0=("$(ticks $MP)" "$(ticks $PA)" "$(ticks $PB)" "$(ticks $PC)")
    if [ -n "${PERF:-}" ]; then
      target=()
      [ "${PERFPID:-}" = b ] && target=(-p "$PB")
      [ "${PERFPID:-}" = meta ] && target=(-p "$MP")
      # shellcheck disable=SC2086
      perf ${PERFCMD:-record} ${PERFARGS:--a -g} "${target[@]}" -o /work/scratch/perf.data \
        -- sleep "$PERF" > /dev/null 2>&1 &
    fi
    t0=$(now)
    "$B/ember" prefetch "$SET" --all --mode full > "$WORK/prefetch.out" 2>&1
    t=$(secs "$t0" "$(now)")
    c1=("$(ticks $MP)" "$(ticks $PA)" "$(ticks $PB)" "$(ticks $PC)")
    origin=0
    for h in 2 3 4; do
      o=$(curl -s "http://127.0.0.$h:$((PORT + 2))/metrics" |
        awk '$1 == "ember_read_bytes_total{source=\"origin\"}" { print $2 }')
      origin=$(awk -v a="$origin" -v b="${o:-0}" 'BEGIN { printf "%.0f", a + b }')
    done
    if [ -n "${META_HTTP:-}" ]; then
      curl -s "http://127.0.0.1:$((PORT + 5))/metrics" |
        grep 'ember_meta_rpc_seconds_\(sum\|count\)' | grep -v Watch | sort -k2 -g | tail -16
    fi
    echo "round $r $v: ${t} s; CPU ticks meta $((c1[0] - c0[0])) a $((c1[1] - c0[1]))" \
      "b $((c1[2] - c0[2])) c $((c1[3] - c0[3])); origin bytes $origin"
  done
done
