#!/usr/bin/env bash
# Copies the web console's npm packages (server/console/package.json,
# installed into server/console/node_modules by scripts/deps.sh) into DIR
# (default server/console/static/vendor), which berthd embeds (go:embed).
# The copies are committed, so that `go build` needs no npm; `make check`
# runs this into a temporary directory and fails when they differ.
# The sourceMappingURL comments are cut: the maps are not shipped, and a
# browser's developer tools would ask berthd for them.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$REPO/server/console/static/vendor}
NM=$REPO/server/console/node_modules
for f in @xterm/xterm/lib/xterm.js @xterm/xterm/css/xterm.css @xterm/xterm/LICENSE @xterm/addon-fit/lib/addon-fit.js @xterm/addon-fit/LICENSE; do
	[[ -f $NM/$f ]] || { echo "console-assets: $NM/$f is missing: run scripts/deps.sh (npm ci in server/console)" >&2; exit 1; }
done
mkdir -p "$OUT"
sed '/^\/\/# sourceMappingURL=/d' "$NM/@xterm/xterm/lib/xterm.js" >"$OUT/xterm.js"
sed '/^\/\/# sourceMappingURL=/d' "$NM/@xterm/addon-fit/lib/addon-fit.js" >"$OUT/addon-fit.js"
cp "$NM/@xterm/xterm/css/xterm.css" "$OUT/xterm.css"
cp "$NM/@xterm/xterm/LICENSE" "$OUT/LICENSE.xterm"
cp "$NM/@xterm/addon-fit/LICENSE" "$OUT/LICENSE.addon-fit"
