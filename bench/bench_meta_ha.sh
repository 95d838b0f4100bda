#!/bin/bash
# The figures behind the choice of how meta fails over (#26 part 2; docs/meta-ha.md):
#  (a) one meta restarted on its data dir: kill -9, start again, time until it answers, with the
#      200,000-file tiny dataset in its store;
#  (b)/(c) etcd as the agreement engine: three members on 127.0.0.11-13, `etcdctl check perf`,
#      and the time from kill -9 of the leader until the survivors have a new leader (KILLS
#      times; the killed member rejoins between kills);
#  (c) as built: three `ember meta --replica-id` on those etcd members: `dataset add` of the same
#      200,000 files through the replicated leader, and META_KILLS (default 20) kill -9s of the
#      leader, each timed until a write (`dataset add` of a one-file set, through a client given
#      all three addresses) is acknowledged again; the killed replica restarts between kills.
#  Both (a) and (c) time metadata RPCs one at a time (bench/meta_rpc_bench.cc): reads (GetDataset,
#  Locate) and writes (a checksum claim batch: synced and replicated; a block report).
# Usage: bench/bench_meta_ha.sh [BUILD]; KILLS (default 10). Needs etcd-server and etcd-client
# (Debian's 3.4). Writes a table to BUILD/bench/meta_ha.md; --json prints it as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_init bench_meta_ha meta_ha "$@"
KILLS=${KILLS:-10}
command -v etcd > /dev/null || { echo "bench_meta_ha: needs etcd (apt-get install etcd-server etcd-client)" >&2; exit 1; }
SMALL=${EMBER_BENCH_DIR:-/var/tmp/ember-bench}/small
TINY=$SMALL/tiny
if [ ! -f "$SMALL/tiny.done" ]; then
  say "generating tiny"
  rm -rf "$TINY"; mkdir -p "$TINY"
  python3 bench/gen_small.py "$TINY" tiny
  touch "$SMALL/tiny.done"
fi
rm -rf "$WORK"; mkdir -p "$WORK"
ETCD_PIDS=()
META_PID=""
cleanup() {
  stop_all
  for p in $META_PID "${ETCD_PIDS[@]:-}" "${MPIDS[@]:-}"; do
    if [ -n "$p" ]; then kill -9 "$p" 2> /dev/null || true; fi
  done
}
trap cleanup EXIT
ROWS=()
row() { ROWS+=("$1|$2|$3"); }  # case, value, note

