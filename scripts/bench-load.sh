#!/usr/bin/env bash
# Compares meshmark's load engine with wrk and fortio against one local nginx: each
# generator pinned to core 1, nginx (one worker) to core 0, closed loop with the same
# connections for the same time; prints requests/s and generator CPU per request; the
# same for HTTP/2 against h2load and for gRPC against ghz; then meshmark's send lag at
# 10 000 req/s open loop on the idle target.
#   scripts/bench-load.sh [seconds] [connections] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
conns=${2:-16}
# single rounds of one tool vary by ±10 % on a shared 2-core VM; the median of five
# interleaved rounds is what the table reports
rounds=${3:-5}
repo=$(pwd)
export PATH="$repo/.tools/bin:$PATH"

for tool in nginx wrk taskset jq python3 /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "bench-load: $tool is missing (apt-get install nginx wrk util-linux)" >&2; exit 1; }
done
if ! command -v fortio >/dev/null; then
  echo "bench-load: installing fortio into .tools/bin" >&2
  GOBIN="$repo/.tools/bin" go install fortio.org/fortio@v1.66.5
fi
# Build from the tree being measured unless a binary is given: an existing bin/meshmark
# may be older than the code, and the table would describe the old code.
if [ -n "${MESHMARK_BIN:-}" ]; then
  mm=$MESHMARK_BIN
else
  mm=$repo/bin/meshmark
  go build -o "$mm" ./cmd/meshmark
fi

work=$(mktemp -d /tmp/meshmark-bench-load.XXXXXX)
ngpid=""
cleanup() {
  if [ -n "$ngpid" ]; then kill "$ngpid" 2>/dev/null || true; wait "$ngpid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# a free port on loopback
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(freeport)
port2=$(freeport)
# The two bodies the engine is measured on: nginx's 612-byte welcome page, and a 3-byte
# body where the per-request cost of the generator is all there is.
head -c 612 /dev/zero | tr '\0' 'x' > "$work/index.html"
printf 'ok\n' > "$work/small.txt"
mkdir -p "$work/tmp"
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process off;
pid $work/nginx.pid;
error_log $work/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/tmp; proxy_temp_path $work/tmp; fastcgi_temp_path $work/tmp;
  uwsgi_temp_path $work/tmp; scgi_temp_path $work/tmp;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
  server { listen 127.0.0.1:$port; root $work; }
  server { listen 127.0.0.1:$port2 http2; root $work; http2_max_concurrent_streams 1024; }
}
CONF
taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" &
ngpid=$!
url="http://127.0.0.1:$port/index.html"
for _ in $(seq 50); do
  curl -fs -o /dev/null "$url" 2>/dev/null && break
  sleep 0.1
done
curl -fs -o /dev/null "$url" || { echo "bench-load: nginx did not start:" >&2; cat "$work/error.log" >&2; exit 1; }

# run NAME CMD...: runs CMD pinned to core 1 under /usr/bin/time, leaves its output in
# $work/NAME.out and "user sys" CPU seconds in $work/NAME.cpu.
run() {
  local name=$1; shift
  /usr/bin/time -f '%U %S' -o "$work/$name.cpu" taskset -c 1 "$@" > "$work/$name.out" 2>&1
}

# The machine may be shared: the tools take turns (A B C A B C ...) and the table shows
# each one's median round, so that a burst of someone else's work hits all alike.
# rounds1 FILE URL: the HTTP/1.1 rounds of meshmark, wrk and fortio on URL into FILE.
rounds1() {
  local out=$1 target=$2
  : > "$out"
  for r in $(seq "$rounds"); do
    run meshmark "$mm" load "$target" -c "$conns" -d "${secs}s" --format json -o "$work/meshmark.json"
    echo "meshmark $(jq '.completed' "$work/meshmark.json") $(cat "$work/meshmark.cpu")" >> "$out"
    run wrk wrk -t1 -c "$conns" -d "${secs}s" "$target"
    echo "wrk $(awk '/requests in/ {print $1}' "$work/wrk.out") $(cat "$work/wrk.cpu")" >> "$out"
    run fortio fortio load -quiet -qps 0 -c "$conns" -t "${secs}s" "$target"
    echo "fortio $(sed -n 's/.*All done \([0-9]*\) calls.*/\1/p' "$work/fortio.out") $(cat "$work/fortio.cpu")" >> "$out"
  done
}
# table ROUNDS TOOL...: the median round of each tool, and meshmark's requests per CPU
# second relative to each other tool.
table() {
  python3 - "$secs" "$@" <<'PY'
import statistics, sys
secs, path, tools = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
rows = [l.split() for l in open(path) if l.strip()]
per = {}
for tool, n, user, sys_ in rows:
    n, cpu = int(n), float(user) + float(sys_)
    per.setdefault(tool, []).append((n / secs, cpu * 1e6 / n))
print(f"{'tool':<10} {'req/s':>10} {'cpu_us/req':>11} {'req/cpu_s':>10}   rounds (cpu_us/req)")
med = {}
for tool in tools:
    rs = per.get(tool, [])
    if not rs:
        continue
    rate = statistics.median(r for r, _ in rs)
    cost = statistics.median(c for _, c in rs)
    med[tool] = cost
    print(f"{tool:<10} {rate:>10.0f} {cost:>11.2f} {1e6 / cost:>10.0f}   " + " ".join(f"{c:.2f}" for _, c in rs))
if all(t in med for t in tools) and "meshmark" in med:
    print("meshmark requests per CPU second: " + ", ".join(f"{med[t] / med['meshmark']:.2f}x {t}" for t in tools if t != "meshmark"))
PY
}
for body in 612 3; do
  target=$url
  [ "$body" = 3 ] && target="http://127.0.0.1:$port/small.txt"
  echo
  echo "HTTP/1.1 $target ($body-byte body)"
  rounds1 "$work/rounds-$body" "$target"
  table "$work/rounds-$body" meshmark wrk fortio
