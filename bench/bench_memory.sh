#!/bin/bash
# bench_memory.sh BUILD: memory of a node agent holding a 1,000,000-block cache index, and what
# meta spends per block location. Called by bench/bench_suite.sh; prints a Markdown paragraph.
#
# A dataset of 1,000 sparse files of 1,000 blocks (64 KiB blocks) is added to a real meta;
# bench/index_bench writes a cache index with every block resident; then a real
# `ember node` starts on it (it loads the index and reports every block to meta). RSS is read
# from /proc after the report, against a node with an empty cache and meta before the report.
set -euo pipefail
BUILD=$(realpath "${1:-build}")
EMBER=$BUILD/bin/ember
W=$(mktemp -d /var/tmp/ember-mem.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; fusermount -u "$W/mnt" 2>/dev/null || true; rm -rf "$W"' EXIT

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
wait_log() {
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "bench_memory: timed out waiting for '$2' in $1" >&2
  cat "$1" >&2
  return 1
}

mkdir -p "$W/origin" "$W/mnt"
for d in $(seq -w 0 9); do
  mkdir -p "$W/origin/d$d"
  for f in $(seq -w 0 99); do truncate -s $((1000 * 65536)) "$W/origin/d$d/f$f.bin"; done
done
PORT=$((20000 + RANDOM % 20000))
"$EMBER" meta --listen "127.0.0.1:$PORT" --data-dir "$W/meta" --lease 60s > "$W/meta.log" 2>&1 &
META=$!
PIDS+=("$META")
wait_log "$W/meta.log" "serving on"
export EMBER_META=127.0.0.1:$PORT
"$EMBER" dataset add mem "$W/origin" --block-size 64KiB > /dev/null

node() {  # ID CACHE_DIR
  "$EMBER" node --listen "127.0.0.1:$((PORT + 1))" --cache-dir "$2" --cache-size 100GiB \
    --mount "$W/mnt" --node-id "$1" > "$W/node-$1.log" 2>&1 &
  NODE=$!
  PIDS+=("$NODE")
  wait_log "$W/node-$1.log" "serving datasets at"
  wait_log "$W/node-$1.log" "registered with meta"
  sleep 3  # the full block report and a heartbeat
}
stop_node() { kill "$NODE"; wait "$NODE" 2>/dev/null || true; }

# Baseline: the same node with an empty cache.
node empty "$W/cache-empty"
empty_rss=$(rss_kib "$NODE")
stop_node
meta_rss0=$(rss_kib "$META")
meta_disk0=$(du -sk "$W/meta" | cut -f1)

blocks=$("$BUILD/bin/index_bench" "$EMBER_META" mem "$W/cache")
node full "$W/cache"
full_rss=$(rss_kib "$NODE")
resident=$("$EMBER" status --json | sed -n 's/.*"resident_blocks": \([0-9]*\).*/\1/p' | sort -n | tail -1)
meta_rss1=$(rss_kib "$META")
meta_disk1=$(du -sk "$W/meta" | cut -f1)
stop_node

awk -v b="$blocks" -v r="$resident" -v e="$empty_rss" -v f="$full_rss" -v m0="$meta_rss0" \
  -v m1="$meta_rss1" -v d0="$meta_disk0" -v d1="$meta_disk1" 'BEGIN {
  printf "Memory: agent RSS with a %d-block cache index (%d reported resident): %.1f MB; with an empty cache %.1f MB; %.0f bytes per block. Meta after the node reported them: RSS +%.1f MB (%.1f bytes per block location), data dir +%.1f MB (%.1f bytes per location on disk).\n",
    b, r, f * 1024 / 1e6, e * 1024 / 1e6, (f - e) * 1024 / b, (m1 - m0) * 1024 / 1e6, (m1 - m0) * 1024 / b,
    (d1 - d0) * 1024 / 1e6, (d1 - d0) * 1024 / b }'
