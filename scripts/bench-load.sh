#!/usr/bin/env bash
# Compares meshmark's load engine with wrk and fortio against one local nginx: each
# generator pinned to core 1, nginx (one worker) to core 0, closed loop with the same
# connections for the same time; prints requests/s and generator CPU per request, then
# meshmark's send lag at 10 000 req/s open loop on the idle target.
#   scripts/bench-load.sh [seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-16}
repo=$(pwd)
export PATH="$repo/.tools/bin:$PATH"

for tool in nginx wrk taskset; do
  command -v "$tool" >/dev/null || { echo "bench-load: $tool is missing (apt-get install nginx wrk util-linux)" >&2; exit 1; }
done
if ! command -v fortio >/dev/null; then
  echo "bench-load: installing fortio into .tools/bin" >&2
  GOBIN="$repo/.tools/bin" go install fortio.org/fortio@v1.66.5
fi
mm=${MESHMARK_BIN:-$repo/bin/meshmark}
if ! "$mm" load --help >/dev/null 2>&1; then
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
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
head -c 612 /dev/zero | tr '\0' 'x' > "$work/index.html"
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

echo "target $url (nginx 1 worker on core 0); generators on core 1; $conns connections, ${secs}s closed loop"
run meshmark "$mm" load "$url" -c "$conns" -d "${secs}s" --format json -o "$work/meshmark.json"
mm_n=$(jq '.completed' "$work/meshmark.json")
run wrk wrk -t1 -c "$conns" -d "${secs}s" "$url"
wrk_n=$(awk '/requests in/ {print $1}' "$work/wrk.out")
run fortio fortio load -quiet -qps 0 -c "$conns" -t "${secs}s" "$url"
fortio_n=$(sed -n 's/.*All done \([0-9]*\) calls.*/\1/p' "$work/fortio.out")

printf '%-10s %12s %12s %14s %16s\n' tool requests req/s cpu_us/req req_per_cpu_s
row() {
  local name=$1 n=$2 cpu
  cpu=$(awk '{print $1+$2}' "$work/$name.cpu")
  awk -v t="$name" -v n="$n" -v c="$cpu" -v s="$secs" \
    'BEGIN { printf "%-10s %12d %12.0f %14.2f %16.0f\n", t, n, n/s, c*1e6/n, n/c }'
}
row meshmark "$mm_n"
row wrk "$wrk_n"
row fortio "$fortio_n"
awk -v m="$mm_n" -v mc="$(awk '{print $1+$2}' "$work/meshmark.cpu")" \
    -v f="$fortio_n" -v fc="$(awk '{print $1+$2}' "$work/fortio.cpu")" \
    -v w="$wrk_n" -v wc="$(awk '{print $1+$2}' "$work/wrk.cpu")" \
  'BEGIN { printf "meshmark requests per CPU second: %.2fx fortio (target >= 1.2x), %.2fx wrk\n", (m/mc)/(f/fc), (m/mc)/(w/wc) }'

echo
echo "meshmark open loop, 10000 req/s for ${secs}s on the idle target (core 1):"
taskset -c 1 "$mm" load "$url" --rate 10000 -d "${secs}s" | grep -E 'rate:|latency|service|send lag|generator|WARNING' || true
