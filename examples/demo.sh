#!/usr/bin/env bash
# The 60-second demo: a scripted agent fixes a failing test in a copy of examples/calc, on the
# embedded default storage (local SQLite), with no API key. Usage: examples/demo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-demo-XXXXXX")
cp -r "$here/calc" "$work/calc"
echo "demo: working copy in $work/calc; database in $work/.cairn"
exec node "$here/../bin/cairn.js" run "Make the tests in this project pass" \
  --db demo --data-dir "$work/.cairn" --cwd "$work/calc" \
  --model "scripted:$here/fix-calc.json" \
  --validator "python3 -m unittest discover -s tests -q"
