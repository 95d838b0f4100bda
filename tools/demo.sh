#!/bin/bash
# make demo: runs Ember on real data of this machine. Replaced step by step as features land.
set -euo pipefail
EMBER=${1:-build/bin/ember}
EMBER=$(realpath "$EMBER")
WORK=$(mktemp -d /tmp/ember-demo-XXXXXX)
PORT=$(( 20000 + RANDOM % 20000 ))
export EMBER_META=127.0.0.1:$PORT
cleanup() { kill "$META_PID" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

echo "== starting meta on $EMBER_META (data in $WORK/meta)"
"$EMBER" meta --listen "$EMBER_META" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
META_PID=$!
for _ in $(seq 50); do "$EMBER" dataset ls > /dev/null 2>&1 && break; sleep 0.1; done

echo "== ember dataset add docs /usr/share/doc"
"$EMBER" dataset add docs /usr/share/doc
echo "== ember dataset ls"
"$EMBER" dataset ls
echo "== ember dataset show docs"
"$EMBER" dataset show docs
echo "== ember status"
"$EMBER" status
echo "(the FUSE mount comes with the node agent)"
