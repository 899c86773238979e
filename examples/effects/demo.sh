#!/usr/bin/env bash
# The effect-ledger demo: a script that opens a pull request and then tells the team, through an API
# that takes idempotency keys, is interrupted (its worker killed with kill -9) between the two; the
# run is resumed, the model runs the script again, and the pull request is not opened twice: the
# ledger answers "done" with the first result, and only the message is sent. Scripted model, no API
# key, the embedded default storage. Usage: examples/effects/demo.sh (CAIRN_CLI overrides the command).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-effects-demo-XXXXXX")
mkdir -p "$work/repo"
read -r -a cairn <<< "${CAIRN_CLI:-node $here/../../bin/cairn.js}"
node "$here/model.mjs" "$here/open-pr.py" > "$work/model.json"
common=(--db effects --data-dir "$work/.cairn" --model "scripted:$work/model.json")
echo "demo: workspace $work/repo; database in $work/.cairn"

echo "demo: first run; its worker is killed between the script's two effects"
touch "$work/repo/.demo-crash-here"
"${cairn[@]}" run "Open the pull request, then tell the team" --cwd "$work/repo" "${common[@]}" &
worker=$!
for _ in $(seq 1 1200); do [ -e "$work/repo/.between-effects" ] && break; sleep 0.1; done
[ -e "$work/repo/.between-effects" ] || { echo "demo: the script never reached its pause" >&2; kill -9 "$worker"; exit 1; }
kill -9 "$worker"
wait "$worker" 2>/dev/null || true
echo "demo: killed (kill -9). The API holds: $(cd "$work/repo/api" && ls | tr "\n" " ")"

echo "demo: resume"
"${cairn[@]}" resume "${common[@]}"
echo "demo: the API holds: $(cd "$work/repo/api" && ls | tr "\n" " ")"
"${cairn[@]}" status "${common[@]:0:4}"
