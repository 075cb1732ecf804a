#!/usr/bin/env bash
# Runs each libFuzzer target in BUILD_DIR for SECONDS, starting from its
# seed corpus in tests/fuzz/corpus/<target>/ (new inputs go to a scratch
# directory, so the committed corpus stays small). Fails on any crash.
# FUZZ_JOBS targets run at a time (default: one per core; each target is
# one process on one core), and their results print in the targets' order.
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
cd "$(dirname "$0")/.."
shopt -s nullglob
targets=("$build"/tests/fuzz/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
    echo "fuzz: no targets in $build/tests/fuzz" >&2
    exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# One target: its result line in $out/NAME.line; its log's tail as well
# when it failed (and the status file $out/NAME.failed).
fuzz_one() {
    local t=$1 name seeds work
    name=$(basename "$t")
    seeds="tests/fuzz/corpus/$name"
    work=$(mktemp -d)
    if "$t" -max_total_time="$seconds" -print_final_stats=1 "$work" ${seeds:+$([ -d "$seeds" ] && echo "$seeds")} \
        >"$work.log" 2>&1; then
        printf 'fuzz: %-24s %ss ... ok (%s runs)\n' "$name" "$seconds" \
            "$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work.log" | grep -o '[0-9]*$')" >"$out/$name.line"
    else
        { printf 'fuzz: %-24s %ss ... FAILED\n' "$name" "$seconds"; tail -n 40 "$work.log"; } >"$out/$name.line"
        touch "$out/$name.failed"
    fi
    rm -rf "$work" "$work.log"
}

running=0
for t in "${targets[@]}"; do
    [ -x "$t" ] || continue
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait

status=0
for t in "${targets[@]}"; do
    name=$(basename "$t")
    [ -f "$out/$name.line" ] && cat "$out/$name.line"
    [ -f "$out/$name.failed" ] && status=1
done
exit $status