done

# HTTP/2 in cleartext, multiplexed: the same requests in flight over the same
# connections (meshmark -c C*M --streams M is h2load -c C -m M), one nginx worker.
h2conns=${H2_CONNS:-4}
streams=${H2_STREAMS:-8}
echo
if command -v h2load >/dev/null; then
  h2url="http://127.0.0.1:$port2/index.html"
  echo "h2c $h2url: $h2conns connections x $streams streams, ${secs}s closed loop, $rounds interleaved rounds"
  : > "$work/h2rounds"
  for r in $(seq "$rounds"); do
    run meshmark-h2 "$mm" load "$h2url" --protocol h2c -c $((h2conns * streams)) --streams "$streams" -d "${secs}s" --format json -o "$work/meshmark-h2.json"
    echo "meshmark $(jq '.completed' "$work/meshmark-h2.json") $(cat "$work/meshmark-h2.cpu")" >> "$work/h2rounds"
    run h2load h2load -c "$h2conns" -m "$streams" -D "$secs" "$h2url"
    echo "h2load $(sed -n 's/^requests: [0-9]* total, [0-9]* started, \([0-9]*\) done.*/\1/p' "$work/h2load.out") $(cat "$work/h2load.cpu")" >> "$work/h2rounds"
  done
  table "$work/h2rounds" meshmark h2load
else
  echo "h2c: h2load is missing (apt-get install nghttp2-client); no HTTP/2 comparison"
fi

# gRPC unary calls (the standard health check) on one `meshmark service` speaking gRPC,
# pinned to core 0: meshmark -c C*M --streams M against ghz with C connections and C*M
# calls in flight.
echo
if ! command -v ghz >/dev/null; then
  echo "bench-load: installing ghz into .tools/bin" >&2
  GOBIN="$repo/.tools/bin" go install github.com/bojand/ghz/cmd/ghz@v0.93.0  # prereq.GhzVersion
fi
gport=$(freeport)
printf 'name: grpc-bench\nservices:\n  - name: echo\n    isEntrypoint: true\n    protocol: grpc\n    port: %s\n' "$gport" > "$work/grpc.yaml"
# ghz needs the call's protobuf schema: grpc.health.v1's, as published by gRPC.
cat > "$work/health.proto" <<'PROTO'
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }
PROTO
taskset -c 0 "$mm" service --graph "$work/grpc.yaml" --service echo --listen "127.0.0.1:$gport" > "$work/grpc-service.log" 2>&1 &
svcpid=$!
trap 'kill "$svcpid" 2>/dev/null || true; cleanup' EXIT INT TERM
for _ in $(seq 50); do
  "$mm" load "http://127.0.0.1:$gport" --protocol grpc -n 1 >/dev/null 2>&1 && break
  sleep 0.1
done
echo "gRPC 127.0.0.1:$gport (meshmark service, core 0): $h2conns connections x $streams calls, ${secs}s closed loop, $rounds interleaved rounds"
: > "$work/grpcrounds"
for r in $(seq "$rounds"); do
  run meshmark-grpc "$mm" load "http://127.0.0.1:$gport" --protocol grpc -c $((h2conns * streams)) --streams "$streams" -d "${secs}s" --format json -o "$work/meshmark-grpc.json"
  echo "meshmark $(jq '.completed' "$work/meshmark-grpc.json") $(cat "$work/meshmark-grpc.cpu")" >> "$work/grpcrounds"
  run ghz ghz --insecure --proto "$work/health.proto" --call grpc.health.v1.Health.Check \
    --connections "$h2conns" -c $((h2conns * streams)) -z "${secs}s" -O json "127.0.0.1:$gport"
  echo "ghz $(jq '.count' "$work/ghz.out") $(cat "$work/ghz.cpu")" >> "$work/grpcrounds"
done
table "$work/grpcrounds" meshmark ghz
kill "$svcpid" 2>/dev/null || true

echo
echo "meshmark open loop, 10000 req/s for ${secs}s on the idle target (core 1):"
taskset -c 1 "$mm" load "$url" --rate 10000 -d "${secs}s" | grep -E 'rate:|latency|service|send lag|generator|WARNING' || true
