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

# start NAME BUILD NODE-ARGS...: meta + node of BUILD on WORK/verify-NAME, datasets large, images.
start() {
  local name=$1 build=$2; shift 2
  local port=$((20000 + RANDOM % 20000)) state=$WORK/verify-$name mnt=$WORK/verify-$name/mnt
  rm -rf "$state"; mkdir -p "$mnt"
  "$build/bin/ember" meta --listen "127.0.0.1:$port" --data-dir "$state/meta" \
    > "$OUT/$name-meta.log" 2>&1 &
  PIDS+=("$!")
  wait_for_log "$OUT/$name-meta.log" "serving on" "$!"
  for d in large images; do
    "$build/bin/ember" dataset add "$d" "$DATA/$d" --meta "127.0.0.1:$port" > /dev/null
  done
  "$build/bin/ember" node --meta "127.0.0.1:$port" --listen "127.0.0.1:$((port + 1))" \
    --cache-dir "$state/cache" --cache-size 16GiB --mount "$mnt" --node-id "$name" "$@" \
    > "$OUT/$name-node.log" 2>&1 &
  PIDS+=("$!")
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
case_run() {  # CASE NAME
  local mnt=$WORK/verify-$2/mnt v
  warm "$2"
  case $1 in
    seq1) v=$(fio_bw "$mnt/large/large.bin" --rw=read --bs=1M) ;;
    seq2) v=$(fio_bw "$mnt/large/large.bin" --rw=read --bs=1M --numjobs=2 --size=2g --offset_increment=2g) ;;
    rand4k1) v=$(fio_iops "$mnt/large/large.bin" --rw=randread --bs=4k --runtime=3 --time_based) ;;
    rand128k1) v=$(fio_bw "$mnt/large/large.bin" --rw=randread --bs=128k --runtime=3 --time_based) ;;
    small1) v=$("$RB" small "$OUT/images.$2" 4 "$RANDOM" drop) ;;
  esac
  echo "$1 $2 $v" >> "$OUT/raw.txt"
  echo "bench: $1 $2 $v" >&2
}

# BASE_ARGS: the base build's node flags (a build from before the scrubber has no --scrub-rate).
# shellcheck disable=SC2086
start base "$BASE" ${BASE_ARGS:---no-passthrough}
start new "$NEW" --no-passthrough --scrub-rate 0
start newpt "$NEW" --scrub-rate 0
start scrub "$NEW" --no-passthrough --scrub-rate 2GiB
for run in $(seq "$RUNS"); do
  for c in seq1 seq2 rand4k1 rand128k1 small1; do
    if [ $((run % 2)) -eq 1 ]; then order=(base new); else order=(new base); fi
    for s in "${order[@]}"; do case_run "$c" "$s"; done
  done
  case_run seq1 newpt
  case_run seq1 scrub
done

# ---- table: medians, min-max ----
{
  echo "| case | unverified (base) | verified | verified / unverified |"
  echo "| --- | --- | --- | --- |"
  for c in seq1 seq2 rand4k1 rand128k1 small1; do
    b=$(awk -v c="$c" '$1 == c && $2 == "base" {print $3}' "$OUT/raw.txt" | sort -n)
    n=$(awk -v c="$c" '$1 == c && $2 == "new" {print $3}' "$OUT/raw.txt" | sort -n)
    bm=$(echo "$b" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    nm=$(echo "$n" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "| $c | $bm ($(echo "$b" | head -1)-$(echo "$b" | tail -1)) | $nm ($(echo "$n" | head -1)-$(echo "$n" | tail -1)) | $(awk -v a="$nm" -v b="$bm" 'BEGIN {printf "%.2fx", a / b}') |"
  done
  pt=$(awk '$1 == "seq1" && $2 == "newpt" {print $3}' "$OUT/raw.txt" | sort -n | tr '\n' ' ')
  sc=$(awk '$1 == "seq1" && $2 == "scrub" {print $3}' "$OUT/raw.txt" | sort -n | tr '\n' ' ')
  echo
  echo "Passthrough seq1 (verified build): $pt MiB/s. Daemon seq1 with the scrubber at 2 GiB/s: $sc MiB/s."
} > "$OUT/verify.md"
cat "$OUT/verify.md"
