#!/bin/bash
# bench_verify.sh BASE_BUILD NEW_BUILD: what checking every read from the cache costs. The same
# warm cases through the agent (--no-passthrough: every read is served, and since NEW_BUILD
# checked, by the agent) for two builds of Ember side by side, interleaved, and the passthrough
# sequential read; then NEW_BUILD's sequential read with its scrubber running at full pace
# against it off. Uses the suite's data (bench_suite.sh makes it). Writes BUILD/bench/verify.md
# of NEW_BUILD.
#
#   RUNS=3 BASE_ARGS=--no-passthrough bench/bench_verify.sh build-base build
set -euo pipefail
BASE=$(realpath "$1")
NEW=$(realpath "$2")
WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/suite
DATA=$WORK/data
RUNS=${RUNS:-3}
OUT=$NEW/bench/verify
RB=$NEW/bin/read_bench
[ -f "$DATA/.done" ] || { echo "bench: run bench/bench_suite.sh first (it makes the data)" >&2; exit 1; }
mkdir -p "$OUT"
: > "$OUT/raw.txt"
PIDS=()
MNTS=()
cleanup() {
  [ ${#PIDS[@]} -gt 0 ] && { kill "${PIDS[@]}" 2>/dev/null || true; }
  wait 2>/dev/null || true
  for m in "${MNTS[@]}"; do mountpoint -q "$m" && fusermount -u "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"

declare -A NAME_PIDS
# stop NAME: ends NAME's meta and node and frees its cache (RAM holds two systems' caches here).
stop() {
  kill ${NAME_PIDS[$1]} 2>/dev/null || true
  for p in ${NAME_PIDS[$1]}; do wait "$p" 2>/dev/null || true; done
  local mnt=$WORK/verify-$1/mnt
  mountpoint -q "$mnt" && fusermount -u "$mnt" 2>/dev/null || true
  rm -rf "$WORK/verify-$1"
}
# start NAME BUILD NODE-ARGS...: meta + node of BUILD on WORK/verify-NAME, datasets large, images.
start() {
  local name=$1 build=$2; shift 2
  local port=$((20000 + RANDOM % 20000)) state=$WORK/verify-$name mnt=$WORK/verify-$name/mnt
  rm -rf "$state"; mkdir -p "$mnt"
  "$build/bin/ember" meta --listen "127.0.0.1:$port" --data-dir "$state/meta" \
    > "$OUT/$name-meta.log" 2>&1 &
  PIDS+=("$!")
  NAME_PIDS[$name]="$!"
  wait_for_log "$OUT/$name-meta.log" "serving on" "$!"
  for d in large images; do
    "$build/bin/ember" dataset add "$d" "$DATA/$d" --meta "127.0.0.1:$port" > /dev/null
  done
  "$build/bin/ember" node --meta "127.0.0.1:$port" --listen "127.0.0.1:$((port + 1))" \
    --cache-dir "$state/cache" --cache-size 16GiB --mount "$mnt" --node-id "$name" "$@" \
    > "$OUT/$name-node.log" 2>&1 &
  PIDS+=("$!")
  NAME_PIDS[$name]="${NAME_PIDS[$name]} $!"
  MNTS+=("$mnt")
  wait_for_log "$OUT/$name-node.log" "serving datasets at" "$!"
  cat "$mnt/large/large.bin" > /dev/null  # fill the cache
  find "$mnt/images" -type f | sort > "$OUT/images.$name"
  "$RB" small "$OUT/images.$name" 4 1 drop > /dev/null
}
warm() {  # NAME: the origin and NAME's cache files back into RAM (pages untouched a minute go)
  cat "$DATA/large/large.bin" > /dev/null
  find "$WORK/verify-$1/cache/blocks" -type f -exec cat {} + > /dev/null
}
fio_bw() {  # FILE FIO-ARGS...: MiB/s, the mount's page cache of the file dropped first
  local f=$1; shift
  fio --output-format=terse --terse-version=3 --group_reporting --ioengine=psync --invalidate=1 \
    --filename="$f" "$@" --name=job 2> "$OUT/fio.err" | awk -F';' '{printf "%.1f\n", $7 / 1024}'
}
fio_iops() {
  local f=$1; shift
  fio --output-format=terse --terse-version=3 --group_reporting --ioengine=psync --invalidate=1 \
    --filename="$f" "$@" --name=job 2> "$OUT/fio.err" | awk -F';' '{printf "%.0f\n", $8}'
}
case_run() {  # CASE NAME [LABEL]: recorded as LABEL (default NAME)
  local mnt=$WORK/verify-$2/mnt v label=${3:-$2}
  warm "$2"
  case $1 in
    seq1) v=$(fio_bw "$mnt/large/large.bin" --rw=read --bs=1M) ;;
    seq2) v=$(fio_bw "$mnt/large/large.bin" --rw=read --bs=1M --numjobs=2 --size=2g --offset_increment=2g) ;;
    rand4k1) v=$(fio_iops "$mnt/large/large.bin" --rw=randread --bs=4k --runtime=3 --time_based) ;;
    rand128k1) v=$(fio_bw "$mnt/large/large.bin" --rw=randread --bs=128k --runtime=3 --time_based) ;;
    small1) v=$("$RB" small "$OUT/images.$2" 4 "$RANDOM" drop) ;;
  esac
  echo "$1 $label $v" >> "$OUT/raw.txt"
  echo "bench: $1 $label $v" >&2
}