# (a) meta restarted on its data dir.
PORT=$((30000 + RANDOM % 10000))
export EMBER_META=127.0.0.1:$PORT
start_meta() {
  "$B/ember" meta --listen "$EMBER_META" --data-dir "$WORK/meta" >> "$WORK/meta.log" 2>&1 &
  META_PID=$!
}
start_meta
until "$B/ember" dataset ls > /dev/null 2>&1; do sleep 0.05; done
say "dataset add of the tiny set (200,000 files)"
find "$TINY" > /dev/null  # both adds below walk a tree whose inodes are in memory
t0=$(now); "$B/ember" dataset add tiny "$TINY" > /dev/null; t1=$(now)
row "dataset add, 200,000 files (one meta)" "$(secs "$t0" "$t1") s" ""
# Metadata RPC latency, one call at a time (build/bin/meta_rpc_bench): rows per call.
rpc_rows() {  # LABEL ADDRESSES
  local out
  out=$("$B/meta_rpc_bench" "$2" "$WORK/rpc-origin" 2000 --json)
  while IFS='|' read -r call p50 p99; do
    row "$call latency, $1 (median / p99)" "$p50 us / $p99 us" "2,000 calls, one at a time"
  done < <(echo "$out" | python3 -c 'import json,sys
for f in json.load(sys.stdin): print("%s|%d|%d" % (f["call"], f["p50_us"], f["p99_us"]))')
}
say "metadata RPC latency, one meta"
rpc_rows "one meta" "$EMBER_META"
best=""; worst=0
for i in 1 2 3; do
  kill -9 "$META_PID"; wait "$META_PID" 2>/dev/null || true
  t0=$(now); start_meta
  until "$B/ember" dataset ls > /dev/null 2>&1; do sleep 0.02; done
  t1=$(now); s=$(secs "$t0" "$t1")
  say "meta restart $i: $s s"
  best=$(awk -v a="${best:-$s}" -v b="$s" 'BEGIN { print (b < a ? b : a) }')
  worst=$(awk -v a="$worst" -v b="$s" 'BEGIN { print (b > a ? b : a) }')
done
kill "$META_PID"; wait "$META_PID" 2>/dev/null || true
META_PID=""
row "meta kill -9 -> answering again on its data dir (process start only)" "$best-$worst s" \
  "3 restarts; a rescheduled pod adds its own start and volume attach"

# etcd: three members.
CLUSTER=""
for m in 1 2 3; do CLUSTER+="m$m=http://127.0.0.1$m:2380,"; done
CLUSTER=${CLUSTER%,}
ENDPOINTS="127.0.0.11:2379,127.0.0.12:2379,127.0.0.13:2379"
start_member() {  # M
  local m=$1
  etcd --name "m$m" --data-dir "$WORK/etcd$m" \
    --listen-client-urls "http://127.0.0.1$m:2379" --advertise-client-urls "http://127.0.0.1$m:2379" \
    --listen-peer-urls "http://127.0.0.1$m:2380" --initial-advertise-peer-urls "http://127.0.0.1$m:2380" \
    --initial-cluster "$CLUSTER" --initial-cluster-state "${2:-new}" \
    --heartbeat-interval 100 --election-timeout 1000 >> "$WORK/etcd$m.log" 2>&1 &
  ETCD_PIDS[m]=$!
}
for m in 1 2 3; do start_member $m; done
until ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" endpoint health > /dev/null 2>&1; do sleep 0.1; done
say "etcdctl check perf --load=s"
perf=$(ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" check perf --load=s 2>&1 || true)
echo "$perf" > "$WORK/check_perf.txt"
tput=$(echo "$perf" | grep -o "Throughput is [0-9.]* writes/s" | head -1 || true)
lat=$(echo "$perf" | grep -o "Slowest request took [0-9.]*s" | head -1 || true)
stddev=$(echo "$perf" | grep -o "Stddev is [0-9.]*s" | head -1 || true)
row "etcd 3 members, etcdctl check perf --load=s" "${tput:-?}" "${lat:-?}; ${stddev:-?}"
# One client's sequential writes (a meta leader recording a version, a job, a claim batch):
# the v3 JSON gateway over one kept-alive connection.
say "500 sequential puts"
puts=$(python3 - <<'PY'
import base64, http.client, json, time
c = http.client.HTTPConnection("127.0.0.11", 2379)
lat = []
for i in range(500):
    body = json.dumps({"key": base64.b64encode(b"/ember/bench/%d" % i).decode(),
                       "value": base64.b64encode(b"x" * 200).decode()})
    t = time.perf_counter()
    c.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    lat.append(time.perf_counter() - t)
lat.sort()
print("%.1f ms|%.1f ms" % (1000 * sum(lat) / len(lat), 1000 * lat[int(len(lat) * 0.99)]))
PY
)
row "etcd put, one client, sequential (mean / p99)" "${puts%%|*} / ${puts##*|}" "500 puts of 200 B"

leader() {  # prints the member number that leads, as the survivors see it, or nothing
  ETCDCTL_API=3 etcdctl --endpoints "$1" endpoint status -w json --command-timeout=300ms 2> /dev/null |
    python3 -c 'import json,sys
try:
    s = json.load(sys.stdin)
except Exception:
    sys.exit(0)
for e in s:
    h = e["Status"]["header"]
    if e["Status"].get("leader") == h["member_id"]:
        print(e["Endpoint"].split(":")[0][-1])
        break'
}
times=()
for _ in $(seq "$KILLS"); do
  l=$(leader "$ENDPOINTS")
  [ -n "$l" ] || { sleep 0.5; continue; }
  survivors=$(echo "$ENDPOINTS" | tr ',' '\n' | grep -v "127.0.0.1$l:" | paste -sd,)
  kill -9 "${ETCD_PIDS[$l]}"; wait "${ETCD_PIDS[$l]}" 2>/dev/null || true
  t0=$(now)
  until [ -n "$(leader "$survivors")" ]; do sleep 0.02; done
  t1=$(now); times+=("$(secs "$t0" "$t1")")
  say "etcd leader m$l killed: new leader after ${times[-1]} s"
  start_member "$l" existing
  until ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" endpoint health > /dev/null 2>&1; do sleep 0.1; done
  sleep 1
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
n=${#times[@]}
median=$(echo "$sorted" | sed -n "$(((n + 1) / 2))p")
max=$(echo "$sorted" | tail -1)
row "etcd leader kill -9 -> new leader (election timeout 1 s)" "median $median s, max $max s" "$n kills"

# (c) as built: three meta replicas (127.0.0.21-23) on the three etcd members.
say "meta replicas"
MPORT=$((40000 + RANDOM % 10000))
ALL="127.0.0.21:$MPORT,127.0.0.22:$MPORT,127.0.0.23:$MPORT"
declare -A MPIDS
start_replica() {  # N
  "$B/ember" meta --listen "127.0.0.2$1:$MPORT" --data-dir "$WORK/replica$1" --replica-id "m$1" \
    --etcd "$ENDPOINTS" >> "$WORK/replica$1.log" 2>&1 &
  MPIDS[$1]=$!
}
in_sync() { ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" get --prefix /ember/meta/in-sync/ --keys-only 2> /dev/null | grep -c . || true; }
meta_leader() { ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" get /ember/meta/leader --print-value-only 2> /dev/null | cut -d' ' -f1 | tr -dc 0-9; }
for m in 1 2 3; do start_replica $m; done
export EMBER_META=$ALL
until "$B/ember" dataset ls > /dev/null 2>&1; do sleep 0.1; done
until [ "$(in_sync)" = 3 ]; do sleep 0.1; done
say "dataset add of the tiny set through the replicated leader"
t0=$(now); "$B/ember" dataset add tiny "$TINY" > /dev/null; t1=$(now)
row "dataset add, 200,000 files (3 replicas)" "$(secs "$t0" "$t1") s" "every batch on both standbys before it is acknowledged"
say "metadata RPC latency, 3 replicas"
rpc_rows "3 replicas" "$ALL"
ONE=$WORK/one; mkdir -p "$ONE"; echo x > "$ONE/x"
META_KILLS=${META_KILLS:-20}
times=()
for k in $(seq "$META_KILLS"); do
  until [ "$(in_sync)" = 3 ]; do sleep 0.1; done
  l=$(meta_leader)
  [ -n "$l" ] || { sleep 0.5; continue; }
  kill -9 "${MPIDS[$l]}"; wait "${MPIDS[$l]}" 2> /dev/null || true
  t0=$(now)
  # Answered again = a write acknowledged by the new leader (the client follows it).
  until "$B/ember" dataset add "k$k" "$ONE" > /dev/null 2>&1; do sleep 0.02; done
  t1=$(now); times+=("$(secs "$t0" "$t1")")
  say "meta leader m$l killed: a write acknowledged again after ${times[-1]} s"
  start_replica "$l"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
n=${#times[@]}
row "meta leader kill -9 -> a write acknowledged by the new leader" \
  "median $(echo "$sorted" | sed -n "$(((n + 1) / 2))p") s, max $(echo "$sorted" | tail -1) s" \
  "$n kills; lease TTL 3 s"
for m in 1 2 3; do kill "${MPIDS[$m]}" 2> /dev/null || true; done
for m in 1 2 3; do wait "${MPIDS[$m]}" 2> /dev/null || true; done

if [ "$JSON" = 1 ]; then
  printf '%s\n' "${ROWS[@]}" | python3 -c 'import json,sys
print(json.dumps([dict(zip(["case","value","note"], l.rstrip("\n").split("|"))) for l in sys.stdin], indent=1))'
else
  {
    echo "| case | value | note |"
    echo "| --- | --- | --- |"
    for r in "${ROWS[@]}"; do echo "| ${r//|/ | } |"; done
  } | tee "$OUT/meta_ha.md"
fi
