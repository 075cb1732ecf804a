#!/usr/bin/env bash
# First HTTP speed figure: wrk against tern and Go net/http serving the same
# routes, on the same machine, interleaved (tern, go, tern, go, ...) so that
# drift in the machine's speed hits both alike. Prints requests/s per run,
# the median per server, and tern/go.
#
#   bench/http.sh [ROUNDS=3] [SECONDS=5] [CONNECTIONS=50]
#
# Needs: build/tern (make build), go, wrk. Both servers are pinned to CPU 0
# and wrk to CPU 1 (on a 2-core machine each side gets one core).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; secs=${2:-5}; conns=${3:-50}
tern_port=18080; go_port=18090
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

(cd bench/peers && go build -o "$out/go-nethttp" ./nethttp)
taskset -c 0 ./build/tern serve --port $tern_port --quiet 2>/dev/null &
GOMAXPROCS=1 taskset -c 0 "$out/go-nethttp" -addr 127.0.0.1:$go_port 2>/dev/null &
sleep 0.5
curl -fsS "http://127.0.0.1:$tern_port/ping" >/dev/null
curl -fsS "http://127.0.0.1:$go_port/ping" >/dev/null

run() { # server port path [lua]
    local args=(-t1 -c"$conns" -d"${secs}s" --latency)
    [ -n "${4:-}" ] && args+=(-s "$4")
    taskset -c 1 wrk "${args[@]}" "http://127.0.0.1:$2$3" | awk '/Requests\/sec/ {print $2}'
}

printf '%-22s %-6s %s\n' "route" "server" "requests/s per round"
for t in "GET /ping|/ping|" "GET /echo?size=4096|/echo?size=4096|" "POST /echo 4 KiB|/echo|bench/wrk/post4k.lua"; do
    IFS='|' read -r name path lua <<<"$t"
    : >"$out/tern"; : >"$out/go"
    for _ in $(seq "$rounds"); do
        run tern $tern_port "$path" "$lua" >>"$out/tern"
        run go $go_port "$path" "$lua" >>"$out/go"
    done
    med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    mt=$(med "$out/tern"); mg=$(med "$out/go")
    printf '%-22s %-6s %s  median %s\n' "$name" tern "$(tr '\n' ' ' <"$out/tern")" "$mt"
    printf '%-22s %-6s %s  median %s\n' "" go "$(tr '\n' ' ' <"$out/go")" "$mg"
    awk -v a="$mt" -v b="$mg" -v n="$name" 'BEGIN {printf "%-22s tern/go = %.2f\n", n, a/b}'
done
