#!/bin/bash
# bench_suite.sh BUILD: Ember side by side with the native file system, bindfs (a plain FUSE
# pass-through) and `rclone mount --vfs-cache-mode full` (a caching FUSE file system), all over
# the same origin directory, in one run. Called by `make bench` (bench/bench.sh); writes
# BUILD/bench/suite.md and the generated part of docs/benchmarks.md.
#
# Data (generated once under $EMBER_BENCH_DIR/suite/data, default /var/tmp/ember-bench):
#   large/large.bin        4 GiB
#   images/dNNNN/fNNNNN.jpg 10,000 files of 112 KiB in 100 folders (an image dataset)
#   shards/shard-0000N.tar 8 x 512 MiB (WebDataset-style)
#   tree/dNNNN/fNNNNN.jpg  100,000 files of 1 KiB in 100 folders (metadata case)
#
# Warm cases measure the daemon, not the kernel's cache of the mount: fio invalidates the file's
# page cache of the mount before each job (--invalidate=1), read_bench drops it per file, while
# the backing data (origin, Ember's cache files, rclone's cache files) stays warm in RAM. The
# native file system is read warm (the physical limit). Last, the read stall while the agent is
# replaced 5 times under readers (ember node --takeover). Two rows measure the machine's ceiling
# for a case rather than a system: cold cases also run "read and store" (read_bench store: the
# same reads, each 4 MiB stored as a new file with O_DIRECT on the same disk, no FUSE: what a
# cache fill costs when origin and cache share one disk), and stat runs once more with the
# reader and the agent pinned to one CPU (a FUSE round trip without cross-CPU wakeups).
# Every case runs RUNS times (default 5)
# with the systems interleaved (the order rotates each run); medians, min-max spread, ratios.
set -euo pipefail
BUILD=$(realpath "${1:-build}")
EMBER=$BUILD/bin/ember
RB=$BUILD/bin/read_bench
WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/suite
DATA=$WORK/data
RUNS=${RUNS:-5}
OUT=$BUILD/bench/suite
MNT=$WORK/mnt
# ember: the default agent (kernel binding, passthrough of resident files); ember-daemon: the same
# agent and cache with --no-passthrough, every read through the agent. One cache serves both (RAM
# holds the origin, one Ember cache and rclone's): the suite switches between them with
# `ember node --takeover [--no-passthrough]`, which keeps the mount.
SYSTEMS=(native ember ember-daemon bindfs rclone)
mkdir -p "$OUT" "$DATA"
: > "$OUT/raw.txt"
START=$(date +%s)

say() { echo "bench: [$(($(date +%s) - START))s] $*" >&2; }
for tool in fio rclone bindfs; do
  command -v $tool > /dev/null || { echo "bench: $tool is missing (make deps installs it)" >&2; exit 1; }
done

