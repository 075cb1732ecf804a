#!/usr/bin/env bash
# Builds and runs tests/consumer/consumer.c the ways an application uses tern:
#   1. installed (cmake --install BUILD --prefix TMP), through pkg-config:
#      shared, and static (pkg-config --static, libtern.a);
#   2. installed, through find_package(tern) in a CMake project: tern::tern
#      (shared), then with TERN_USE_STATIC=ON;
#   3. add_subdirectory of this source tree (tern builds only its library
#      and leaks no flags into the parent);
#   4. every examples/*.c built against the installed library (the ones
#      that end by themselves, timers and errors, also run);
#   5. the checked library installed beside the release one: consumer.c
#      through pkg-config tern-checked (shared and static) and
#      find_package's tern::tern-checked, and tests/consumer/misuse.c, whose
#      second tern_timer_stop must abort naming the call.
# Also checks that libtern.so and libtern-checked.so export only the public
# tern_* API.
#
#   scripts/test-consumer.sh [BUILD]     BUILD: a configured, built tree (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=$(cd "${1:-build}" && pwd)
cc=${CC:-cc}
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tern-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
src=$root/tests/consumer/consumer.c
status=0
step() { printf -- '-- %s\n' "$*"; }
logged() {  # logged LOG COMMAND...: runs it, shows the log and stops if it fails
    local log=$1; shift
    "$@" >>"$log" 2>&1 || { echo "   FAILED: $*"; sed 's/^/   | /' "$log"; exit 1; }
}
check() {  # check NAME PROGRAM: runs it, records a failure
    local name=$1; shift
    if out=$("$@" 2>&1); then
        echo "   ok: $name: $out"
    else
        echo "   FAILED: $name"; echo "$out" | sed 's/^/   | /'; status=1
    fi
}

step "install into $prefix"
logged "$tmp/install.log" cmake --install "$build" --prefix "$prefix"
lib=$(dirname "$(find "$prefix" -name 'libtern.so.*.*.*' | head -n1)")
pcdir=$(dirname "$(find "$prefix" -name tern.pc | head -n1)")
for f in "$prefix/include/tern/tern.h" "$lib/libtern.a" "$lib/libtern.so" "$pcdir/tern.pc" \
         "$lib/libtern-checked.a" "$lib/libtern-checked.so" "$pcdir/tern-checked.pc" \
         "$lib/cmake/tern/ternConfig.cmake" "$lib/cmake/tern/ternConfigVersion.cmake" \
         "$prefix/share/doc/tern/LICENSE" "$prefix/share/doc/tern/THIRD-PARTY-NOTICES.md"; do
    [ -e "$f" ] || { echo "   FAILED: $f was not installed"; status=1; }
done
# The licence, where a packager and pkg-config look for it.
cmp -s LICENSE "$prefix/share/doc/tern/LICENSE" || { echo "   FAILED: the installed LICENSE differs"; status=1; }
for name in tern tern-checked; do
    grep -qx 'License: MIT' "$pcdir/$name.pc" || { echo "   FAILED: $name.pc has no License: MIT"; status=1; }
done
for name in tern tern-checked; do
    soname=$(readelf -d "$lib/lib$name.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$soname" = "lib$name.so.0" ] || { echo "   FAILED: lib$name.so's SONAME is '$soname'"; status=1; }
done

for name in tern tern-checked; do
    step "lib$name.so exports only tern_* (not tern__*)"
    extra=$(nm -D --defined-only "$lib/lib$name.so" | awk '{print $3}' \
            | grep -v -e '^tern_' -e '^_init$' -e '^_fini$' -e '^_edata$' -e '^_end$' -e '^__bss_start$' || true)
    internal=$(nm -D --defined-only "$lib/lib$name.so" | awk '{print $3}' | grep '^tern__' || true)
    if [ -n "$extra$internal" ]; then
        echo "   FAILED: exported beyond the public API:"; echo "$extra$internal" | sed 's/^/   | /'; status=1
    else
        echo "   ok: $(nm -D --defined-only "$lib/lib$name.so" | grep -c ' tern_') tern_* symbols"
    fi
done

export PKG_CONFIG_PATH=$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

step "pkg-config, shared"
# shellcheck disable=SC2046
$cc "${cflags[@]}" -o "$tmp/pc-shared" "$src" $(pkg-config --cflags --libs tern)
readelf -d "$tmp/pc-shared" | grep -q 'NEEDED.*libtern.so.0' \
    || { echo "   FAILED: pc-shared does not need libtern.so.0"; status=1; }
check "pkg-config --libs tern" env LD_LIBRARY_PATH="$lib" "$tmp/pc-shared"

