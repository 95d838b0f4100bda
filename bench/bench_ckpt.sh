#!/bin/bash
# bench_ckpt.sh BUILD [--json]: checkpoints (#23) shaped like MLPerf Storage's checkpointing case,
# end to end through the mounts of three node processes, beside the machine's ceilings measured in
# the same run. Not a test. Part of `make bench` (bench.sh). RANKS (default 4) shards of SHARD_MIB
# (default 512) MiB each, from a random source in the page cache:
#   save      RANKS writers at once, each `dd bs=1M conv=fsync` into /MOUNT/ckpt/step/rankN.pt on
#             node a (a volume with --replicas 1), then the directory renamed: wall time until the
#             last writer's close returned (the data is committed: synced, checksummed, in meta);
#   save x2   the same into a volume with --replicas 2 (node b or c copies every shard from
#             node a, checks and syncs it, before each close returns); each case starts once
#             the last one's write-back to the origin is done;
#   local     the same writers into a directory of this disk (the ceiling: what the writers get
#             with no Ember; the origin directory is on this disk too, so writing straight to the
#             origin is the same figure); "local x2": the same bytes written twice at once (two
#             directories), what two copies cost on this one disk;
#   restore   node b (empty cache), page cache dropped on the machine: RANKS readers read every
#             shard at once (read from node a over the peer transport into memory as they
#             read, each block checked, no copy kept on node b: VolumeStream);
#   ceilings  raw TCP over loopback (peer_bench), the shards read from this disk (RANKS readers:
#             `cat` with the page cache dropped, and O_DIRECT 4 MiB reads, two readers per shard
#             (each half: a holder serving 4 restoring readers has 8 requests in flight, and this
#             virtual disk reads faster with more), and the same O_DIRECT readers of node a's
#             own copies (the very bytes a restore reads: the host caches this virtual disk,
#             and a ceiling read from other files came out below what the restore got);
#             "disk read" is the fastest of the three in each round (on this VM a buffered
#             reader's first touch of each new page-cache page costs an exit),
#             RANKS O_DIRECT writers of the same bytes, and the
#             least work a restore does with no Ember (restore_floor: RANKS shards sent from disk
#             over TCP, each block checked and copied to a reader's buffer; or stored and read
#             back, what a restore keeping its copy would do).
# The save cases and their ceilings ("local", "local x2"), and the restore with disk read and raw
# TCP, alternate ROUNDS times (default 3), each figure the median of its rounds (every round's
# figure printed too): this VM moves 10-50% between minutes.
# Writes a markdown table to stdout and one JSON object per figure to $BUILD/bench/ckpt.json.
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_init bench_ckpt ckpt "${1:-}" "${2:-}"
RANKS=${RANKS:-4}
SHARD_MIB=${SHARD_MIB:-512}
BYTES=$((RANKS * SHARD_MIB << 20))
trap stop_all EXIT
PORT=$((20000 + RANDOM % 20000))
: > "$OUT/ckpt.json"

stop_all
rm -rf "$WORK/a" "$WORK/b" "$WORK/c" "$WORK/meta" "$WORK/upload" "$WORK/local" "$WORK/local2"
mkdir -p "$WORK/upload" "$WORK/upload2" "$WORK/local" "$WORK/local2"
[ -f "$WORK/src" ] || "$B/read_bench" gen "$WORK/src" $((SHARD_MIB << 20)) 11 > /dev/null

start_meta
"$B/ember" volume add ckpt "$WORK/upload" > /dev/null
"$B/ember" volume add ckpt2 "$WORK/upload2" --replicas 2 > /dev/null
start_node a 2 16GiB
start_node b 3 16GiB
start_node c 4 16GiB

mibs() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1048576 / s }'; }
writers() {  # DIR...: RANKS dd writers of the source into each DIR/rankN.pt with fsync; seconds
  local t0 w=() d
  # Every case from the same memory: this VM's host takes back guest pages untouched for a
  # while, and the next write into new page-cache pages pays for each (3-4x the CPU per byte
  # measured with perf); without this the first case (the ceiling) gets fresh pages and later
  # ones pay. Dropped caches leave recently touched pages free for whichever case runs.
  sync
  drop_caches
  cat "$WORK/src" > /dev/null
  t0=$(now)
  for d in "$@"; do
    for i in $(seq 0 $((RANKS - 1))); do
      dd if="$WORK/src" of="$d/rank$i.pt" bs=1M conv=fsync status=none &
      w+=($!)
    done
  done
  wait "${w[@]}"
  secs "$t0" "$(now)"
}
readers() {  # cat|direct FILE...: a reader per FILE (two for direct, a half each), all at once;
  local t0 w=() f mode=$1  # prints seconds
  shift
  t0=$(now)
  for f in "$@"; do
    if [ "$mode" = direct ]; then
      dd if="$f" of=/dev/null bs=4M iflag=direct count=$((SHARD_MIB / 8)) status=none &
      w+=($!)
      dd if="$f" of=/dev/null bs=4M iflag=direct skip=$((SHARD_MIB / 8)) status=none &
    else
      cat "$f" > /dev/null &
    fi
    w+=($!)
  done
  wait "${w[@]}"
  secs "$t0" "$(now)"
}

