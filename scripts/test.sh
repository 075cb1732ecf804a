#!/usr/bin/env bash
# Runs every test: called by `make test` after the three builds.
#   1. unit tests (ctest) and integration tests (pytest) on the release build;
#   2. the same on the ASan+UBSan build, where any sanitizer report fails;
#   3. each libFuzzer target for FUZZ_SECONDS (default 30) from its corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# A sanitizer report must fail the run, leaks included.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=23:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=23"

status=0
section() { printf '\n==== %s ====\n' "$*"; }

section "unit tests (release)"
(cd build && ctest --output-on-failure) || status=1

section "integration tests (release)"
TERN_BIN="$root/build/tern" python3 -m pytest -q -p no:cacheprovider tests/integration || status=1

section "unit tests (ASan + UBSan)"
(cd build-asan && ctest --output-on-failure) || status=1

section "integration tests (ASan + UBSan)"
TERN_BIN="$root/build-asan/tern" TERN_SANITIZED=1 \
    python3 -m pytest -q -p no:cacheprovider tests/integration || status=1

section "fuzzers"
scripts/fuzz.sh build-fuzz "${FUZZ_SECONDS:-30}" || status=1

if [ $status -ne 0 ]; then
    section "FAILED"
    exit 1
fi
section "all tests passed"
