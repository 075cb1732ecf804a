#!/usr/bin/env bash
# First WebSocket speed figure: echo messages per second at CONNECTIONS
# connections, one message in flight per connection, for 64 B and 4 KiB
# messages, tern (`tern serve`'s /ws) vs gorilla/websocket's echo server,
# interleaved (tern, gorilla, tern, gorilla, ...). The load generator is
# bench/go/wsload (gorilla client). Compression is off on both sides:
# gorilla does not offer it by default and wsload does not ask.
#
#   bench/ws.sh [ROUNDS=3] [SECONDS=5] [CONNECTIONS=100]
#
# Servers are pinned to CPU 0, the load generator to CPU 1.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; secs=${2:-5}; conns=${3:-100}
tern_port=18081; gorilla_port=18091
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

(cd bench/go && go build -o "$out/gorilla-echo" ./gorilla-echo && go build -o "$out/wsload" ./wsload)
taskset -c 0 ./build/tern serve --port $tern_port --quiet 2>/dev/null &
GOMAXPROCS=1 taskset -c 0 "$out/gorilla-echo" -addr 127.0.0.1:$gorilla_port 2>/dev/null &
sleep 0.5

run() { # port size
    GOMAXPROCS=1 taskset -c 1 "$out/wsload" -url "ws://127.0.0.1:$1/ws" -conns "$conns" \
        -size "$2" -duration "${secs}s"
}

printf '%-10s %-8s %s\n' "message" "server" "echoes/s per round"
for size in 64 4096; do
    : >"$out/tern"; : >"$out/gorilla"
    for _ in $(seq "$rounds"); do
        run $tern_port "$size" >>"$out/tern"
        run $gorilla_port "$size" >>"$out/gorilla"
    done
    med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    mt=$(med "$out/tern"); mg=$(med "$out/gorilla")
    printf '%-10s %-8s %s  median %s\n' "$size B" tern "$(tr '\n' ' ' <"$out/tern")" "$mt"
    printf '%-10s %-8s %s  median %s\n' "" gorilla "$(tr '\n' ' ' <"$out/gorilla")" "$mg"
    awk -v a="$mt" -v b="$mg" -v n="$size B" 'BEGIN {printf "%-10s tern/gorilla = %.2f\n", n, a/b}'
done