# A save's time: its writers' (from their first write to the last close; `writers` leaves out the
# sync, drop and source read it starts with, for Ember as for the ceilings) plus the rename.
renamed() {  # WRITERS-SECONDS FROM TO: renames FROM to TO; prints the sum of both times
  local t0
  t0=$(now)
  mv "$2" "$3"
  awk -v w="$1" -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", w + b - a }'
}
# Each case from a quiet machine, as the ceilings are: the last case's write-back finished.
uploaded() {  # VOLUME: waits (up to 120 s) until every file of VOLUME is in the origin
  local i
  for i in $(seq 1 240); do
    "$B/ember" volume status "$1" --json | grep -q '"local"\|"replicated"' || return 0
    sleep 0.5
  done
  say "$1: uploads did not finish in 120 s"
  return 1
}
median() { tr ' ' '\n' <<< "$*" | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# The save cases and their ceilings alternate, ROUNDS times (this VM's disk and host move 10-50%
# between minutes): each figure is the median of its rounds; every round's figure is printed.
ROUNDS=${ROUNDS:-3}
L=() L2=() S=() SW=() S2=()
for r in $(seq 1 "$ROUNDS"); do
  say "round $r of $ROUNDS: local disk: $RANKS writers of $SHARD_MIB MiB with fsync"
  sync
  L+=("$(writers "$WORK/local")")
  say "round $r: local disk: the same bytes twice at once (two copies on this disk)"
  rm -f "$WORK"/local/*
  sync
  L2+=("$(writers "$WORK/local" "$WORK/local2")")
  rm -f "$WORK"/local2/*
  say "round $r: Ember save through node a"
  step=step; [ "$r" = 1 ] || step=step_r$r  # round 1's is the one restored
  mkdir "$WORK/a/mnt/ckpt/$step.tmp"
  sync
  SW+=("$(writers "$WORK/a/mnt/ckpt/$step.tmp")")
  S+=("$(renamed "${SW[-1]}" "$WORK/a/mnt/ckpt/$step.tmp" "$WORK/a/mnt/ckpt/$step")")
  uploaded ckpt
  if [ "$r" = 1 ]; then
    # Node a's own copies of the shards restored below (its cache files of volume 1, all that
    # volume holds yet): what the restore reads, from where it reads it.
    mapfile -t HELD < <(find "$WORK/a/cache/volumes/1" -type f -size "$((SHARD_MIB << 20))c")
    [ "${#HELD[@]}" = "$RANKS" ] || { say "node a holds ${#HELD[@]} shards, not $RANKS"; exit 1; }
  fi
  say "round $r: Ember save through node a, --replicas 2"
  mkdir "$WORK/a/mnt/ckpt2/step.tmp"
  sync
  S2+=("$(renamed "$(writers "$WORK/a/mnt/ckpt2/step.tmp")" "$WORK/a/mnt/ckpt2/step.tmp" \
    "$WORK/a/mnt/ckpt2/step")")
  "$B/ember" volume status ckpt2 --json | grep -c '"replicated"' | grep -qx "$RANKS" ||
    { say "--replicas 2: not every shard is replicated"; exit 1; }
  uploaded ckpt2
  rm -r "$WORK/a/mnt/ckpt2/step"  # room for the next round (its origin copies deleted too)
  [ "$r" = 1 ] || rm -r "$WORK/a/mnt/ckpt/$step"
done
LOCAL=$(median "${L[@]}") LOCAL2=$(median "${L2[@]}") SAVE=$(median "${S[@]}")
SAVE_W=$(median "${SW[@]}") SAVE2=$(median "${S2[@]}")
rounds() { local x out=(); for x in "$@"; do out+=("$(mibs $BYTES "$x")"); done; echo "${out[*]}"; }
# The restore and its ceilings alternate ROUNDS times as well (node b keeps no copy: each round
# is a restore on a node that has nothing).
R=() DR=() DB=() DD=() DH=() T=()
for r in $(seq 1 "$ROUNDS"); do
  say "round $r of $ROUNDS: restore on node b (page cache dropped)"
  drop_caches
  "$B/restore_floor" --touch $((3 * BYTES >> 20))  # as each of restore_floor's passes starts
  R+=("$(readers cat "$WORK"/b/mnt/ckpt/step/rank*.pt)")
  if [ "$r" = 1 ]; then
    for i in $(seq 0 $((RANKS - 1))); do
      cmp -s "$WORK/src" "$WORK/b/mnt/ckpt/step/rank$i.pt" || { say "rank$i restored wrong"; exit 1; }
    done
  fi
  say "round $r: disk read and raw TCP"
  drop_caches
  DB+=("$(readers cat "$WORK"/local/rank*.pt)")
  drop_caches
  DD+=("$(readers direct "$WORK"/local/rank*.pt)")
  drop_caches
  DH+=("$(readers direct "${HELD[@]}")")
  DR+=("$(printf '%s\n' "${DB[-1]}" "${DD[-1]}" "${DH[-1]}" | sort -g | head -1)")  # seconds
  T+=("$("$B/peer_bench" "$WORK/src" 1 1 2>/dev/null |
    awk -F'|' '/raw TCP/ { sub(/.*: /, "", $4); print $4 + 0; exit }')")
done
RESTORE=$(median "${R[@]}") DISK_READ=$(median "${DR[@]}") TCP=$(median "${T[@]}")
say "ceilings"
drop_caches
t0=$(now)
w=()
for i in $(seq 0 $((RANKS - 1))); do
  dd if="$WORK/src" of="$WORK/local/direct$i" bs=4M oflag=direct status=none &
  w+=($!)
done
wait "${w[@]}"
DIRECT=$(secs "$t0" "$(now)")
rm -f "$WORK"/local/direct*
# The least work a restore does, with no Ember: each shard sent from disk over loopback TCP,
# received, checked and handed to a reader's buffer (a restore that keeps no copy, as Ember's
# does), or stored and read back, RANKS streams at once (restore_floor.cc).
FLOOR=$("$B/restore_floor" "$WORK/local" "$WORK"/local/rank*.pt)
FLOOR_TCP=$(awk '$1 == "tcp" { print $2 }' <<< "$FLOOR")
FLOOR_STREAM=$(awk '$1 == "stream" { print $2 }' <<< "$FLOOR")
FLOOR_STORE=$(awk '$1 == "store" { print $2 }' <<< "$FLOOR")
FLOOR_READ=$(awk '$1 == "read" { print $2 }' <<< "$FLOOR")

CEIL_RESTORE=$(awk -v t="$TCP" -v d="$(mibs $BYTES "$DISK_READ")" 'BEGIN { print (t < d ? t : d) }')
row() {  # KEY LABEL VALUE CEILING-LABEL CEILING
  local ratio
  ratio=$(awk -v a="$3" -v b="$5" 'BEGIN { printf "%.2f", a / b }')
  echo "| $2 | $3 MiB/s | $4 | $5 MiB/s | ${ratio}x |"
  echo "{\"case\":\"$1\",\"mib_s\":$3,\"ceiling_mib_s\":$5,\"ratio\":$ratio}" >> "$OUT/ckpt.json"
}
echo "Checkpoint: $RANKS ranks x $SHARD_MIB MiB, each the median of $ROUNDS alternating rounds but the floor ($(date -u +%F))"
echo
echo "| case | Ember | ceiling | ceiling figure | ratio |"
echo "| --- | --- | --- | --- | --- |"
row save "save, --replicas 1 (writers' close, then rename)" "$(mibs $BYTES "$SAVE")" \
  "local disk, same writers with fsync" "$(mibs $BYTES "$LOCAL")"
row save2 "save, --replicas 2" "$(mibs $BYTES "$SAVE2")" \
  "local disk, same writers with fsync" "$(mibs $BYTES "$LOCAL")"
row save2-two "save, --replicas 2, against two copies" "$(mibs $BYTES "$SAVE2")" \
  "local disk, the bytes twice at once" "$(mibs $BYTES "$LOCAL2")"
row save-direct "save against O_DIRECT writers" "$(mibs $BYTES "$SAVE")" \
  "$RANKS O_DIRECT writers" "$(mibs $BYTES "$DIRECT")"
row restore "restore on a fresh node, $RANKS readers" "$(mibs $BYTES "$RESTORE")" \
  "min(raw TCP, disk read)" "$CEIL_RESTORE"
row restore-floor "restore, against the same work with no Ember" "$(mibs $BYTES "$RESTORE")" \
  "TCP from disk, check, copy to a reader" "$FLOOR_STREAM"
echo
echo "Same run: local disk with fsync $(mibs $BYTES "$LOCAL") MiB/s (twice at once: $(mibs $BYTES "$LOCAL2") MiB/s of each copy), O_DIRECT $(mibs $BYTES "$DIRECT") MiB/s, disk read $(mibs $BYTES "$DISK_READ") MiB/s (the fastest of cat, rounds $(rounds "${DB[@]}"), O_DIRECT, rounds $(rounds "${DD[@]}"), and O_DIRECT of node a's copies, rounds $(rounds "${DH[@]}")), raw TCP $TCP MiB/s (from disk, $RANKS streams: $FLOOR_TCP; with each block checked and copied to a reader: $FLOOR_STREAM; checked and stored: $FLOOR_STORE, and read back: $FLOOR_READ); Ember's writers alone $(mibs $BYTES "$SAVE_W") MiB/s. Each round (MiB/s): local $(rounds "${L[@]}"); twice at once $(rounds "${L2[@]}"); save $(rounds "${S[@]}"); save --replicas 2 $(rounds "${S2[@]}"); restore $(rounds "${R[@]}"); disk read $(rounds "${DR[@]}"); raw TCP ${T[*]}."
