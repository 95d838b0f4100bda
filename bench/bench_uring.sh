#!/bin/bash
# bench_uring.sh BUILD: FUSE requests over io_uring (`--fuse-uring`) against the default
# /dev/fuse agent, the native file system and bindfs, on the suite's data (bench_suite.sh makes
# it), for the cases bound by request round trips: small files (first warm epoch with the
# mount's page cache dropped, second epoch), `find` and stat of 100,000 files with dentries
# dropped. Two Ember agents, each with its own cache filled first; RUNS runs (default 5),
# systems interleaved, medians. Turns the kernel's fuse.enable_uring on for the run (and back).
# Writes the part of docs/benchmarks.md between the uring markers. Part of `make bench`; kept
# apart from the suite so the suite's machine (RAM for every system's cache) stays as it was.
set -euo pipefail
BUILD=$(realpath "${1:-build}")
EMBER=$BUILD/bin/ember
RB=$BUILD/bin/read_bench
WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/uring
DATA=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/suite/data
RUNS=${RUNS:-5}
OUT=$BUILD/bench/uring
PARAM=/sys/module/fuse/parameters/enable_uring
START=$(date +%s)
say() { echo "bench: [$(($(date +%s) - START))s] $*" >&2; }
[ -f "$DATA/.done" ] || { echo "bench: run bench/bench_suite.sh first (it makes $DATA)" >&2; exit 1; }
if [ ! -w "$PARAM" ]; then
  echo "bench: this kernel has no FUSE over io_uring ($PARAM); nothing to measure" >&2
  exit 0
fi
WAS=$(cat "$PARAM")
echo Y > "$PARAM"
mkdir -p "$OUT" "$WORK/mnt/ember" "$WORK/mnt/uring" "$WORK/mnt/bindfs"
: > "$OUT/raw.txt"
PIDS=()
cleanup() {
  [ ${#PIDS[@]} -gt 0 ] && { kill "${PIDS[@]}" 2>/dev/null || true; }
  wait 2>/dev/null || true
  for m in ember uring bindfs; do
    mountpoint -q "$WORK/mnt/$m" 2>/dev/null && fusermount -u "$WORK/mnt/$m" 2>/dev/null || true
  done
  echo "$WAS" > "$PARAM" 2>/dev/null || true
}
trap cleanup EXIT

start() {  # NAME EXTRA
  local port=$((20000 + RANDOM % 20000))
  rm -rf "$WORK/$1"
  # shellcheck disable=SC2086
  "$EMBER" up --mount "$WORK/mnt/$1" --data-dir "$WORK/$1" --listen "127.0.0.1:$port" \
    --node-listen "127.0.0.1:$((port + 1))" --cache-size 4GiB --dataset "images=$DATA/images" \
    --dataset "tree=$DATA/tree" $2 > "$OUT/$1.log" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 600); do grep -q "serving datasets at" "$OUT/$1.log" && return 0; sleep 0.1; done
  cat "$OUT/$1.log" >&2
  return 1
}
start ember ""
start uring --fuse-uring
grep -q "requests over io_uring" "$OUT/uring.log" || { echo "bench: no io_uring" >&2; exit 1; }
bindfs -o ro "$DATA" "$WORK/mnt/bindfs"
root_of() { case $1 in native) echo "$DATA" ;; *) echo "$WORK/mnt/$1" ;; esac; }
for s in native ember uring bindfs; do
  find "$DATA/images" -type f | sort | sed "s|^$DATA|$(root_of $s)|" > "$OUT/images.$s"
  find "$DATA/tree" -type f | sort | sed "s|^$DATA|$(root_of $s)|" > "$OUT/tree.$s"
done
say "filling both caches"
"$RB" small "$OUT/images.ember" 4 1 keep > /dev/null
"$RB" small "$OUT/images.uring" 4 1 keep > /dev/null

SYSTEMS=(native ember uring bindfs)
for i in $(seq "$RUNS"); do
  find "$DATA/images" "$DATA/tree" "$WORK/ember" "$WORK/uring" -type f -print0 |
    xargs -0 cat > /dev/null 2>&1 || true  # backing data warm
  for c in small1 small2 find stat; do
    say "run $i/$RUNS: $c"
    for k in 0 1 2 3; do
      s=${SYSTEMS[$(((i + k) % 4))]}
      r=$(root_of "$s")
      case $c in
        small1)
          mode=drop
          [ "$s" = native ] && mode=keep
          v=$("$RB" small "$OUT/images.$s" 4 "$RANDOM" $mode) ;;
        small2) v=$("$RB" small "$OUT/images.$s" 4 "$RANDOM" keep) ;;
        find)
          sync; echo 2 > /proc/sys/vm/drop_caches
          t0=$(date +%s.%N); n=$(find "$r/tree" -type f | wc -l); t1=$(date +%s.%N)
          [ "$n" -eq 100000 ] || { echo "bench: find saw $n files on $s" >&2; exit 1; }
          v=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", 100000 / (b - a)}') ;;
        stat)
          sync; echo 2 > /proc/sys/vm/drop_caches
          v=$("$RB" stat "$OUT/tree.$s") ;;
      esac
      echo "$c $s $v" >> "$OUT/raw.txt"
    done
  done
done

med() {
  awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -g |
    awk '{a[NR] = $1} END {if (NR == 0) {print "-"; exit} print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
spread() {
  awk -v c="$1" -v s="$2" '$1 == c && $2 == s {print $3}' "$OUT/raw.txt" | sort -g |
    awk '{a[NR] = $1} END {printf "%s-%s", a[1], a[NR]}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}'; }
{
  echo "Machine: $(nproc) cores, kernel $(uname -r); Ember $(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo '?'); $(date -u +%Y-%m-%d). $RUNS runs, interleaved; median (min-max). Wall time $(($(date +%s) - START)) s."
  echo
  echo "| case | native | Ember | Ember --fuse-uring | bindfs | uring/native | uring/Ember | uring/bindfs |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for cl in "small1:small files 112 KiB, 4 workers, first warm epoch (files/s)" \
    "small2:small files, second epoch (files/s)" "find:find of 100,000 files, dentries dropped (files/s)" \
    "stat:stat of 100,000 files, dentries dropped (files/s)"; do
    c=${cl%%:*}
    u=$(med "$c" uring)
    echo "| ${cl#*:} | $(med "$c" native) ($(spread "$c" native)) | $(med "$c" ember) ($(spread "$c" ember)) | $u ($(spread "$c" uring)) | $(med "$c" bindfs) ($(spread "$c" bindfs)) | $(ratio "$u" "$(med "$c" native)") | $(ratio "$u" "$(med "$c" ember)") | $(ratio "$u" "$(med "$c" bindfs)") |"
  done
} > "$OUT/uring.md"
cat "$OUT/uring.md"
DOC=$(dirname "$0")/../docs/benchmarks.md
if grep -q '<!-- uring:begin -->' "$DOC"; then
  awk -v f="$OUT/uring.md" '
    /<!-- uring:begin -->/ {print; while ((getline l < f) > 0) print l; skip = 1; next}
    /<!-- uring:end -->/ {skip = 0}
    !skip {print}' "$DOC" > "$DOC.new" && mv "$DOC.new" "$DOC"
fi
say "done"
