#!/usr/bin/env bash
# Installs what tern needs, and only what is missing:
#
#   scripts/install-deps.sh [build] [test] [bench]     (default: build)
#
#   build  compiling and running: compiler, CMake, Ninja, pkg-config,
#          OpenSSL, zlib, hiredis, libnats, c-ares, libcurl and liburing headers
#          (make build, make run, make install);
#   test   the test tools: cmocka, clang/LLVM (fuzzers, sanitizers), curl,
#          openssl, Python test clients, Chromium, the Node and Go test
#          clients, h2spec (make build-asan, make build-fuzz, make test);
#   bench  the bench peers' tools: wrk, nginx, JDK and Maven, cargo, Go and
#          Rust crates, matplotlib (make bench; make test runs the suites
#          quickly, so it asks for test and bench).
# build is always included. Debian packages through apt-get (run as root),
# Python packages through pip. Idempotent: a second run only checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

want_test=0 want_bench=0
for g in "${@:-build}"; do
  case $g in
    build) ;;
    test) want_test=1 ;;
    bench) want_bench=1 ;;
    *) echo "usage: $0 [build] [test] [bench]" >&2; exit 2 ;;
  esac
done

# One install at a time (make -j may start several).
exec 9>"${TMPDIR:-/tmp}/tern-install-deps.lock"
flock 9

apt_pkgs=(
  build-essential cmake ninja-build pkg-config   # build
  libssl-dev zlib1g-dev                          # OpenSSL (SHA-1, base64, TLS), zlib (permessage-deflate)
  libhiredis-dev                                 # pub/sub's Redis bridge
  libnats-dev                                    # pub/sub's NATS bridge
  libc-ares-dev                                  # the WebSocket client's name resolution, on the loop
  libnghttp2-dev                                 # HTTP/2 (src/http/h2.c)
  liburing-dev                                   # the loop's io_uring back end
  libjansson-dev                                 # tern serve's JWT claims (src/app/token.c)
  libsystemd-dev                                 # tern serve's sd_notify (src/app/serve_systemd.c)
  libcurl4-openssl-dev                           # tern serve's backend proxy (src/app/http_client.c)
  openssl                                        # make run's self-signed certificate for HTTPS on 8443
)
py_mods=()   # module:package
if [ $want_test = 1 ]; then
  apt_pkgs+=(
    libcmocka-dev                                # C unit tests, run by ctest
    clang libclang-rt-14-dev llvm                # libFuzzer targets, sanitizers
    curl                                         # integration tests (openssl, from build, makes the TLS tests' certificates)
    python3 python3-pip python3-venv             # pytest; the Autobahn runner's venv (tests/autobahn)
    chromium                                     # browser WebSocket test (headless)
    redis-server                                 # pub/sub across nodes (tests/integration/test_redis.py, test_bridge_engines.py)
    nats-server                                  # pub/sub across nodes through NATS (tests/integration/test_nats.py, test_bridge_engines.py)
    systemd                                      # systemd-socket-activate, systemd-analyze (tests/integration/test_systemd.py)
    strace                                       # which system calls TLS on io_uring makes (test_backends.py)
    man-db groff-base                            # tern.1 renders and names every option (test_config.py)
  )
  # cargo 1.85+ (rustls-ffi's minimum) for make test's TERN_TLS=rustls
  # build: Debian 13's package is; Debian 12's (0.66, Rust 1.63) is not, and
  # rustup is no Debian package: then that build falls back to OpenSSL.
  if ! { command -v cargo >/dev/null &&
         dpkg --compare-versions "$(cargo --version | cut -d' ' -f2)" ge 1.85; }; then
    cand=$(apt-cache policy cargo 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -n "$cand" ] && [ "$cand" != "(none)" ] && dpkg --compare-versions "$cand" ge 1.85; then
      apt_pkgs+=(cargo)
    else
      echo "install-deps: no cargo 1.85+ here nor in apt (rustup has it): build-rustls will use OpenSSL"
    fi
  fi
  py_mods+=(pytest:pytest websockets:websockets aiohttp:aiohttp h11:h11 h2:h2
           prometheus_client:prometheus_client    # /metrics' format, checked by its own parser
           cryptography:cryptography              # ed25519: NATS operator JWTs and creds files (tests/integration/nats_jwt.py)
           pytest_timeout:pytest-timeout)         # a test that hangs fails by name (scripts/test.sh)
