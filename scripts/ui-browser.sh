#!/usr/bin/env bash
# The panel in a real browser: Debian's Chromium (installed with apt when missing) driven by
# playwright-core (from npm, cached; browser downloads are impossible here) against
# `vilvona ui` on a replayed session. Screenshots and timings land in target/ui/.
#   scripts/ui-browser.sh                 (uses target/debug/vilvona, or $VILVONA_BIN)
#   scripts/ui-browser.sh --install-only  (prints where playwright-core is; soak-gateway.sh --panel)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VILVONA_UI_CACHE:-$HOME/.cache/vilvona-ui}"
PLAYWRIGHT_VERSION="1.64.1"
export VILVONA_BIN="${VILVONA_BIN:-$ROOT/target/debug/vilvona}"
if [ ! -x /usr/bin/chromium ]; then
  echo "ui-browser: installing Debian's chromium" >&2
  mkdir -p "$ROOT/target"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >"$ROOT/target/apt-chromium.log" 2>&1 \
    || { echo "ui-browser: could not install chromium with apt (see target/apt-chromium.log)" >&2; exit 1; }
fi
if [ ! -f "$CACHE/node_modules/playwright-core/package.json" ]; then
  echo "ui-browser: installing playwright-core@$PLAYWRIGHT_VERSION" >&2
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-save --no-audit --no-fund "playwright-core@$PLAYWRIGHT_VERSION" >"$CACHE/install.log" 2>&1 \
    || { echo "ui-browser: could not install playwright-core (see $CACHE/install.log)" >&2; exit 1; }
fi
export PLAYWRIGHT_CORE="$CACHE/node_modules/playwright-core"
if [ "${1:-}" = --install-only ]; then echo "$PLAYWRIGHT_CORE"; exit 0; fi
[ -x "$VILVONA_BIN" ] || { echo "ui-browser: build vilvona first (cargo build -p vilvona): $VILVONA_BIN is missing" >&2; exit 1; }
node --test "$ROOT/bindings/openclaw/test/ui.browser.mjs"
