#!/usr/bin/env bash
# Runs each libFuzzer target in BUILD_DIR for SECONDS, starting from its
# seed corpus in tests/fuzz/corpus/<target>/ (new inputs go to a scratch
# directory, so the committed corpus stays small). Fails on any crash.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
cd "$(dirname "$0")/.."
status=0
shopt -s nullglob
targets=("$build"/tests/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
    echo "fuzz: no targets in $build/tests/fuzz" >&2
    exit 1
fi
for t in "${targets[@]}"; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    seeds="tests/fuzz/corpus/$name"
    work=$(mktemp -d)
    printf 'fuzz: %-24s %ss ... ' "$name" "$seconds"
    if "$t" -max_total_time="$seconds" -print_final_stats=1 "$work" ${seeds:+$([ -d "$seeds" ] && echo "$seeds")} \
        >"$work.log" 2>&1; then
        echo "ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work.log" | grep -o '[0-9]*$') runs)"
    else
        echo "FAILED"
        tail -n 40 "$work.log"
        status=1
    fi
    rm -rf "$work" "$work.log"
done
exit $status
