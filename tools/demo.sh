#!/bin/bash
# make demo: Ember on real data of this machine. Starts `ember up` (meta + node agent + FUSE
# mount in one process) over /usr/share/doc and /usr/include, reads every file twice through the
# mount (first from the origin, then from the cache), checks the bytes and shows `ember status`.
set -euo pipefail
EMBER=$(realpath "${1:-build/bin/ember}")
RB=$(dirname "$EMBER")/read_bench
WORK=$(mktemp -d /tmp/ember-demo-XXXXXX)
PORT=$((20000 + RANDOM % 20000))
export EMBER_META=127.0.0.1:$PORT
UP=""
cleanup() {
  [ -n "$UP" ] && kill "$UP" 2>/dev/null && wait "$UP" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "ember up --mount $WORK/mnt --dataset docs=/usr/share/doc --dataset include=/usr/include"
"$EMBER" up --mount "$WORK/mnt" --data-dir "$WORK/state" --listen "$EMBER_META" \
  --node-listen "127.0.0.1:$((PORT + 1))" --http "127.0.0.1:$((PORT + 2))" --cache-size 1GiB \
  --dataset docs=/usr/share/doc --dataset include=/usr/include > "$WORK/ember.log" 2>&1 &
UP=$!
for _ in $(seq 300); do
  grep -q "serving datasets at" "$WORK/ember.log" 2>/dev/null && break
  if ! kill -0 "$UP" 2>/dev/null; then cat "$WORK/ember.log"; exit 1; fi
  sleep 0.1
done
cat "$WORK/ember.log" | sed 's/^/  /'

step "ember dataset ls"
"$EMBER" dataset ls

step "ls $WORK/mnt   and   ls $WORK/mnt/include | head"
ls "$WORK/mnt"
ls "$WORK/mnt/include" | head -5

step "first read of every file (cold: filled from the origin)"
find "$WORK/mnt" -type f > "$WORK/files.txt"
echo "$(wc -l < "$WORK/files.txt") files"
time (xargs -a "$WORK/files.txt" -d '\n' cat > /dev/null)
sleep 1.2  # one heartbeat (every second under ember up), so status is current
"$EMBER" status

step "second read, with the mount's page cache dropped (served from Ember's cache)"
"$RB" drop "$WORK/mnt" 2>/dev/null || true
time (xargs -a "$WORK/files.txt" -d '\n' cat > /dev/null)
sleep 1.2
"$EMBER" status

step "bytes through the mount equal the originals"
diff -r --no-dereference /usr/include "$WORK/mnt/include" && echo "include: identical"
diff -r --no-dereference /usr/share/doc "$WORK/mnt/docs" && echo "docs: identical"

step "status page http://127.0.0.1:$((PORT + 2))/ and Prometheus /metrics (a few lines)"
curl -s "http://127.0.0.1:$((PORT + 2))/api/status" | head -c 300; echo " ..."
curl -s "http://127.0.0.1:$((PORT + 2))/metrics" | grep -E '^ember_(cache_used_bytes|read_bytes_total|meta_nodes)' || true

step "done: Ctrl-C on 'ember up' (here: SIGTERM) unmounts cleanly"
