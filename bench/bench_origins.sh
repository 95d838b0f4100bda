#!/bin/bash
# Remote-origin benchmark (part of `make bench`): an S3-compatible server (npm s3rver) on
# loopback. (1) cold read of a 1 GiB object through an Ember mount vs `curl` of the same object
# from the same server, interleaved, 5 runs each, medians (also with `ember node --direct-io`),
# and the same against nginx (HTTP origin); (2) `ember prefetch` of 5,000 small
# objects (objects/s). Usage: bench/bench_origins.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
EMBER=$BUILD/bin/ember
NPM=$BUILD/npm-s3
if [ ! -x "$NPM/node_modules/.bin/s3rver" ]; then
  mkdir -p "$NPM" && (cd "$NPM" && npm install --no-audit --no-fund --silent s3rver@3)
fi
WORK=$(mktemp -d /var/tmp/ember-bench-origins.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  fusermount3 -u -z "$WORK/mnt" 2>/dev/null || umount -l "$WORK/mnt" 2>/dev/null || true
  sleep 0.5
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
S3P=$(port); META=127.0.0.1:$(port); NODEP=$(port)
mkdir -p "$WORK/s3" "$WORK/mnt"
# Server and client share this machine's cores (no pinning: pinning the agent and the reader to
# one core while curl has one to itself measured worse for Ember, 0.31-0.37x).
node --openssl-legacy-provider "$NPM/node_modules/.bin/s3rver" -d "$WORK/s3" -a 127.0.0.1 \
  -p "$S3P" --configure-bucket bkt --silent > "$WORK/s3rver.log" 2>&1 &
PIDS+=($!)
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER EMBER_S3_ENDPOINT=http://127.0.0.1:$S3P
S3="curl -sf -H x-amz-content-sha256:UNSIGNED-PAYLOAD --aws-sigv4 aws:amz:us-east-1:s3 --user S3RVER:S3RVER"
for _ in $(seq 100); do $S3 -o /dev/null "http://127.0.0.1:$S3P/bkt?list-type=2" && break; sleep 0.2; done

echo "origins: writing a 1 GiB object"
head -c 1G /dev/urandom > "$WORK/big.bin"
$S3 -T "$WORK/big.bin" "http://127.0.0.1:$S3P/bkt/big/big.bin" -o /dev/null
rm -f "$WORK/big.bin"
"$EMBER" meta --listen "$META" --data-dir "$WORK/meta" > "$WORK/meta.log" 2>&1 &
PIDS+=($!)
sleep 0.5
"$EMBER" dataset add big s3://bkt/big --meta "$META" ${BLOCK:+--block-size $BLOCK} > /dev/null

mbps() { python3 -c "print(f'{1024/$1:.0f}')"; }
median() { printf "%s\n" "$@" | sort -n | sed -n 3p; }
# compare LABEL "CURL COMMAND" MOUNT_PATH: 5 interleaved runs of curl and of a cold `cat` through
# a fresh node agent (empty cache), medians and the ratio.
compare() {  # LABEL FETCH FILE [NODE FLAGS...]
  local label=$1 fetch=$2 file=$3 curl_runs=() ember_runs=() s e node
  shift 3
  for run in 1 2 3 4 5; do
    s=$(date +%s.%N); $fetch -o /dev/null; e=$(date +%s.%N)
    curl_runs+=("$(mbps "$(echo "$e - $s" | bc)")")
    rm -rf "$WORK/cache"
    "$EMBER" node --meta "$META" --listen "127.0.0.1:$NODEP" --cache-dir "$WORK/cache" \
      --cache-size 2GiB --mount "$WORK/mnt" --node-id bench --readahead "${READAHEAD:-4}" ${NODE_FLAGS:-} "$@" \
      > "$WORK/node.log" 2>&1 &
    node=$!
    for _ in $(seq 100); do grep -q "serving datasets" "$WORK/node.log" && break; sleep 0.1; done
    s=$(date +%s.%N); cat "$WORK/mnt/$file" > /dev/null; e=$(date +%s.%N)
    ember_runs+=("$(mbps "$(echo "$e - $s" | bc)")")
    kill "$node"; wait "$node" 2>/dev/null || true
  done
  local c m
  c=$(median "${curl_runs[@]}"); m=$(median "${ember_runs[@]}")
  echo "origins: $label: ember $m MiB/s vs curl $c MiB/s (medians of 5; runs: ember ${ember_runs[*]}, curl ${curl_runs[*]}) = $(python3 -c "print(f'{$m/$c:.2f}')")x"
}
compare "cold 1 GiB object from S3" "$S3 http://127.0.0.1:$S3P/bkt/big/big.bin" big/big.bin
# The same with --direct-io (no page cache of the mount for files not yet cached).
compare "cold 1 GiB object from S3, --direct-io" "$S3 http://127.0.0.1:$S3P/bkt/big/big.bin" \
  big/big.bin --direct-io

# The same comparison against nginx (C, not CPU-bound here): an HTTP origin with a JSON index.
if [ -x /usr/sbin/nginx ]; then
  NGP=$(port)
  mkdir -p "$WORK/www/web" "$WORK/ngtmp"
  head -c 1G /dev/urandom > "$WORK/www/web/big.bin"
  cat > "$WORK/nginx.conf" <<NG
daemon off; master_process off; pid $WORK/nginx.pid; error_log $WORK/nginx.err;
events {}
http { access_log off; client_body_temp_path $WORK/ngtmp; proxy_temp_path $WORK/ngtmp;
  fastcgi_temp_path $WORK/ngtmp; uwsgi_temp_path $WORK/ngtmp; scgi_temp_path $WORK/ngtmp;
  server { listen 127.0.0.1:$NGP; root $WORK/www; location / { autoindex on; autoindex_format json; } } }
NG
  /usr/sbin/nginx -c "$WORK/nginx.conf" -p "$WORK" &
  PIDS+=($!)
  sleep 0.5
  "$EMBER" dataset add web "http://127.0.0.1:$NGP/web/" --meta "$META" > /dev/null
  compare "cold 1 GiB file over HTTP (nginx)" "curl -sf http://127.0.0.1:$NGP/web/big.bin" \
    web/big.bin
  compare "cold 1 GiB file over HTTP (nginx), --direct-io" \
    "curl -sf http://127.0.0.1:$NGP/web/big.bin" web/big.bin --direct-io
  rm -f "$WORK/www/web/big.bin"
fi

echo "origins: writing 5,000 objects of 16 KiB"
mkdir -p "$WORK/small"
python3 - "$WORK/small" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(5000):
    sub = os.path.join(d, f"shard-{i // 100:02d}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"img-{i:05d}.jpg"), "wb") as f:
        f.write(os.urandom(16384))
PY
(cd "$WORK/small" && find . -type f | sed 's|^\./||' | xargs -P 8 -I{} $S3 -o /dev/null -T {} "http://127.0.0.1:$S3P/bkt/small/{}")
"$EMBER" dataset add small s3://bkt/small --meta "$META" > /dev/null
rm -rf "$WORK/cache"
"$EMBER" node --meta "$META" --listen "127.0.0.1:$NODEP" --cache-dir "$WORK/cache" \
  --cache-size 2GiB --mount "$WORK/mnt" --node-id bench > "$WORK/node.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -q "registered" "$WORK/node.log" && break; sleep 0.1; done
s=$(date +%s.%N)
"$EMBER" prefetch small --meta "$META" > "$WORK/prefetch.log" 2>&1
e=$(date +%s.%N)
echo "origins: prefetch of 5,000 objects of 16 KiB from S3: $(python3 -c "print(f'{5000/($e-$s):.0f}')") objects/s ($(echo "$e - $s" | bc) s)"
