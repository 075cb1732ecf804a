#!/usr/bin/env bash
# Runs every test: called by `make test` after the three builds.
#   1. unit tests (ctest) on the release build, then the library as an
#      application uses it (scripts/test-consumer.sh: installed and linked
#      through pkg-config and find_package, and through add_subdirectory),
#      the reference (scripts/check-api-docs.sh: every exported function on
#      one page of docs/api/, every page's example builds), the map
#      (scripts/check-docs-map.sh: docs/ARCHITECTURE.md indexes every file
#      of src/, README names every example, no link leaves the
#      repository), the platform (scripts/check-platform.sh: no Linux-only
#      call outside src/platform/ and the Linux back ends);
#   2. the integration tests (pytest) on the release build and on the
#      ASan+UBSan build, where any sanitizer report fails, once per back
#      end of the loop (TERN_IO, which every `tern` they start reads): the
#      four runs side by side;
#   then the TLS tests against the rustls build (build-rustls);
#   then the JavaScript client's tests (clients/js, node --test);
#   then the portable build (build-portable: POSIX alone, the poll back
#   end): its unit tests and a part of the integration suite;
#   then the unit tests on the ASan+UBSan build. ctest has every unit test
#   three times (TERN_IO=epoll, TERN_IO=uring, and TERN_IO=poll, the
#   portable build's back end);
#   3. Autobahn|Testsuite (fuzzingclient, cases 1-13, run by tests/autobahn)
#      against `tern serve`'s /ws echo: every case over wss:// on the release
#      build, and the quick cases (all but 9.*, 12.*, 13.*, which are long
#      performance and compression runs) over ws:// on it and over both on
#      the sanitizer build, the ws:// ones on each back end, and over wss://
#      on io_uring too, and cases 1-11 over wss:// against the rustls build
#      on each back end; then its fuzzingserver (wstest as the server)
#      against tern's client (tests/autobahn/client.c): every case on the
#      release build, the quick ones on the sanitizer build. Two lanes
#      side by side: the long wss:// run, and everything else in turn;
#   4. each libFuzzer target for FUZZ_SECONDS (default 20) from its corpus,
#      one per core at a time (scripts/fuzz.sh);
#   5. every benchmark suite with --quick (bench/run), and ws-echo once more
#      driven by the Go gorilla client: fails when a peer did not build, did
#      not start or answered nothing (no speed thresholds).
# AUTOBAHN=0 and BENCH=0 skip steps 3 and 5 (for quick local runs; CI runs all).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# A sanitizer report must fail the run, leaks included.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=23:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=23"

# Nothing may hang the run: a test that does not end in PER_TEST seconds
# fails by name (pytest-timeout, and node --test's own), and the
# JavaScript run as a whole is bounded too. The longest integration test
# takes about a minute under the sanitizers.
PER_TEST=${PER_TEST:-600}
pytest=(python3 -m pytest -q -p no:cacheprovider --timeout "$PER_TEST")

