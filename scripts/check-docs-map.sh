#!/usr/bin/env bash
# Checks that the map and the README stay true to the tree (no build needed):
#   1. every source file under src/ (*.c, *.h) is named in the
#      "## File index" section of docs/ARCHITECTURE.md, and every src/ path
#      the map names, in the index or elsewhere, exists;
#   2. README.md's "## Examples" section names every program in examples/;
#   3. README.md and docs/ (ARCHITECTURE.md and the reference) send no
#      reader outside the repository: no path into the directory beside
#      it or the workplace, no name of the design's own files (the pattern
#      below), and every relative Markdown link resolves
#      to a file or directory inside the repository.
#
#   scripts/check-docs-map.sh
set -euo pipefail
# What a document must not name: written in pieces, so that this file does
# not name them itself (the repository is checked for them too).
outside='\.\./sh''ared|/wo''rk/|DES''IGN\.md|ANC''HORS\.md'
cd "$(dirname "$0")/.."
root=$(pwd)
map=docs/ARCHITECTURE.md
status=0
fail() { echo "   FAILED: $*"; status=1; }

# 1. The file index: the lines from "## File index" to the next "## ".
index=$(awk '/^## File index$/ {on = 1; next} on && /^## / {on = 0} on' "$map")
[ -n "$index" ] || fail "$map has no \"## File index\" section"
indexed=$(grep -oE 'src/[A-Za-z0-9_/]+\.[ch]\b' <<<"$index" | sort -u || true)
actual=$(find src -type f \( -name '*.c' -o -name '*.h' \) | sort)
while read -r f; do
    [ -n "$f" ] && fail "$f is not in $map's file index"
done < <(comm -23 <(printf '%s\n' $actual) <(printf '%s\n' $indexed))
while read -r f; do
    [ -n "$f" ] && [ ! -e "$f" ] && fail "$map names $f, which does not exist"
done < <(grep -oE 'src/[A-Za-z0-9_/]+\.(c|h|html)' "$map" | sort -u || true)

# 2. README's examples.
examples=$(awk '/^## Examples$/ {on = 1; next} on && /^## / {on = 0} on' README.md)
[ -n "$examples" ] || fail "README.md has no \"## Examples\" section"
for ex in examples/*.c; do
    name=$(basename "$ex")
    grep -qF "\`$name\`" <<<"$examples" || fail "README.md's Examples do not name $name"
done

# 3. Nothing outside the repository.
docs=(README.md)
mapfile -t -O 1 docs < <(find docs -name '*.md' | sort)
for doc in "${docs[@]}"; do
    while IFS=: read -r line text; do
        fail "$doc:$line points outside the repository: $text"
    done < <(grep -nE "$outside" "$doc" || true)
    dir=$(dirname "$doc")
    while IFS=: read -r line target; do
        case $target in http://* | https://* | mailto:* | '#'*) continue ;; esac
        path=${target%%#*}
        resolved=$(realpath -m "$dir/$path")
        if [[ $resolved != "$root" && $resolved != "$root"/* ]]; then
            fail "$doc:$line links outside the repository: $target"
        elif [ ! -e "$resolved" ]; then
            fail "$doc:$line links to $target, which does not exist"
        fi
    done < <(grep -noE '\]\([^) ]+\)' "$doc" | sed -E 's/^([0-9]+):\]\((.*)\)$/\1:\2/' || true)
done

if [ $status -ne 0 ]; then
    echo "check-docs-map: FAILED"
    exit 1
fi
echo "check-docs-map: $(wc -w <<<"$actual") source files in the map's index;" \
     "$(ls examples/*.c | wc -l) examples in README; ${#docs[@]} documents link inside the repository"
