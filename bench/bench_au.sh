#!/bin/bash
# bench_au.sh BUILD [--json]: how many emulated accelerators each way of reading a dataset keeps
# busy (#22; `ember bench au`, tools/au_bench.h), MLPerf-Storage style, side by side in one run:
# the native file system, Ember (cold first epoch and warm), bindfs (a plain FUSE pass-through)
# and `rclone mount --vfs-cache-mode full`, over the same generated datasets (unet3d and
# resnet50, SIZE each, default 6GiB, made once under $EMBER_BENCH_DIR/au).
#  warm: `ember bench au --find-max` (doubling, then bisecting the accelerator count), after one
#        epoch has read everything through that system; and, finer than that count, the
#        accelerators fed (count x AU / threshold) in an epoch of one more than native held;
#        Ember twice: the default mount (passthrough of resident files) and --fuse-no-open;
#  cold: the first epoch through a fresh Ember cache (page cache dropped) with as many
#        accelerators as native warm held, against native with its page cache dropped; the
#        accelerators it fed = count x AU / threshold (at most the count); beside them the
#        machine's ceiling for reading and storing the same files (4 dd streams, O_DIRECT).
# This machine's data fits in RAM many times over (MLPerf wants 5x RAM): warm native reads come
# from the page cache, and so does everything Ember serves from its cache files.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_init bench_au au "$@"
SIZE=${SIZE:-6GiB}
WORKLOADS=${WORKLOADS:-"unet3d resnet50"}
ACC=${ACC:-h100}
for tool in rclone bindfs; do
  command -v $tool > /dev/null || { echo "bench_au: needs $tool (apt-get install $tool)" >&2; exit 1; }