# ---- data (once) ----
if [ ! -f "$DATA/.done" ]; then
  say "generating 4 GiB + 8 x 512 MiB + 10,000 x 112 KiB + 100,000 x 1 KiB under $DATA (once)"
  rm -rf "${DATA:?}"/*
  mkdir -p "$DATA/large" "$DATA/shards"
  "$RB" gen "$DATA/large/large.bin" $((4 << 30)) 4
  for i in 0 1 2 3 4 5 6 7; do "$RB" gen "$DATA/shards/shard-0000$i.tar" $((512 << 20)) "50$i"; done
  "$RB" tree "$DATA/images" 100 100 114688
  "$RB" tree "$DATA/tree" 100 1000 1024
  touch "$DATA/.done"
fi
rm -f "$OUT"/images.* "$OUT"/tree.*  # path lists per system, made again by list_for
find "$DATA/images" -type f | sort > "$OUT/images.native"
find "$DATA/tree" -type f | sort > "$OUT/tree.native"

# ---- helpers ----
root_of() {  # SYS -> directory that shows the origin's top-level folders
  case $1 in native) echo "$DATA" ;; ember-daemon) echo "$MNT/ember" ;; *) echo "$MNT/$1" ;; esac
}
list_for() {  # SYS NAME -> a list file of NAME's paths as SYS shows them
  local f=$OUT/$2.$1
  [ -f "$f" ] || sed "s|^$DATA|$(root_of "$1")|" "$OUT/$2.native" > "$f"
  echo "$f"
}
record() { echo "$1 $2 $3" >> "$OUT/raw.txt"; }  # CASE SYS VALUE
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}'; }

PIDS=()
cleanup() {
  for m in "$MNT/bindfs" "$MNT/rclone"; do mountpoint -q "$m" 2>/dev/null && fusermount -u "$m" 2>/dev/null || true; done
  [ ${#PIDS[@]} -gt 0 ] && { kill "${PIDS[@]}" 2>/dev/null || true; }
  wait 2>/dev/null || true
}
trap cleanup EXIT

# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"

# The warm Ember: a meta and a node (so the node can be replaced by takeover).
NODE_CMD=()
NODE_MODE=passthrough
TAKEOVERS=0
start_warm_ember() {
  local port=$((20000 + RANDOM % 20000)) state=$WORK/ember-warm
  rm -rf "$state"; mkdir -p "$MNT/ember"
  "$EMBER" meta --listen "127.0.0.1:$port" --data-dir "$state/meta" > "$OUT/ember-meta.log" 2>&1 &
  PIDS+=("$!")
  wait_for_log "$OUT/ember-meta.log" "serving on" "$!"
  export EMBER_META=127.0.0.1:$port
  for d in large images tree; do "$EMBER" dataset add "$d" "$DATA/$d" > /dev/null; done
  NODE_CMD=("$EMBER" node --listen "127.0.0.1:$((port + 1))" --cache-dir "$state/cache"
    --cache-size 16GiB --mount "$MNT/ember" --node-id bench)
  "${NODE_CMD[@]}" > "$OUT/ember-node-0.log" 2>&1 &
  PIDS+=("$!")
  wait_for_log "$OUT/ember-node-0.log" "serving datasets at" "$!"
}
ember_mode() {  # passthrough|daemon: replace the node by takeover if it serves the other way
  [ "$NODE_MODE" = "$1" ] && return 0
  TAKEOVERS=$((TAKEOVERS + 1))
  local extra=()
  [ "$1" = daemon ] && extra=(--no-passthrough)
  "${NODE_CMD[@]}" --takeover "${extra[@]}" > "$OUT/ember-node-$TAKEOVERS.log" 2>&1 &
  PIDS+=("$!")
  wait_for_log "$OUT/ember-node-$TAKEOVERS.log" "took over" "$!"
  # Let the successor settle before measuring: manifests loaded, registered, block report sent
  # (and the predecessor gone), so its start-up work is not counted in a case.
  ls "$MNT/ember/large" "$MNT/ember/images/d0000" "$MNT/ember/tree/d0000" > /dev/null
  wait_for_log "$OUT/ember-node-$TAKEOVERS.log" "registered with meta" "$!"
  sleep 1
  NODE_MODE=$1
}

declare -A EMBER_PIDS
start_ember() {  # NAME STATE EXTRA-ARGS DATASET... ; `ember up` on MNT/NAME with a fresh state dir
  local name=$1 state=$2 extra=$3; shift 3
  local args=()
  for d in "$@"; do args+=(--dataset "$d=$DATA/$d"); done
  rm -rf "$state"; mkdir -p "$MNT/$name"
  local port=$((20000 + RANDOM % 20000))
  # shellcheck disable=SC2086
  "$EMBER" up --mount "$MNT/$name" --data-dir "$state" --listen "127.0.0.1:$port" \
    --node-listen "127.0.0.1:$((port + 1))" --cache-size 16GiB $extra "${args[@]}" > "$OUT/$name.log" 2>&1 &
  EMBER_PIDS[$name]=$!
  PIDS+=("$!")
  wait_for_log "$OUT/$name.log" "serving datasets at" "$!"
  [ "$name" = ember ] && export EMBER_META=127.0.0.1:$port
  return 0
}
stop_ember() {  # NAME
  kill "${EMBER_PIDS[$1]}" 2>/dev/null || true
  wait "${EMBER_PIDS[$1]}" 2>/dev/null || true
  mountpoint -q "$MNT/$1" && fusermount -u "$MNT/$1" 2>/dev/null || true
}
start_rclone() {  # fresh cache
  mkdir -p "$MNT/rclone"
  rm -rf "$WORK/rclone-cache"
  rclone mount "$DATA" "$MNT/rclone" --vfs-cache-mode full --cache-dir "$WORK/rclone-cache" \
    --read-only --daemon --log-file "$OUT/rclone.log" 2> /dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT/rclone" && return 0; sleep 0.1; done
  echo "bench: rclone mount did not come up" >&2
  return 1
}
stop_rclone() { fusermount -u "$MNT/rclone" 2>/dev/null || true; sleep 0.5; }
start_bindfs() { mkdir -p "$MNT/bindfs"; bindfs -o ro "$DATA" "$MNT/bindfs"; }

# fio, one group: prints MiB/s (bw) or IOPS. Native is read warm (no invalidation). FIO-ARGS
# are options for every job, then jobs (--name=...); one job named "job" if they name none.
fio_case() {  # SYS KIND(bw|iops) FIO-ARGS...
  local sys=$1 kind=$2; shift 2
  local inv=1 job=(--name=job)
  [ "$sys" = native ] && inv=0
  case " $* " in *" --name="*) job=() ;; esac
  fio --output-format=terse --terse-version=3 --group_reporting --ioengine=psync \
    --invalidate=$inv "$@" "${job[@]}" 2> "$OUT/fio.err" |
    awk -F';' -v k="$kind" '{ if (k == "bw") printf "%.1f\n", $7 / 1024; else printf "%.0f\n", $8 }'
}
run_case() {  # CASE SYS
  local c=$1 sys=$2 r
  case $sys in ember) ember_mode passthrough ;; ember-daemon) ember_mode daemon ;; esac
  r=$(root_of "$sys")
  local big=$r/large/large.bin
  case $c in
    seq1) v=$(fio_case "$sys" bw --filename="$big" --rw=read --bs=1M) ;;
    seq2) v=$(fio_case "$sys" bw --filename="$big" --rw=read --bs=1M --numjobs=2 --size=2g --offset_increment=2g) ;;
    rand4k1) v=$(fio_case "$sys" iops --filename="$big" --rw=randread --bs=4k --runtime=3 --time_based) ;;
    rand4k2) v=$(fio_case "$sys" iops --filename="$big" --rw=randread --bs=4k --runtime=3 --time_based --numjobs=2) ;;
    rand128k1) v=$(fio_case "$sys" bw --filename="$big" --rw=randread --bs=128k --runtime=3 --time_based) ;;
    rand128k2) v=$(fio_case "$sys" bw --filename="$big" --rw=randread --bs=128k --runtime=3 --time_based --numjobs=2) ;;
    small1)
      local mode=drop
      [ "$sys" = native ] && mode=keep
      v=$("$RB" small "$(list_for "$sys" images)" 4 "$RANDOM" $mode) ;;
    small2) v=$("$RB" small "$(list_for "$sys" images)" 4 "$RANDOM" keep) ;;
    find)
      sync; echo 2 > /proc/sys/vm/drop_caches  # dentries and inodes of every file system
      local t0; t0=$(now); n=$(find "$r/tree" -type f | wc -l); t=$(elapsed "$t0")
      [ "$n" -eq 100000 ] || { echo "bench: find saw $n files on $sys" >&2; return 1; }
      v=$(awk -v t="$t" 'BEGIN {printf "%.0f", 100000 / t}') ;;
    stat)
      sync; echo 2 > /proc/sys/vm/drop_caches
      v=$("$RB" stat "$(list_for "$sys" tree)") ;;
    stat1)  # the same, reader and agent pinned to CPU 0: a round trip without cross-CPU wakeups
      [ "$sys" = native ] || [ "$sys" = ember ] || return 0
      local pids=() p; mapfile -t pids < <(pgrep -f -- "--mount $MNT/ember( |\$)")
      for p in "${pids[@]}"; do taskset -a -p -c 0 "$p" > /dev/null; done
      sync; echo 2 > /proc/sys/vm/drop_caches
      v=$(taskset -c 0 "$RB" stat "$(list_for "$sys" tree)")
      for p in "${pids[@]}"; do taskset -a -p -c "0-$(($(nproc) - 1))" "$p" > /dev/null; done ;;
  esac
  [ -n "$v" ] || { echo "bench: $c on $sys gave no number; $(cat "$OUT/fio.err" 2>/dev/null)" >&2; return 1; }
  record "$c" "$sys" "$v"
}
rotate() {  # RUN -> SYSTEMS rotated by RUN
  local i=$1 n=${#SYSTEMS[@]} out=()
  for k in $(seq 0 $((n - 1))); do out+=("${SYSTEMS[$(((i + k) % n))]}"); done
  echo "${out[@]}"
}

# ---- warm cases ----
# Start from an empty page cache (other data of this machine out of the way), then keep the
# backing data of every system in RAM: read a case's data again right before it (cheap when
# resident). Per case, not per run: this VM's DAMON pageout scheme reclaims pages left untouched
# for about a minute, and a run of all cases takes several.
sync; echo 3 > /proc/sys/vm/drop_caches
warm_backing() {  # CASE: the origin folder, Ember's cache blocks and rclone's copy it reads
  local d id  # Ember's dataset ids follow the order of `dataset add` in start_warm_ember
  case $1 in seq* | rand*) d=large id=1 ;; small*) d=images id=2 ;; *) return 0 ;; esac
  find "$DATA/$d" "$WORK/ember-warm/cache/blocks/$id" "$WORK/rclone-cache/vfs/local$DATA/$d" \
    -type f -print0 2>/dev/null | xargs -0 cat > /dev/null 2>&1 || true
}
start_warm_ember
start_bindfs
start_rclone
say "first read through Ember and rclone (fills their caches; cold figures)"
for sys in ember rclone; do
  r=$(root_of $sys)
  record coldfill-seq "$sys" "$("$RB" seq "$r/large/large.bin" keep)"
  record coldfill-small "$sys" "$("$RB" small "$(list_for $sys images)" 4 1 keep)"
done
WARM_CASES=(seq1 seq2 rand4k1 rand4k2 rand128k1 rand128k2 small1 small2 find stat stat1)
for i in $(seq "$RUNS"); do
  for c in "${WARM_CASES[@]}"; do
    say "warm run $i/$RUNS: $c"
    warm_backing "$c"
    for sys in $(rotate "$i"); do run_case "$c" "$sys"; done
  done
done
"$EMBER" status > "$OUT/ember-status.txt" || true
cleanup_warm() {
  fusermount -u "$MNT/ember" 2>/dev/null || true
  pkill -f -- "--cache-dir $WORK/ember-warm/cache" 2>/dev/null || true
  pkill -f -- "--data-dir $WORK/ember-warm/meta" 2>/dev/null || true
}
cleanup_warm
stop_rclone
fusermount -u "$MNT/bindfs"

# ---- cold first epoch: caches empty; origin warm in RAM, then from disk (page cache dropped) ----
drop_if_disk() {  # SOURCE: drops the page cache when the origin is to be read from disk
  if [ "$1" = disk ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
}
cold_run() {  # SOURCE(ram|disk) SYS RUN
  local src=$1 sys=$2 i=$3
  case $sys in
    ember) start_ember ember "$WORK/ember-cold" "" images shards ;;
    rclone) start_rclone ;;
    bindfs) start_bindfs ;;
  esac
  local r; r=$(root_of "$sys")
  local a=shards/shard-0000$((i % 4 * 2)).tar b=shards/shard-0000$((i % 4 * 2 + 1)).tar
  # Origin in RAM: read it natively right before (not timed; DAMON may have paged it out since).
  [ "$src" = ram ] && cat "$DATA/$a" "$DATA/$b" > /dev/null && "$RB" small "$OUT/images.native" 2 1 keep > /dev/null
  if [ "$sys" = store ]; then  # the same reads, each 4 MiB stored with O_DIRECT; no FUSE
    local scratch=$WORK/store-scratch
    rm -rf "$scratch"
    drop_if_disk "$src"
    record "cold-$src-small" store "$("$RB" store "$OUT/images.native" 4 "$i" "$scratch" files)"
    rm -rf "$scratch"
    printf '%s\n' "$DATA/$a" "$DATA/$b" > "$OUT/shards.store"
    drop_if_disk "$src"
    record "cold-$src-shards" store "$("$RB" store "$OUT/shards.store" 2 0 "$scratch" mib)"
    rm -rf "$scratch"
    return
  fi
  drop_if_disk "$src"
  record "cold-$src-small" "$sys" "$("$RB" small "$(list_for "$sys" images)" 4 "$i" keep)"
  drop_if_disk "$src"
  record "cold-$src-shards" "$sys" "$(fio_case "$sys" bw --rw=read --bs=1M --name=a \
    --filename="$r/$a" --name=b --filename="$r/$b")"
  case $sys in
    ember) stop_ember ember ;;
    rclone) stop_rclone ;;
    bindfs) fusermount -u "$MNT/bindfs" ;;
  esac
}
for src in ram disk; do
  for i in $(seq "$RUNS"); do
    say "cold ($src) run $i/$RUNS"
    # "store" is the ceiling of a cache fill on this machine: the same reads, each stored.
    for sys in $(rotate "$i") store; do
      [ "$sys" = ember-daemon ] && continue  # cold reads are the same path with or without passthrough
      cold_run "$src" "$sys" "$i"
    done
  done
done

# ---- takeover: the longest read while the agent is replaced 5 times under 4 readers ----
say "takeover stall"
TPORT=$((20000 + RANDOM % 20000))
rm -rf "$WORK/takeover"; mkdir -p "$WORK/takeover/mnt"
"$EMBER" meta --listen "127.0.0.1:$TPORT" --data-dir "$WORK/takeover/meta" > "$OUT/takeover-meta.log" 2>&1 &
PIDS+=("$!")
wait_for_log "$OUT/takeover-meta.log" "serving on" "$!"
EMBER_META=127.0.0.1:$TPORT "$EMBER" dataset add images "$DATA/images" > /dev/null
node_cmd=("$EMBER" node --meta "127.0.0.1:$TPORT" --listen "127.0.0.1:$((TPORT + 1))"
  --cache-dir "$WORK/takeover/cache" --cache-size 4GiB --mount "$WORK/takeover/mnt" --node-id t1)
"${node_cmd[@]}" > "$OUT/takeover-node-0.log" 2>&1 &
PIDS+=("$!")
wait_for_log "$OUT/takeover-node-0.log" "serving datasets at" "$!"
sed "s|^$DATA|$WORK/takeover/mnt|" "$OUT/images.native" > "$OUT/images.takeover"
"$RB" small "$OUT/images.takeover" 4 1 keep > /dev/null  # fill the cache
"$RB" stall "$OUT/images.takeover" 4 4 > "$OUT/stall-baseline.txt" || true
"$RB" stall "$OUT/images.takeover" 9 4 > "$OUT/stall.txt" &
STALL=$!
for k in 1 2 3 4 5; do
  sleep 1.5
  "${node_cmd[@]}" --takeover > "$OUT/takeover-node-$k.log" 2>&1 &
  PIDS+=("$!")
  wait_for_log "$OUT/takeover-node-$k.log" "took over" "$!"
done
wait $STALL || true
read -r t_reads t_failed t_max < "$OUT/stall.txt"
read -r b_reads b_failed b_max < "$OUT/stall-baseline.txt"
echo "Takeover: the agent replaced 5 times in 9 s under 4 readers of the image dataset (whole files, page cache dropped): $t_reads reads, $t_failed failed, longest read $t_max ms; without takeovers (4 s, same readers): longest read $b_max ms." > "$OUT/takeover.txt"
fusermount -u "$WORK/takeover/mnt" 2>/dev/null || true

# ---- peer fill vs raw TCP (transport level, same loopback) ----
say "peer fill vs raw TCP"
cat "$DATA/shards/shard-00000.tar" > /dev/null  # served from RAM, as the baseline is
"$BUILD/bin/peer_bench" "$DATA/shards/shard-00000.tar" "$RUNS" 1 > "$OUT/peer.txt"
"$BUILD/bin/peer_bench" "$DATA/shards/shard-00000.tar" "$RUNS" 2 >> "$OUT/peer.txt"

# ---- memory: agent RSS with a 1,000,000-block index; meta bytes per block location ----
say "memory: 1,000,000 resident blocks"
"$(dirname "$0")/bench_memory.sh" "$BUILD" > "$OUT/memory.txt"

# ---- report ----
say "writing the report"
stats() {  # CASE SYS -> "median min max"
  awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -g |
    awk '{a[NR] = $1} END {if (NR == 0) {print "- - -"; exit} m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR]}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0 && a != "-") printf "%.2f", a / b; else print "-"}'; }
cell() { set -- $(stats "$1" "$2"); echo "$1 ($2-$3)"; }
med() { stats "$1" "$2" | cut -d' ' -f1; }
table() {  # TITLE CASE:LABEL... (STORE=1: with the read-and-store columns)
  local head="" rule="" extra=""
  [ -n "${STORE:-}" ] && head=" read and store, no FUSE | Ember/read-and-store |" rule=" --- | --- |"
  echo "| $1 | native | Ember | Ember, no passthrough | bindfs | rclone | Ember/native | Ember/bindfs | Ember/rclone | no-passthrough/native |$head"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |$rule"
  shift
  for cl in "$@"; do
    local c=${cl%%:*} label=${cl#*:}
    local e; e=$(med "$c" ember)
    [ -n "${STORE:-}" ] && extra=" $(cell "$c" store) | $(ratio "$e" "$(med "$c" store)") |"
    echo "| $label | $(cell "$c" native) | $(cell "$c" ember) | $(cell "$c" ember-daemon) | $(cell "$c" bindfs) | $(cell "$c" rclone) | $(ratio "$e" "$(med "$c" native)") | $(ratio "$e" "$(med "$c" bindfs)") | $(ratio "$e" "$(med "$c" rclone)") | $(ratio "$(med "$c" ember-daemon)" "$(med "$c" native)") |$extra"
  done
}
{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(. /etc/os-release; echo "$PRETTY_NAME"); Ember $(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo '?'); $(fio --version); rclone $(rclone version 2>/dev/null | head -1 | awk '{print $2}'); bindfs $(bindfs --version 2>&1 | awk '{print $2}'); $(date -u +%Y-%m-%d)."
  echo "Runs: $RUNS per case and system, interleaved; median (min-max). Wall time of the suite: $(($(date +%s) - START)) s. Ember and Ember without passthrough are one agent and cache, switched $TAKEOVERS times by takeover during the run."
  echo
  table "warm (daemon's cache full, mount's page cache dropped)" \
    "seq1:sequential 1 MiB, 4 GiB file, 1 job (MiB/s)" "seq2:sequential 1 MiB, 2 jobs (MiB/s)" \
    "rand4k1:random 4 KiB, 1 job, QD1 (IOPS)" "rand4k2:random 4 KiB, 2 jobs (IOPS)" \
    "rand128k1:random 128 KiB, 1 job (MiB/s)" "rand128k2:random 128 KiB, 2 jobs (MiB/s)" \
    "small1:small files 112 KiB, 4 workers, first warm epoch (files/s)" \
    "small2:small files, second epoch, caches as left by the first (files/s)" \
    "find:find of 100,000 files, dentries dropped (files/s)" \
    "stat:stat of 100,000 files, dentries dropped (files/s)" \
    "stat1:stat, reader and agent pinned to one CPU (files/s; the FUSE round-trip ceiling here)"
  echo
  STORE=1 table "cold first epoch (caches empty)" \
    "cold-ram-small:small files, 4 workers, origin in RAM (files/s)" \
    "cold-ram-shards:2 shards of 512 MiB, 2 jobs, origin in RAM (MiB/s)" \
    "cold-disk-small:small files, 4 workers, origin from disk (files/s)" \
    "cold-disk-shards:2 shards, 2 jobs, origin from disk (MiB/s)"
  echo
  echo "First read through the daemons while filling their caches (origin warm), one run: Ember $(med coldfill-seq ember) MiB/s sequential, $(med coldfill-small ember) files/s; rclone $(med coldfill-seq rclone) MiB/s, $(med coldfill-small rclone) files/s."
  echo
  cat "$OUT/takeover.txt"
  echo
  echo "| peer fill (transport, 512 MiB file as 4 MiB blocks, 127.0.0.1) | Ember | raw TCP | ratio |"
  echo "| --- | --- | --- | --- |"
  grep '^|' "$OUT/peer.txt"
  echo
  grep -v '^|' "$OUT/peer.txt" | grep -v '^$' || true
  echo
  cat "$OUT/memory.txt"
  echo
  echo "Raw numbers (case system value): $(awk '{printf "%s%s/%s=%s", (NR > 1 ? ", " : ""), $1, $2, $3}' "$OUT/raw.txt")."
} > "$OUT/../suite.md"
cat "$OUT/../suite.md"

# The generated part of docs/benchmarks.md (between the markers) is replaced by this run.
DOC=$(dirname "$0")/../docs/benchmarks.md
if grep -q '<!-- suite:begin -->' "$DOC"; then
  awk -v f="$OUT/../suite.md" '
    /<!-- suite:begin -->/ {print; while ((getline l < f) > 0) print l; skip = 1; next}
    /<!-- suite:end -->/ {skip = 0}
    !skip {print}' "$DOC" > "$DOC.new" && mv "$DOC.new" "$DOC"
fi
say "done"
