#!/usr/bin/env bash
# Builds h2spec, the HTTP/2 conformance tester (tests/integration/test_h2spec.py),
# from the Go module proxy into build/tools/h2spec (not committed), unless
# it is there already:
#
#   scripts/install-h2spec.sh [dir]     (default: build/tools)
#
# Pinned: v2.2.1 is the newest version the module proxy serves (later tags
# have no go.mod-less "+incompatible" build there); it reports itself as
# 2.0.0. Called by install-deps.sh test, and by the test when missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/tools}
version=v2.2.1+incompatible
[ -x "$dir/h2spec" ] && exit 0
command -v go >/dev/null || { echo "install-h2spec: no go on PATH" >&2; exit 1; }
mkdir -p "$dir"
echo "install-h2spec: go install github.com/summerwind/h2spec/cmd/h2spec@$version"
(cd "${TMPDIR:-/tmp}" && GOTOOLCHAIN=local GOBIN="$dir" \
  go install "github.com/summerwind/h2spec/cmd/h2spec@$version")