status=0
# Each section's header says when it started (minutes into the run).
section() { printf '\n==== %s ==== [%d:%02d]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

section "unit tests (release)"
(cd build && ctest --output-on-failure --no-tests=error) || status=1

section "the library from outside (install, pkg-config, find_package, add_subdirectory)"
scripts/test-consumer.sh build || status=1

section "the API reference (docs/api/) against the library and examples/"
scripts/check-api-docs.sh build || status=1

section "the map (docs/ARCHITECTURE.md's file index), README's examples, links inside the repository"
scripts/check-docs-map.sh || status=1

section "the platform: nothing Linux-only outside src/platform/ and the Linux back ends"
scripts/check-platform.sh || status=1

# Whether this build has the io_uring back end, and this kernel lets us use
# it: the "listening on" line names the back end a server got. (The server
# runs until timeout stops it; head alone would not end it.)
backends=(epoll)
first=$(timeout 3 "$root/build/tern" serve --port 0 --io uring --threads 1 --admin-listen off 2>&1 </dev/null |
        head -1 || true)
if [[ $first == *io_uring* ]]; then
    backends+=(uring)
else
    echo "test.sh: no io_uring here (not built, or refused): epoll only"
fi

# The integration tests: the release build and the sanitizer build, each
# once per back end, all four runs at once. A run keeps about half a core
# busy (most tests wait on the server, a client or a timeout; the
# sanitizer build's more), so together they fill the two cores and take
# little longer than one; the tests wait for conditions, never for luck,
# so a busy machine slows them, no more. Each run's output is printed
# when it ends.
runs=() pids=()
for io in "${backends[@]}"; do
    TERN_IO="$io" TERN_BIN="$root/build/tern" "${pytest[@]}" tests/integration \
        >"$root/build/integration-release-$io.log" 2>&1 &
    runs+=("release $io") pids+=($!)
    TERN_IO="$io" TERN_BIN="$root/build-asan/tern" TERN_SANITIZED=1 "${pytest[@]}" tests/integration \
        >"$root/build/integration-asan-$io.log" 2>&1 &
    runs+=("asan $io") pids+=($!)
done
for i in "${!runs[@]}"; do
    wait "${pids[$i]}" || status=1
    read -r what io <<<"${runs[$i]}"
    section "integration tests ($what, $io)"
    cat "$root/build/integration-$what-$io.log"
done

# The TLS tests again against the rustls build (build-rustls, TERN_TLS=rustls,
# made by make test), on each back end side by side: test_tls.py whole, and
# the tests of the other files that use TLS by name. A build that fell back
# to OpenSSL (no cargo 1.85+) says so in one line and skips them.
rustls_tls() {
    local bin=$root/build-rustls/tern io i rc=0 pids=()
    local others=(test_admin test_backends test_client test_config test_limits test_load
                  test_page test_systemd test_tokens test_topic_rules test_vhosts test_ws test_ws_clients)
    for io in "${backends[@]}"; do
        (cd tests/integration &&
         TERN_IO="$io" TERN_BIN="$bin" "${pytest[@]}" test_tls.py &&
         TERN_IO="$io" TERN_BIN="$bin" "${pytest[@]}" \
             -k "tls or wss or https or socket_activation" "${others[@]/%/.py}") >"$root/build/rustls-$io.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!backends[@]}"; do
        wait "${pids[$i]}" || rc=1
        section "TLS tests against rustls (build-rustls, ${backends[$i]})"
        cat "$root/build/rustls-${backends[$i]}.log"
    done
    return $rc
}
have_rustls=0
if [[ $("$root/build-rustls/tern" serve --help 2>/dev/null | head -1) == *rustls* ]]; then
    have_rustls=1
    rustls_tls || status=1
    # the key sets across reloads (net/tls.c), which rustls relies on: under a second
    section "Unit test of rustls's certificate sets (build-rustls)"
    (cd "$root/build-rustls" && ctest --output-on-failure -R '^test_tls_retire$') || status=1
else
    echo "test.sh: build-rustls is on OpenSSL (no cargo 1.85+ for rustls-ffi): its TLS runs skipped"
fi

# The JavaScript client (clients/js) against the release build's tern
# serve, with Node's own test runner; and its package, packed offline.
section "JavaScript client (clients/js, node --test)"
if [ ! -d clients/js/node_modules/ws ]; then
    (cd clients/js && npm ci --no-audit --no-fund --silent) || status=1
fi
(cd clients/js && TERN_BIN="$root/build/tern" timeout -k 10 1200 \
     node --test --test-timeout=$((PER_TEST * 1000)) test/*.test.js) || status=1
(cd clients/js && npm pack --dry-run --offline >/dev/null 2>&1) ||
    { echo "npm pack failed (clients/js)"; status=1; }

# The portable build (make build-portable: _POSIX_C_SOURCE, no Linux
# header, the poll back end, src/platform/posix.c): its unit tests, then
# the integration tests of HTTP and static files, WebSocket, the drain on
# SIGTERM, pub/sub, the clocks and the faults. Not the send clock's test
# of a reader slower than the kernel frees room: it needs to know what the
# peer acknowledged (SIOCOUTQ), which POSIX cannot say.
section "portable build: unit tests, integration tests (build-portable, poll)"
(cd build-portable && ctest --output-on-failure --no-tests=error) || status=1
(cd tests/integration && TERN_BIN="$root/build-portable/tern" "${pytest[@]}" \
     -k "not steady_reader_slower_than_the_kernel_frees_room" \
     test_http.py test_ws.py test_drain.py test_pubsub.py test_clocks.py test_faults.py) || status=1

section "unit tests (ASan + UBSan)"
(cd build-asan && ctest --output-on-failure --no-tests=error) || status=1


# Starts `tern serve` from build dir $1 on a free port, runs Autobahn with
# the environment given, and stops the server, which must exit 0 cleanly.
# With $3 = tls, over wss:// (a self-signed certificate made for the run).
autobahn() {
    local build=$1 out=$2 tls=${3:-} log port pid rc=0 scheme=ws args=()
    log="$out.server.log"
    mkdir -p "$out"
    if [ "$tls" = tls ]; then
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
            -keyout "$out/key.pem" -out "$out/cert.pem" 2>/dev/null
        args=(--tls-port 0 --tls-cert "$out/cert.pem" --tls-key "$out/key.pem")
        scheme=wss
    fi
    # --bench-routes: /ws, the echo Autobahn drives; no admin listener
    "$build/tern" serve --host 127.0.0.1 --port 0 --bench-routes --admin-listen off "${args[@]}" 2>"$log" &
    pid=$!
    local pattern='listening on http://127.0.0.1:[0-9]*'
    [ "$tls" = tls ] && pattern='https://127.0.0.1:[0-9]*'
    for _ in $(seq 50); do
        port=$(grep -o "$pattern" "$log" | grep -o '[0-9]*$' || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "autobahn: tern did not start"; cat "$log"; kill "$pid" 2>/dev/null || true
        return 1
    fi
    AUTOBAHN_AGENT=${AUTOBAHN_AGENT:-tern} tests/autobahn/run "$scheme://127.0.0.1:$port/ws" "$out" || rc=1
    kill -TERM "$pid"
    wait "$pid" || { echo "autobahn: tern exited $? after SIGTERM"; rc=1; }
    if grep -q -e "ERROR: AddressSanitizer" -e "runtime error:" -e "LeakSanitizer" "$log"; then
        cat "$log"; rc=1
    fi
    return $rc
}

# The second of Autobahn's two lanes (below): tern's client against
# wstest's fuzzingserver, every case, then the quick runs one after another.
# Any sanitizer report makes the client exit non-zero, which run-client
# counts as a failure.
autobahn_lane() {
    local rc=0 io
    section "Autobahn|Testsuite fuzzingserver against tern's client, all cases (release)"
    AUTOBAHN_AGENT=tern tests/autobahn/run-client build/tests/autobahn_client build/autobahn-client || rc=1

    if [[ " ${backends[*]} " == *" uring "* ]]; then
        # TLS over io_uring's stream transport (#28): its own reads and writes
        section "Autobahn|Testsuite over wss://, quick cases (release, uring)"
        TERN_IO=uring AUTOBAHN_EXCLUDE="9.*,12.*,13.*" autobahn build build/autobahn-wss-uring tls || rc=1
    fi
    for io in "${backends[@]}"; do
        section "Autobahn|Testsuite over ws://, quick cases (release, $io)"
        TERN_IO=$io AUTOBAHN_EXCLUDE="9.*,12.*,13.*" autobahn build build/autobahn-$io || rc=1

        section "Autobahn|Testsuite, quick cases (ASan + UBSan, $io)"
        TERN_IO=$io AUTOBAHN_EXCLUDE="9.*,12.*,13.*" autobahn build-asan build-asan/autobahn-$io || rc=1
    done

    section "Autobahn|Testsuite over wss://, quick cases (ASan + UBSan)"
    AUTOBAHN_EXCLUDE="9.*,12.*,13.*" autobahn build-asan build-asan/autobahn-wss tls || rc=1

    # The other TLS library (#28): cases 1-11 over wss:// on each back end,
    # the big messages of 9.* included (records split and joined across
    # reads and writes); 12 and 13 (permessage-deflate, 10 minutes) sit
    # above the transport and are the same code whichever library is below.
    if [ "$have_rustls" = 1 ]; then
        for io in "${backends[@]}"; do
            section "Autobahn|Testsuite over wss://, cases 1-11 (rustls, $io)"
            TERN_IO=$io AUTOBAHN_EXCLUDE="12.*,13.*" \
                autobahn build-rustls build-rustls/autobahn-wss-$io tls || rc=1
        done
    fi

    section "Autobahn|Testsuite fuzzingserver against tern's client, quick cases (ASan + UBSan)"
    AUTOBAHN_AGENT=tern AUTOBAHN_EXCLUDE="9.*,12.*,13.*" tests/autobahn/run-client \
        build-asan/tests/autobahn_client build-asan/autobahn-client || rc=1
    return $rc
}

if [ "${AUTOBAHN:-1}" != 0 ]; then
    # Two lanes side by side, each one wstest (Python) on one core: every
    # case over wss:// on the release build, the longest run (12.* and 13.*,
    # permessage-deflate, take most of its 11 minutes), and the other lane
    # (autobahn_lane), whose output prints after it. Every case over wss://
    # because the frame code is the same over either transport, and TLS
    # adds its own paths: records split across reads, input pending in the
    # TLS library, writes retried.
    tests/autobahn/setup || status=1   # the venv, once, before both start
    mkdir -p build/autobahn-client
    autobahn_lane >build/autobahn-lane.log 2>&1 &
    lane=$!

    section "Autobahn|Testsuite over wss://, all cases (release)"
    autobahn build build/autobahn-wss tls || status=1

    wait "$lane" || status=1
    cat build/autobahn-lane.log
fi

section "fuzzers"
scripts/fuzz.sh build-fuzz "${FUZZ_SECONDS:-20}" || status=1

if [ "${BENCH:-1}" != 0 ]; then
    # A smoke test of the harness and every peer (each builds, starts and
    # answers its cells), not a result: half a second a cell, where --quick
    # alone measures 1.5 s (3 s for fanout and market); full runs are
    # bench/run's own business.
    section "benchmark suites (--quick, 0.5 s a cell)"
    bench/run all --quick --seconds 0.5 || status=1
    bench/run ws-echo --quick --seconds 0.5 --client gorilla || status=1
    bench/run realtime --quick --seconds 0.5 || status=1   # not in all
fi

if [ $status -ne 0 ]; then
    section "FAILED"
    exit 1
fi
section "all tests passed"
