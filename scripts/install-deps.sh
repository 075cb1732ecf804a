#!/usr/bin/env bash
# Installs what tern needs to build and test, and only what is missing.
# Debian packages through apt-get (run as root), Python test packages through pip.
# Idempotent: a second run only checks, in about a second.
set -euo pipefail

apt_pkgs=(
  build-essential cmake ninja-build pkg-config   # build
  libssl-dev zlib1g-dev                          # OpenSSL (SHA-1, base64, TLS), zlib (permessage-deflate)
  libcmocka-dev                                  # C unit tests, run by ctest
  clang libclang-rt-14-dev llvm                  # libFuzzer targets, sanitizers
  curl wrk python3 python3-pip python3-venv      # integration tests, first speed figures
  chromium                                       # browser WebSocket test (headless)
  nginx                                          # bench peer: /ping, and the proxy suite
  openssl                                        # bench/run: the TLS suites' self-signed certificate
)
# The Java and Rust bench peers (bench/peers/netty, bench/peers/rust) need a
# JDK with Maven and cargo; the machine image has them (cargo from rustup).
# Where one is missing, Debian's packages stand in.
command -v mvn >/dev/null || apt_pkgs+=(maven)
command -v javac >/dev/null || apt_pkgs+=(default-jdk-headless)
command -v cargo >/dev/null || apt_pkgs+=(cargo)

missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python test clients, and matplotlib for bench/report's plots. Use the
# python3 on PATH (the one pytest will run under).
py=python3
need_py=()
for m in pytest:pytest websockets:websockets aiohttp:aiohttp h11:h11 matplotlib:matplotlib; do
  mod=${m%%:*}; pkg=${m##*:}
  $py -c "import $mod" 2>/dev/null || need_py+=("$pkg")
done
if [ ${#need_py[@]} -gt 0 ]; then
  echo "install-deps: pip install ${need_py[*]}"
  $py -m pip install -q --disable-pip-version-check ${PIP_FLAGS:-} "${need_py[@]}" 2>/dev/null \
    || $py -m pip install -q --disable-pip-version-check --break-system-packages "${need_py[@]}"
fi

# Node and Go WebSocket clients of the integration tests (tests/clients/).
# Both come from their registries, pinned by lockfiles; Node 20 and Go are
# on the machine image. The tests fetch them too when missing; doing it here
# keeps the first test run fast and says early when a registry is down.
root=$(cd "$(dirname "$0")/.." && pwd)
if command -v npm >/dev/null && [ ! -d "$root/tests/clients/node/node_modules/ws" ]; then
  echo "install-deps: npm ci (tests/clients/node)"
  (cd "$root/tests/clients/node" && npm ci --no-audit --no-fund --silent)
fi
if command -v go >/dev/null; then
  (cd "$root/tests/clients/go" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go mod download)
  (cd "$root/bench/clients" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go mod download)
  (cd "$root/bench/peers" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go mod download)
fi
# The Rust bench peers' crates, pinned by bench/peers/rust/Cargo.lock (the
# Netty peer's jars come with its Maven build, run by bench/run).
if command -v cargo >/dev/null; then
  cargo fetch --locked -q --manifest-path "$root/bench/peers/rust/Cargo.toml"
fi
