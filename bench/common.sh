# Helpers the bench scripts share (sourced).

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }  # T0 T1: seconds between
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }            # PID: resident KiB
say() { echo "${BENCH_NAME:-bench}: $*" >&2; }

# NAME SUB [ARGS...]: BUILD (the first of ARGS that is not --json; default build), B (its bin/),
# WORK ($EMBER_BENCH_DIR/SUB), OUT (BUILD/bench), both made; JSON=1 when ARGS hold --json;
# say() speaks as NAME.
bench_init() {
  BENCH_NAME=$1
  JSON=0
  local build=build a
  for a in "${@:3}"; do
    if [ "$a" = --json ]; then JSON=1; elif [ -n "$a" ] && [ "$build" = build ]; then build=$a; fi
  done
  BUILD=$(realpath "$build")
  B=$BUILD/bin
  WORK=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/$2
  OUT=$BUILD/bench
  mkdir -p "$WORK" "$OUT"
}

wait_for_log() {  # FILE PATTERN PID: until FILE has PATTERN; fails if PID exits or 60 s pass
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.1
  done
  echo "bench: timed out waiting for '$2' in $1" >&2
  return 1
}

# Stops the processes a script started (PIDS) and unmounts nodes a, b, c under $WORK.
PIDS=()
stop_all() {
  [ ${#PIDS[@]} -gt 0 ] && { kill "${PIDS[@]}" 2>/dev/null || true; wait "${PIDS[@]}" 2>/dev/null || true; }
  PIDS=()
  for n in a b c; do umount -l "$WORK/$n/mnt" 2>/dev/null || true; done
}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Starts node NAME on 127.0.0.HOST (block server PORT+1, metrics PORT+2) with a SIZE cache and a
# mount under $WORK/NAME, NODE_ARGS added; waits until it serves. Its pid: NODE_PID (also in PIDS).
start_meta() {  # a meta on 127.0.0.1:$PORT with its data in $WORK/meta; exports EMBER_META
  "$B/ember" meta --listen "127.0.0.1:$PORT" --data-dir "$WORK/meta" ${META_ARGS:-} > "$WORK/meta.log" 2>&1 &
  PIDS+=($!)
  wait_for_log "$WORK/meta.log" "serving" $!
  export EMBER_META=127.0.0.1:$PORT
}

start_node() {  # NAME HOST SIZE
  local n=$1 h=$2
  mkdir -p "$WORK/$n/mnt"
  "$B/ember" node --listen "127.0.0.$h:$((PORT + 1))" --cache-dir "$WORK/$n/cache" \
    --cache-size "$3" --mount "$WORK/$n/mnt" --node-id "$n" \
    --metrics-listen "127.0.0.$h:$((PORT + 2))" --metrics-open /metrics ${NODE_ARGS:-} \
    > "$WORK/$n.log" 2>&1 &
  NODE_PID=$!
  PIDS+=($NODE_PID)
  wait_for_log "$WORK/$n.log" "serving datasets at" $NODE_PID
  # Started: its memory for blocks in flight faulted in (--warm-memory), which would otherwise
  # take the CPU from whatever the bench measures next (logged also when there is none).
  wait_for_log "$WORK/$n.log" "memory for blocks in flight" $NODE_PID
}

small_dataset() {  # SET (imagenet, tiny, ...): $WORK/SET made by bench/gen_small.py, once
  [ -f "$WORK/$1.done" ] && return 0
  say "generating $1"
  rm -rf "${WORK:?}/$1"
  mkdir -p "$WORK/$1"
  python3 "$(dirname "${BASH_SOURCE[0]}")/gen_small.py" "$WORK/$1" "$1"
  touch "$WORK/$1.done"
}
