#!/usr/bin/env bash
# Checks that the reference in docs/api/ matches the built library:
#   1. every function libtern.so exports (nm -D) has a heading on exactly
#      one page of docs/api/;
#   2. every function a heading names is still exported;
#   3. every page has the fixed sections, and its example, a file of
#      examples/ named on a line "Example: [`examples/NAME.c`](...)",
#      exists and builds (the CMake target example_NAME, so it is compiled
#      with the project's flags against the library just built).
# A function's heading is a line starting with "### " that names it with
# parentheses: "### `tern_loop_new()`" (one heading may name several).
#
#   scripts/check-api-docs.sh [BUILD]     BUILD: a configured, built tree (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lib=$build/libtern.so
pages=(docs/api/*.md)
status=0
fail() { echo "   FAILED: $*"; status=1; }

[ -e "$lib" ] || { echo "check-api-docs: $lib not found: build first"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tern-api-docs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^tern_/ {print $3}' | sort -u >"$tmp/exported"

# page<TAB>function for every function named in a "### " heading.
for page in "${pages[@]}"; do
    grep '^### ' "$page" | grep -o 'tern_[a-z0-9_]*()' | tr -d '()' | sed "s|^|$page\t|" || true
done | sort -u >"$tmp/headings"
cut -f2 "$tmp/headings" | sort >"$tmp/documented"

while read -r fn; do
    fail "$fn is exported but has no heading in docs/api/"
done < <(comm -23 "$tmp/exported" <(sort -u "$tmp/documented"))
while read -r fn; do
    fail "$fn has a heading on $(grep -P "\t$fn\$" "$tmp/headings" | cut -f1 | tr '\n' ' ')but is not exported"
done < <(comm -13 "$tmp/exported" <(sort -u "$tmp/documented"))
while read -r fn; do
    fail "$fn has a heading on more than one page: $(grep -P "\t$fn\$" "$tmp/headings" | cut -f1 | tr '\n' ' ')"
done < <(uniq -d "$tmp/documented")

sections=("## What it is" "## Data types" "## Public members" "## API" "## Lifetime rules"
          "## May be called from any thread" "## Example")
targets=()
for page in "${pages[@]}"; do
    case $page in docs/api/README.md | docs/api/lifetimes-and-threads.md) continue ;; esac
    for s in "${sections[@]}"; do
        grep -qxF "$s" "$page" || fail "$page has no section \"$s\""
    done
    examples=$(grep -o '^Example: \[`examples/[a-z0-9_]*\.c`\]' "$page" | grep -o 'examples/[a-z0-9_]*\.c' || true)
    [ -n "$examples" ] || fail "$page names no example (a line \"Example: [\`examples/NAME.c\`](../../examples/NAME.c)\")"
    for ex in $examples; do
        if [ -f "$ex" ]; then
            targets+=("example_$(basename "$ex" .c)")
        else
            fail "$page names $ex, which does not exist"
        fi
    done
done

if [ ${#targets[@]} -gt 0 ]; then
    mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
    if ! cmake --build "$build" --target "${targets[@]}" >"$tmp/build.log" 2>&1; then
        fail "an example does not build:"; sed 's/^/   | /' "$tmp/build.log"
    fi
fi

if [ $status -ne 0 ]; then
    echo "check-api-docs: FAILED"
    exit 1
fi
echo "check-api-docs: $(wc -l <"$tmp/exported") exported functions, each on one page;" \
     "${#targets[@]} examples build"
