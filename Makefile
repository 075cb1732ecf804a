# tern: the two commands a newcomer needs are `make run` and `make test`.
# Both install what is missing first (scripts/install-deps.sh), then build:
# `build` and `run` only what building needs; `test` (and the sanitizer and
# fuzz builds) the test tools too; `bench` the bench peers' tools. `install`
# installs no packages.

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
ARGS       ?=
# Parallel build jobs of every build here (install's too): JOBS=N, else
# CMAKE_BUILD_PARALLEL_LEVEL from the environment (which `cmake --build -j`
# would otherwise override), else one per core.
JOBS       ?= $(or $(CMAKE_BUILD_PARALLEL_LEVEL),$(shell nproc))
WERROR     ?= $(if $(CI),ON,OFF)
PREFIX     ?= /usr/local

.PHONY: all deps deps-test deps-bench build build-asan build-fuzz build-rustls build-portable run install test consumer \
        unit integration fuzz bench clean

all: build

deps:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh test
deps-bench:
	@scripts/install-deps.sh bench

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERN_WERROR=$(WERROR) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps-test
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTERN_SANITIZE=ON -DTERN_WERROR=$(WERROR) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-fuzz: deps-test
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DTERN_FUZZ=ON -DTERN_BUILD_TESTS=OFF -DTERN_BUILD_SHARED=OFF \
	    -DTERN_INSTALL_CHECKED=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)

# Starts the demo server on its default port (8080), and HTTPS/WSS on 8443
# with a self-signed certificate made on the first run ($(BUILD)/tls/);
# ARGS="--port 9000 --root www" etc.
TLS_DIR = $(BUILD)/tls
run: build $(TLS_DIR)/cert.pem
	./$(BUILD)/tern serve --tls-cert $(TLS_DIR)/cert.pem --tls-key $(TLS_DIR)/key.pem $(ARGS)

$(TLS_DIR)/cert.pem:
	@mkdir -p $(TLS_DIR)
	@openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=localhost" \
	    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1" \
	    -keyout $(TLS_DIR)/key.pem -out $(TLS_DIR)/cert.pem 2>/dev/null
	@echo "make run: made a self-signed certificate for localhost in $(TLS_DIR)"

# Headers, libtern.so and libtern.a (and libtern-checked's), tern.pc and
# tern-checked.pc, the CMake package, the tern command, and LICENSE and
# THIRD-PARTY-NOTICES.md in share/doc/tern under PREFIX (DESTDIR=... for staging). A build of its own
# without the tests and examples, and no package installs: `sudo make
# install` changes nothing but PREFIX (the README lists what building needs).
INSTALL_BUILD ?= build-install
install:
	@cmake -S . -B $(INSTALL_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERN_BUILD_TESTS=OFF \
	    -DTERN_BUILD_EXAMPLES=OFF >/dev/null
	@cmake --build $(INSTALL_BUILD) -j $(JOBS)
	cmake --install $(INSTALL_BUILD) --prefix $(PREFIX)

# Every test: unit and integration, on the release build and again under
# AddressSanitizer + UndefinedBehaviorSanitizer, the library as an
# application uses it, Autobahn, the fuzzers briefly, the bench suites quickly.
test: deps-test deps-bench build build-asan build-fuzz build-rustls build-portable
	@scripts/test.sh

# The portable build (TERN_PORTABLE): the library and tern on POSIX.1-2008
# alone (the poll back end, src/platform/posix.c, no io_uring or systemd),
# with its unit tests; make test runs them and a part of the integration
# suite against it.
PORTABLE_BUILD ?= build-portable
build-portable: deps-test
	@cmake -S . -B $(PORTABLE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERN_PORTABLE=ON \
	    -DTERN_WERROR=$(WERROR) -DTERN_BUILD_EXAMPLES=OFF -DTERN_INSTALL_CHECKED=OFF >/dev/null
	@cmake --build $(PORTABLE_BUILD) -j $(JOBS)

# tern on rustls (TERN_TLS=rustls; OpenSSL when there is no cargo 1.85+),
# for the TLS tests' run against it in make test: the tern command, and
# the unit test of its certificate sets (test_tls_retire).
RUSTLS_BUILD ?= build-rustls
build-rustls: deps-test
	@cmake -S . -B $(RUSTLS_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERN_TLS=rustls >/dev/null
	@cmake --build $(RUSTLS_BUILD) -j $(JOBS) --target tern
	@if [ -f $(RUSTLS_BUILD)/build.ninja ] && grep -q test_tls_retire $(RUSTLS_BUILD)/build.ninja; then \
	    cmake --build $(RUSTLS_BUILD) -j $(JOBS) --target test_tls_retire; fi

unit: deps-test build
	cd $(BUILD) && ctest --output-on-failure

# The library installed and used through pkg-config, find_package and add_subdirectory.
consumer: build
	@scripts/test-consumer.sh $(BUILD)

integration: deps-test build
	TERN_BIN=$(abspath $(BUILD))/tern python3 -m pytest -q --timeout 600 tests/integration

# Runs each libFuzzer target for FUZZ_SECONDS (default 60).
fuzz: build-fuzz
	@scripts/fuzz.sh $(FUZZ_BUILD) $${FUZZ_SECONDS:-60}

# Every benchmark suite in full (about an hour on 2 cores), the gorilla-client
# cross-check, then bench/RESULTS.md and bench/plots/ from those runs.
# BENCH_ARGS="--rounds 5 --seconds 5" for longer rounds.
BENCH_ARGS ?= --rounds 3 --seconds 3
bench: deps-bench build
	bench/run all $(BENCH_ARGS)
	bench/run ws-echo --client gorilla $(BENCH_ARGS)
	bench/report

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(INSTALL_BUILD)