done
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
  stop_all
  for m in "$MNT"/*; do mountpoint -q "$m" 2> /dev/null && fusermount -u "$m" 2> /dev/null || true; done
}
trap cleanup EXIT
ROWS=()
row() { ROWS+=("$1|$2|$3|$4"); }  # workload, system, accelerators, note

findmax() {  # WORKLOAD DIR: prints the most accelerators that held the threshold
  "$B/ember" bench au --dir "$2" --workload "$1" --accelerator "$ACC" --find-max --json 2> /dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["max_accelerators"])'
}
fed() {  # WORKLOAD DIR N: accelerators fed in one epoch of N (N x AU / threshold, at most N)
  "$B/ember" bench au --dir "$2" --workload "$1" --accelerator "$ACC" --accelerators "$3" --json 2> /dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); n=r["accelerators"]; print("%.1f|%.1f|%.0f" % (min(n, n*r["au"]/r["threshold"]), 100*r["au"], r["bytes_per_second"]/1e6))'
}
# The machine's ceiling for a first epoch that stores what it reads: 4 streams, each reading a
# dataset file and writing it with O_DIRECT elsewhere on this disk (dd), page cache dropped.
store_ceiling() {  # DIR: prints MB/s
  local files i=0 pids=() t0 t1 bytes
  files=$(ls "$1" | head -4)
  drop_caches
  t0=$(now)
  for f in $files; do
    dd if="$1/$f" of="$WORK/ceiling.$i" bs=4M oflag=direct status=none & pids+=($!)
    i=$((i + 1))
  done
  wait "${pids[@]}"
  t1=$(now)
  bytes=$(cd "$1" && du -cb $files | tail -1 | cut -f1)
  rm -f "$WORK"/ceiling.*
  awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN { printf "%.0f", b / (c - a) / 1e6 }'
}
readall() { find "$1" -type f -exec cat {} + > /dev/null; }

PORT=$((20000 + RANDOM % 20000))
for w in $WORKLOADS; do
  DATA=$WORK/data/$w
  if [ ! -f "$DATA.done" ]; then
    say "generating $w ($SIZE)"
    rm -rf "$DATA"
    "$B/ember" bench au generate --dir "$DATA" --workload "$w" --size "$SIZE" 2> /dev/null
    touch "$DATA.done"
  fi
  # native
  readall "$DATA/train"
  say "$w: native, warm"
  native=$(findmax "$w" "$DATA")
  n=$((native > 0 ? native : 1))
  over=$((n + 1))  # the warm rows' second figure: accelerators fed when one more than native's ask
  IFS='|' read -r f a _ < <(fed "$w" "$DATA" "$over")
  row "$w" "native (page cache warm)" "$native" "fed $f of $over (AU $a%)"
  drop_caches
  IFS='|' read -r nf nau nmb < <(fed "$w" "$DATA" "$n")
  row "$w" "native, first epoch from disk" "$nf" "$n accelerators at AU $nau%, $nmb MB/s"
  row "$w" "ceiling: read and store, 4 streams (dd oflag=direct)" "" "$(store_ceiling "$DATA/train") MB/s"

  # Ember: meta and one node, the dataset added; a fresh cache for the cold epoch.
  rm -rf "$WORK/meta" "$WORK/a"
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
  PIDS+=($!)
  wait_for_log "$WORK/meta.log" "serving on" $!
  export EMBER_META=127.0.0.1:$PORT
  "$B/ember" dataset add "$w" "$DATA" > /dev/null
  start_node a 2 32GiB
  drop_caches
  say "$w: Ember, first epoch"
  IFS='|' read -r ef eau emb < <(fed "$w" "$WORK/a/mnt/$w" "$n")
  row "$w" "Ember, first epoch (cold cache)" "$ef" "$n accelerators at AU $eau%, $emb MB/s"
  say "$w: Ember, warm"
  readall "$WORK/a/mnt/$w/train"
  ember=$(findmax "$w" "$WORK/a/mnt/$w")
  IFS='|' read -r f a _ < <(fed "$w" "$WORK/a/mnt/$w" "$over")
  row "$w" "Ember (warm)" "$ember" "fed $f of $over (AU $a%)"
  # The same cache, the node restarted with --fuse-no-open: no OPEN round trip per open (a
  # record loader opens each file ~10 times per batch), warm reads from the mount's page cache
  # (no passthrough: reads the page cache lost go through the agent).
  say "$w: Ember, warm, --fuse-no-open"
  kill "$NODE_PID"; wait "$NODE_PID" 2> /dev/null || true
  NODE_ARGS="${NODE_ARGS:-} --fuse-no-open" start_node a 2 32GiB
  readall "$WORK/a/mnt/$w/train"
  ember=$(findmax "$w" "$WORK/a/mnt/$w")
  IFS='|' read -r f a _ < <(fed "$w" "$WORK/a/mnt/$w" "$over")
  row "$w" "Ember --fuse-no-open (warm)" "$ember" "fed $f of $over (AU $a%)"
  stop_all
  unset EMBER_META

  say "$w: bindfs"
  mkdir -p "$MNT/bindfs"
  bindfs -o ro "$DATA" "$MNT/bindfs"
  readall "$DATA/train"
  m=$(findmax "$w" "$MNT/bindfs")
  IFS='|' read -r f a _ < <(fed "$w" "$MNT/bindfs" "$over")
  row "$w" "bindfs (warm)" "$m" "fed $f of $over (AU $a%)"
  fusermount -u "$MNT/bindfs"

  say "$w: rclone"
  mkdir -p "$MNT/rclone"
  rm -rf "$WORK/rclone-cache"
  rclone mount "$DATA" "$MNT/rclone" --vfs-cache-mode full --cache-dir "$WORK/rclone-cache" \
    --read-only --daemon --log-file "$WORK/rclone.log" 2> /dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT/rclone" && break; sleep 0.1; done
  readall "$MNT/rclone/train"
  m=$(findmax "$w" "$MNT/rclone")
  IFS='|' read -r f a _ < <(fed "$w" "$MNT/rclone" "$over")
  row "$w" "rclone vfs-full (warm)" "$m" "fed $f of $over (AU $a%)"
  fusermount -u "$MNT/rclone"
  rm -rf "$WORK/rclone-cache"
  PORT=$((PORT + 10))
done

if [ "$JSON" = 1 ]; then
  printf '%s\n' "${ROWS[@]}" | python3 -c 'import json,sys
print(json.dumps([dict(zip(["workload","system","accelerators","note"], l.rstrip("\n").split("|"))) for l in sys.stdin], indent=1))'
else
  {
    echo "| workload | system | $ACC accelerators kept at AU threshold | note |"
    echo "| --- | --- | --- | --- |"
    for r in "${ROWS[@]}"; do echo "| ${r//|/ | } |"; done
  } | tee "$OUT/au.md"
fi