step "examples/*.c against the installed library (pkg-config, shared)"
# Each example is a program an application could be: it builds with the
# installed headers and library alone. Those that end by themselves run.
for ex in examples/*.c; do
    name=$(basename "$ex" .c)
    # shellcheck disable=SC2046
    if ! $cc -std=gnu11 -Wall -Werror -o "$tmp/ex-$name" "$ex" $(pkg-config --cflags --libs tern) \
            >"$tmp/ex-$name.log" 2>&1; then
        echo "   FAILED: $ex does not build against the installed library"
        sed 's/^/   | /' "$tmp/ex-$name.log"; status=1
    fi
done
for name in timers errors; do
    if [ -x "$tmp/ex-$name" ]; then
        check "examples/$name.c runs" env LD_LIBRARY_PATH="$lib" "$tmp/ex-$name"
    fi
done
echo "   ok: $(ls "$tmp"/ex-*.log | wc -l) examples built"

step "pkg-config --static, libtern.a"
libs=$(pkg-config --static --libs tern)
libs=${libs/-ltern/-l:libtern.a}   # the archive, though libtern.so is beside it
# shellcheck disable=SC2046,SC2086
$cc "${cflags[@]}" -o "$tmp/pc-static" "$src" $(pkg-config --cflags tern) $libs
if readelf -d "$tmp/pc-static" | grep -q 'NEEDED.*libtern'; then
    echo "   FAILED: pc-static needs libtern.so"; status=1
fi
check "pkg-config --static --libs tern" "$tmp/pc-static"

step "pkg-config, checked (libtern-checked.so)"
# shellcheck disable=SC2046
$cc "${cflags[@]}" -o "$tmp/pc-checked" "$src" $(pkg-config --cflags --libs tern-checked)
readelf -d "$tmp/pc-checked" | grep -q 'NEEDED.*libtern-checked.so.0' \
    || { echo "   FAILED: pc-checked does not need libtern-checked.so.0"; status=1; }
check "pkg-config --libs tern-checked" env LD_LIBRARY_PATH="$lib" "$tmp/pc-checked"

step "pkg-config --static, checked (libtern-checked.a)"
libs=$(pkg-config --static --libs tern-checked)
libs=${libs/-ltern-checked/-l:libtern-checked.a}
# shellcheck disable=SC2046,SC2086
$cc "${cflags[@]}" -o "$tmp/pc-checked-static" "$src" $(pkg-config --cflags tern-checked) $libs
if readelf -d "$tmp/pc-checked-static" | grep -q 'NEEDED.*libtern'; then
    echo "   FAILED: pc-checked-static needs a libtern .so"; status=1
fi
check "pkg-config --static --libs tern-checked" "$tmp/pc-checked-static"

step "checked: a second tern_timer_stop aborts naming the call"
# shellcheck disable=SC2046
$cc "${cflags[@]}" -o "$tmp/misuse" "$root/tests/consumer/misuse.c" \
    $(pkg-config --cflags --libs tern-checked)
set +e
out=$(env LD_LIBRARY_PATH="$lib" "$tmp/misuse" 2>&1)
rc=$?
set -e
if [ $rc -eq 134 ] && printf '%s\n' "$out" | grep -q '^tern: tern_timer_stop: '; then
    echo "   ok: aborted: $(printf '%s\n' "$out" | head -n1)"
else
    echo "   FAILED: misuse exited $rc (not SIGABRT, naming tern_timer_stop):"
    printf '%s\n' "$out" | sed 's/^/   | /'; status=1
fi

step "find_package(tern), tern::tern (shared)"
logged "$tmp/fp-shared.log" cmake -S tests/consumer -B "$tmp/fp-shared" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix"
logged "$tmp/fp-shared.log" cmake --build "$tmp/fp-shared"
readelf -d "$tmp/fp-shared/consumer" | grep -q 'NEEDED.*libtern.so.0' \
    || { echo "   FAILED: find_package consumer does not need libtern.so.0"; status=1; }
check "find_package(tern)" "$tmp/fp-shared/consumer"

step "find_package(tern), TERN_USE_STATIC=ON"
logged "$tmp/fp-static.log" cmake -S tests/consumer -B "$tmp/fp-static" "${gen[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" -DTERN_USE_STATIC=ON
logged "$tmp/fp-static.log" cmake --build "$tmp/fp-static"
if readelf -d "$tmp/fp-static/consumer" | grep -q 'NEEDED.*libtern'; then
    echo "   FAILED: static find_package consumer needs libtern.so"; status=1
fi
check "find_package(tern) static" "$tmp/fp-static/consumer"

step "find_package(tern COMPONENTS checked), tern::tern-checked (shared)"
logged "$tmp/fp-checked.log" cmake -S tests/consumer -B "$tmp/fp-checked" "${gen[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" -DTERN_CONSUMER_CHECKED=ON
logged "$tmp/fp-checked.log" cmake --build "$tmp/fp-checked"
readelf -d "$tmp/fp-checked/consumer" | grep -q 'NEEDED.*libtern-checked.so.0' \
    || { echo "   FAILED: checked find_package consumer does not need libtern-checked.so.0"; status=1; }
check "find_package(tern) checked" "$tmp/fp-checked/consumer"

step "add_subdirectory($root)"
logged "$tmp/sub.log" cmake -S tests/consumer -B "$tmp/sub" "${gen[@]}" -DTERN_SOURCE_DIR="$root"
logged "$tmp/sub.log" cmake --build "$tmp/sub" -j "${JOBS:-2}"
[ -e "$tmp/sub/tern/libtern.a" ] && [ ! -e "$tmp/sub/libtern.a" ] \
    || { echo "   FAILED: tern's outputs are not in its own binary dir"; status=1; }
check "add_subdirectory" "$tmp/sub/consumer"

if [ $status -ne 0 ]; then
    echo "consumer: FAILED"
    exit 1
fi
echo "consumer: all builds passed"
