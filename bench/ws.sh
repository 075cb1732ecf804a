#!/usr/bin/env bash
# First WebSocket speed figure: echo at CONNECTIONS connections, one message
# in flight per connection, 64 B and 4 KiB binary messages, tern (`tern
# serve`'s /ws) vs gorilla/websocket's echo server (bench/peers/gorilla),
# interleaved (tern, gorilla, tern, gorilla, ...).
#
#   bench/ws.sh [ROUNDS=3] [SECONDS=5] [CONNECTIONS=100]
#   CLIENT=gorilla bench/ws.sh ...   # drive with a Go gorilla client instead
#
# The client is `tern load echo` (C, on the tern loop) unless CLIENT=gorilla
# (bench/clients/wsload). Servers are pinned to CPU 0, the client to CPU 1. On a
# small machine the client may set the rate, not the server, so each row
# also gives the server's CPU time per message (utime+stime from
# /proc/PID/stat over the run, warm-up included) and the client's CPU use;
# a client near 100 % means the msg/s column measures the client.
# Compression is off on both sides (gorilla does not offer it by default).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; secs=${2:-5}; conns=${3:-100}
client=${CLIENT:-tern}
tern_port=18081; gorilla_port=18091
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

(cd bench/peers && go build -o "$out/gorilla-echo" ./gorilla)
(cd bench/clients && go build -o "$out/wsload" ./wsload)
taskset -c 0 ./build/tern serve --port $tern_port --quiet 2>/dev/null &
tern_pid=$!
GOMAXPROCS=1 taskset -c 0 "$out/gorilla-echo" -addr 127.0.0.1:$gorilla_port 2>/dev/null &
gorilla_pid=$!
sleep 0.5
hz=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# One round: prints "msg/s server_us_per_msg client_cpu_percent".
run() { # port pid size
    local before after t0 t1 rate msgs cstart cend
    before=$(cpu_ticks "$2")
    t0=$(date +%s.%N)
    if [ "$client" = gorilla ]; then
        rate=$(GOMAXPROCS=1 taskset -c 1 "$out/wsload" -url "ws://127.0.0.1:$1/ws" -conns "$conns" \
            -size "$3" -duration "${secs}s" -binary)
        msgs=$(awk -v r="$rate" -v s="$secs" 'BEGIN {print r * s}')
    else
        local json
        json=$(taskset -c 1 ./build/tern load echo --url "ws://127.0.0.1:$1/ws" --connections "$conns" \
            --size "$3" --duration "$secs" --warmup 1 --json)
        rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["msg_per_s"])' "$json")
        msgs=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["messages"])' "$json")
    fi
    t1=$(date +%s.%N)
    after=$(cpu_ticks "$2")
    # Server CPU over the whole run (warm-up too) per message measured, with
    # the warm-up's messages estimated at the measured rate.
    awk -v r="$rate" -v m="$msgs" -v d="$((after - before))" -v hz="$hz" -v t0="$t0" -v t1="$t1" \
        'BEGIN { total = r * (t1 - t0); if (total < m) total = m;
                 printf "%.0f %.2f\n", r, d / hz * 1e6 / total }'
}

printf '%-8s %-8s %-34s %s\n' "message" "server" "msg/s per round" "median msg/s, server CPU us/msg"
for size in 64 4096; do
    : >"$out/tern"; : >"$out/gorilla"
    for _ in $(seq "$rounds"); do
        run $tern_port $tern_pid "$size" >>"$out/tern"
        run $gorilla_port $gorilla_pid "$size" >>"$out/gorilla"
    done
    med() { sort -n -k"$2" "$1" | awk -v k="$2" '{a[NR]=$k} END {print a[int((NR+1)/2)]}'; }
    mt=$(med "$out/tern" 1); mg=$(med "$out/gorilla" 1)
    ct=$(med "$out/tern" 2); cg=$(med "$out/gorilla" 2)
    printf '%-8s %-8s %-34s %s, %s\n' "$size B" tern "$(cut -d' ' -f1 "$out/tern" | tr '\n' ' ')" "$mt" "$ct"
    printf '%-8s %-8s %-34s %s, %s\n' "" gorilla "$(cut -d' ' -f1 "$out/gorilla" | tr '\n' ' ')" "$mg" "$cg"
    awk -v a="$mt" -v b="$mg" -v c="$ct" -v d="$cg" -v n="$size B" \
        'BEGIN {printf "%-8s tern/gorilla: msg/s %.2f, server CPU per message %.2f\n", n, a/b, c/d}'
done
echo "client: $client, $conns connections, ${secs}s rounds"