# Two systems at a time: their caches, the origin and the page cache's working set fit in RAM.
# BASE_ARGS: the base build's node flags (a build from before the scrubber has no --scrub-rate).
# PHASES: which of daemon, scrub, passthrough to run (default all).
PHASES=${PHASES:-daemon scrub passthrough}
if [[ " $PHASES " == *" daemon "* ]]; then
  # shellcheck disable=SC2086
  start base "$BASE" ${BASE_ARGS:---no-passthrough}
  # shellcheck disable=SC2086
  start new "$NEW" --no-passthrough ${NEW_ARGS:---scrub-rate 0}
  for run in $(seq "$RUNS"); do
    for c in seq1 seq2 rand4k1 rand128k1 small1; do
      if [ $((run % 2)) -eq 1 ]; then order=(base new); else order=(new base); fi
      for s in "${order[@]}"; do case_run "$c" "$s"; done
    done
  done
  stop base
  stop new
fi
if [[ " $PHASES " == *" scrub "* ]]; then
  # A node whose scrubber runs at full pace (2 GiB/s, more than this disk gives) while it is
  # read, against one whose scrubber is off.
  # shellcheck disable=SC2086
  start new "$NEW" --no-passthrough ${NEW_ARGS:---scrub-rate 0}
  start scrub "$NEW" --no-passthrough --scrub-rate 2GiB
  for run in $(seq "$RUNS"); do
    case_run seq1 new noscrub
    case_run seq1 scrub
  done
  stop scrub
  stop new
fi
if [[ " $PHASES " == *" passthrough "* ]]; then
  # Passthrough (the kernel reads the cache files): the same for both builds once checked.
  # shellcheck disable=SC2086
  start basept "$BASE" ${BASE_PT_ARGS:-}
  # shellcheck disable=SC2086
  start newpt "$NEW" ${NEW_ARGS:---scrub-rate 0}
  for run in $(seq "$RUNS"); do
    for c in seq1 rand4k1 small1; do
      if [ $((run % 2)) -eq 1 ]; then order=(basept newpt); else order=(newpt basept); fi
      for s in "${order[@]}"; do case_run "$c" "$s"; done
    done
  done
  stop basept
  stop newpt
fi

# ---- table: medians, min-max ----
stat_of() {  # CASE LABEL -> "median (min-max)" or -
  local v
  v=$(awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -n)
  [ -z "$v" ] && { echo "-"; return; }
  echo "$v" | awk '{a[NR]=$1} END {printf "%s (%s-%s)", a[int((NR+1)/2)], a[1], a[NR]}'
}
ratio() {  # CASE A B -> median(B)/median(A)
  local a b
  a=$(awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -n |
    awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  b=$(awk -v c="$1" -v s="$3" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -n |
    awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  awk -v a="$a" -v b="$b" 'BEGIN {if (a > 0 && b > 0) printf "%.2fx", b / a; else printf "-"}'
}
{
  echo "| case (warm, through the agent) | unverified (base) | verified | verified / unverified |"
  echo "| --- | --- | --- | --- |"
  for c in seq1 seq2 rand4k1 rand128k1 small1; do
    echo "| $c | $(stat_of $c base) | $(stat_of $c new) | $(ratio $c base new) |"
  done
  echo
  echo "| case (warm, passthrough) | base | verified build | ratio |"
  echo "| --- | --- | --- | --- |"
  for c in seq1 rand4k1 small1; do
    echo "| $c | $(stat_of $c basept) | $(stat_of $c newpt) | $(ratio $c basept newpt) |"
  done
  echo
  echo "| daemon seq1 (MiB/s) | scrubber off | scrubber at 2 GiB/s | ratio |"
  echo "| --- | --- | --- | --- |"
  echo "| seq1 | $(stat_of seq1 noscrub) | $(stat_of seq1 scrub) | $(ratio seq1 noscrub scrub) |"
} > "$OUT/verify.md"
cat "$OUT/verify.md"
