#!/usr/bin/env python3
"""Writes `tern serve --help`'s option list into README.md, between its
markers (tests/integration/test_config.py checks they agree).
Usage: scripts/readme-options.py [TERN_BIN] (default: build/tern)."""
import os
import re
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
tern = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "tern")
listed = subprocess.run([tern, "serve", "--help"], capture_output=True, text=True,
                        check=True).stdout.split("\n", 2)[2]
path = os.path.join(root, "README.md")
with open(path) as f:
    text = f.read()
new, n = re.subn(r"(<!-- options: .*? -->\n```\n).*?(```\n<!-- end of options -->)",
                 lambda m: m.group(1) + listed + m.group(2), text, flags=re.S)
if n != 1:
    sys.exit("README.md: no option list between the markers")
with open(path, "w") as f:
    f.write(new)