fi
if [ $want_bench = 1 ]; then
  apt_pkgs+=(
    wrk                                          # HTTP bench client
    nginx                                        # bench peer: /ping, and the proxy suite
    nghttp2-client                               # h2load, the h2 suite's client
    h2o                                          # bench peer of the h2 suite
    python3 python3-pip                          # bench/run, bench/report
  )
  py_mods+=(matplotlib:matplotlib)               # bench/report's plots
  # The Java and Rust bench peers (bench/peers/netty, bench/peers/rust) need a
  # JDK with Maven and cargo; the machine image has them (cargo from rustup).
  # Where one is missing, Debian's packages stand in.
  command -v mvn >/dev/null || apt_pkgs+=(maven)
  command -v javac >/dev/null || apt_pkgs+=(default-jdk-headless)
  command -v cargo >/dev/null || apt_pkgs+=(cargo)
fi

missing=()
for p in $(printf '%s\n' "${apt_pkgs[@]}" | sort -u); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages, for the python3 on PATH (the one pytest and bench/run
# run under).
if [ ${#py_mods[@]} -gt 0 ]; then
  py=python3
  imports=$(printf '%s\n' "${py_mods[@]}" | cut -d: -f1 | paste -sd,)
  need_py=()
  if ! $py -c "import $imports" 2>/dev/null; then
    for m in "${py_mods[@]}"; do
      mod=${m%%:*}; pkg=${m##*:}
      $py -c "import $mod" 2>/dev/null || need_py+=("$pkg")
    done
  fi
  if [ ${#need_py[@]} -gt 0 ]; then
    echo "install-deps: pip install ${need_py[*]}"
    $py -m pip install -q --disable-pip-version-check ${PIP_FLAGS:-} "${need_py[@]}" 2>/dev/null \
      || $py -m pip install -q --disable-pip-version-check --break-system-packages "${need_py[@]}"
  fi
fi

# Node and Go WebSocket clients of the integration tests (tests/clients/),
# the JavaScript client's test dependency (clients/js),
# and the Go and Rust bench peers' modules. All come from their registries,
# pinned by lockfiles; Node 20, Go and cargo are on the machine image. The
# tests fetch the test clients too when missing; doing it here keeps the
# first test run fast and says early when a registry is down.
gomod() { (cd "$root/$1" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go mod download); }
if [ $want_test = 1 ]; then
  if command -v npm >/dev/null && [ ! -d "$root/tests/clients/node/node_modules/ws" ]; then
    echo "install-deps: npm ci (tests/clients/node)"
    (cd "$root/tests/clients/node" && npm ci --no-audit --no-fund --silent)
  fi
  if command -v npm >/dev/null && [ ! -d "$root/clients/js/node_modules/ws" ]; then
    echo "install-deps: npm ci (clients/js: ws, for its tests on Node 20)"
    (cd "$root/clients/js" && npm ci --no-audit --no-fund --silent)
  fi
  if command -v go >/dev/null; then
    gomod tests/clients/go
    "$root/scripts/install-h2spec.sh"   # HTTP/2 conformance (test_h2spec.py), into build/tools
  fi
fi
if [ $want_bench = 1 ]; then
  if command -v go >/dev/null; then gomod bench/clients; gomod bench/peers; fi
  # The Rust bench peers' crates, pinned by bench/peers/rust/Cargo.lock (the
  # Netty peer's jars come with its Maven build, run by bench/run).
  if command -v cargo >/dev/null; then
    cargo fetch --locked -q --manifest-path "$root/bench/peers/rust/Cargo.toml"
  fi
fi
