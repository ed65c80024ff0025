#!/usr/bin/env bash
# The gateway soak: one long session through a real OpenClaw gateway, as a user runs it.
#
#   scripts/soak-gateway.sh [--engine vilvona|legacy] [--window TOKENS] [--turns N] [--out DIR]
#       [--shape chars4|tokenizer|no-usage] [--summarizer extractive|host] [--slow-summarizer MS]
#       [--sessions N] [--kills N] [--stops N] [--damage index|wal|index,wal] [--spawns SPEC] [--cut-emoji]
#       [--resets TURNS] [--stand-ins none|FROM-TO] [--panel] [--cell NAME]
#       [--provider openai|anthropic] [--restart-after TURN] [--no-recall-tool] [--facts passing]
#
# One cell of the soak matrix (.ci/run runs several): the provider's shape (`chars4`: counts
# characters/4 of the messages and reports usage; `tokenizer`: ~3.3 characters a token over the
# messages and the tool schemas, the window holding the prompt plus max_tokens; `no-usage`:
# reports no usage), vilvona's summarizer (`host`: OpenClaw's model, through the plugin), a
# summarizer model that takes MS to answer (the next turn then arrives while OpenClaw's
# background maintenance runs), N sessions at once, and N SIGKILLs of the `vilvona` child
# during the session (in flight and between turns). `--damage` damages the store halfway
# through (two kinds: at a third and two thirds), turns continuing: `index` deletes the recall index's directory (it must be rebuilt
# within a minute, with fewer than 100 log lines of vilvona's after it), `wal` truncates the
# database's write-ahead log to nothing (no answered turn may be missing at the end) while a
# `vilvona ui` reads the store beside the gateway (it must answer for the last turn at the end).
# `--spawns` has the model spawn subagents through OpenClaw's `sessions_spawn` (SPEC as
# `5:fork,12:isolated:flag,20:default:delete,28:fork:nest`: the work turn, the child's context,
# a planted fact it recalls, cleanup "delete", a fork of the fork), the mock answering the
# children; bindings/openclaw/test/soak-subagents.mjs checks them (vilvona). `--cut-emoji`
# ends work turns 5, 15, 25, … in a string cut mid-emoji (a lone UTF-16 surrogate): no turn
# may be degraded to legacy. `--stops N` SIGSTOPs the `vilvona` child N times for longer than
# the plugin's call deadline (set to 5 s for the run), then lets it go on: the plugin kills
# it and starts another; at most the turn in flight a stop may fail. `--resets 10` resets the
# session after turn 10 as `/new` does (OpenClaw's `sessions.reset`, which keeps the session id
# and starts a new window of its transcript): bindings/openclaw/test/soak-resets.mjs checks that
# no request after it holds a turn or a summary of before, and that `vilvona stats --session
# KEY` shows the session as it is now, its earlier window kept under another id (vilvona).
# `--stand-ins none` (with the host summarizer) fails when any fold was published by a stand-in
# (the fallback summarizer or the truncation) while the model answered; `--stand-ins 20-35`
# has the model refuse summary requests during work turns 20 to 35, and fails unless folds of
# that stretch were published by a stand-in and none is left in the context at the end (run
# 20 turns past the stretch: each was rewritten by the model within 20 turns);
# bindings/openclaw/test/soak-stand-ins.mjs counts them (vilvona). `--panel` opens the vilvona
# panel in the gateway's Control UI in Chromium at the end (bindings/openclaw/test/ui.gateway.mjs:
# its meter, bar, charts, search, expansion and repairs); for it the mock reports what its
# prompt cache served and the model has prices per token kind, so the charts show both.
#
# `--provider anthropic` runs the session on Anthropic's Messages API (provider `anthropic`,
# `api: "anthropic-messages"`) against bindings/openclaw/test/mock-anthropic.mjs, with Anthropic
# auth in the gateway's environment, so OpenClaw applies its own defaults for that provider
# untouched (among them cache-ttl pruning, with which it commits no turn to the engine): the
# figures are Anthropic's accounting (input + 1.25 × cache writes + 0.1 × cache reads), and
# vilvona must say once per gateway process that it takes turns in without commits, and
# `vilvona doctor` must count them. `--restart-after N` stops the gateway after turn N and
# starts it again (the mock, its cache and the state stay). `--no-recall-tool` has the model
# answer only from its prompt, never calling a recall tool (a legacy run's model never does:
# legacy offers none); `--facts passing` states every planted fact in passing and asks it in
# other words (soak-session.mjs).
#
# `openclaw gateway run` serves the scripted session of bindings/openclaw/test/soak-session.mjs
# through its OpenAI-compatible endpoint (one session, one request at a time), with OpenClaw's
# full system prompt, against the mock model on 127.0.0.1 that enforces the window (a request
# above it is refused with context_length_exceeded, as a provider does) and records every
# request. vilvona is installed exactly as the README's "Use with OpenClaw" block says; `legacy`
# is OpenClaw's built-in engine, for comparison.
#
# Checks: every turn succeeds (with --kills, at most one failed turn a kill), the prompt was
# compacted at least once, every planted fact is answered at the end (from the context or from
# the recall tool), the gateway log says "quarantining" nowhere, the gateway is still up at the
# end, and (vilvona) every turn the gateway answered is in the store. Writes to DIR (default: a
# temporary directory): results.jsonl (a line per turn), mock.jsonl (every model request) and
# figures.json (turns, wall per turn, compactions, prompt tokens, prompt-cache economics).
set -euo pipefail
NAME="soak-gateway"
source "$(dirname "$0")/openclaw-env.sh"

ENGINE=vilvona
WINDOW=32000
TURNS=60
OUT=""
SHAPE=chars4
SUMMARIZER=extractive
SLOW_SUMMARIZER=0
SESSIONS=1
KILLS=0
DAMAGE=""
CELL=""
PANEL=0
SPAWNS=""
CUT_EMOJI=""
STOPS=0
RESETS=""
STAND_INS=""
PROVIDER=openai
RESTART_AFTER=0
NO_RECALL=""
FACTS_SET=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE="$2"; shift 2 ;;
    --window) WINDOW="$2"; shift 2 ;;
    --turns) TURNS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    --summarizer) SUMMARIZER="$2"; shift 2 ;;
    --slow-summarizer) SLOW_SUMMARIZER="$2"; shift 2 ;;
    --sessions) SESSIONS="$2"; shift 2 ;;
    --kills) KILLS="$2"; shift 2 ;;
    --damage) DAMAGE="$2"; shift 2 ;;
    --cell) CELL="$2"; shift 2 ;;
    --panel) PANEL=1; shift ;;
    --spawns) SPAWNS="$2"; shift 2 ;;
    --cut-emoji) CUT_EMOJI=1; shift ;;
    --stops) STOPS="$2"; shift 2 ;;
    --resets) RESETS="$2"; shift 2 ;;
    --stand-ins) STAND_INS="$2"; shift 2 ;;
    --provider) PROVIDER="$2"; shift 2 ;;
    --restart-after) RESTART_AFTER="$2"; shift 2 ;;
    --no-recall-tool) NO_RECALL=1; shift ;;
    --facts) FACTS_SET="$2"; shift 2 ;;
    *) echo "usage: $0 [--engine vilvona|legacy] [--window TOKENS] [--turns N] [--out DIR] [--shape chars4|tokenizer|no-usage] [--summarizer extractive|host] [--slow-summarizer MS] [--sessions N] [--kills N] [--stops N] [--damage index|wal|index,wal] [--spawns SPEC] [--cut-emoji] [--resets TURNS] [--stand-ins none|FROM-TO] [--panel] [--cell NAME] [--provider openai|anthropic] [--restart-after TURN] [--no-recall-tool] [--facts passing]" >&2; exit 2 ;;
  esac
done
case "$PROVIDER" in openai | anthropic) ;; *) echo "$0: --provider is openai or anthropic" >&2; exit 2 ;; esac
case "$FACTS_SET" in "" | passing) ;; *) echo "$0: --facts is passing" >&2; exit 2 ;; esac
if [ "$PROVIDER" = anthropic ] && [ "$SHAPE" != chars4 ]; then echo "$0: --shape is the OpenAI-shaped provider's; Anthropic's counts as its mock does" >&2; exit 2; fi
# Legacy offers no recall tool: its model never calls one (a call OpenClaw would refuse would
# make its conversation differ from vilvona's for nothing).
[ "$ENGINE" = legacy ] && NO_RECALL=1
export MOCK_NO_RECALL="${NO_RECALL:-0}" SOAK_FACTS="$FACTS_SET"
case "$ENGINE" in vilvona | legacy) ;; *) echo "$0: --engine is vilvona or legacy" >&2; exit 2 ;; esac
case "$SHAPE" in
  chars4) ;;
  tokenizer) export MOCK_CHARS_PER_TOKEN=3.3 MOCK_COUNT_TOOLS=1 MOCK_MAX_TOKENS=1 ;;
  no-usage) export MOCK_USAGE=0 ;;
  *) echo "$0: --shape is chars4, tokenizer or no-usage" >&2; exit 2 ;;
esac
# --damage index,wal: each kind in turn, evenly spaced over the session.
DAMAGES=()
[ -z "$DAMAGE" ] || IFS=, read -r -a DAMAGES <<<"$DAMAGE"
for kind in "${DAMAGES[@]}"; do
  case "$kind" in
    index | wal) ;;
    *) echo "$0: --damage is index, wal or both (index,wal)" >&2; exit 2 ;;
  esac
done
damages() { [[ ",$DAMAGE," == *",$1,"* ]]; }
case "$SUMMARIZER" in
  extractive) ;;
  host) [ -n "${VILVONA_SOAK_ENGINE:-}" ] || VILVONA_SOAK_ENGINE='{"summarizer": {"kind": "host"}}' ;;
  *) echo "$0: --summarizer is extractive or host" >&2; exit 2 ;;
esac
export MOCK_SUMMARIZER_DELAY_MS="$SLOW_SUMMARIZER"
# The panel's cell: the provider reports what its prompt cache served, and the model has
# prices per token kind (per million tokens, as a user configures them), which OpenClaw
# prices each call at: the panel charts both. Every other cell: no cache report, no prices.
COST="{ input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }"
if [ "$PANEL" -eq 1 ]; then
  export MOCK_CACHE=1
  COST="{ input: 3, output: 15, cacheRead: 0.3, cacheWrite: 3.75 }"
fi
case "$STAND_INS" in
  "" | none) export MOCK_SUMMARIZER_REFUSE="" ;;
  *-*) export MOCK_SUMMARIZER_REFUSE="$STAND_INS" ;;
  *) echo "$0: --stand-ins is none or FROM-TO" >&2; exit 2 ;;
esac
# The driver and the mock read the spawns from the environment (soak-session.mjs).
export SOAK_SPAWNS="$SPAWNS" SOAK_CUT_EMOJI="$CUT_EMOJI" SOAK_RESETS="$RESETS"
NAME="soak-gateway[$ENGINE, $PROVIDER, $WINDOW, $TURNS turns, $SHAPE, $SUMMARIZER summarizer${SLOW_SUMMARIZER:+, slow $SLOW_SUMMARIZER ms}, $SESSIONS sessions, $KILLS kills${DAMAGE:+, $DAMAGE damaged}${SPAWNS:+, spawns $SPAWNS}${CUT_EMOJI:+, cut emoji}${RESETS:+, reset after turn $RESETS}${STAND_INS:+, stand-ins $STAND_INS}$([ "$STOPS" -eq 0 ] || echo ", $STOPS stops")$([ "$RESTART_AFTER" -eq 0 ] || echo ", restarted after turn $RESTART_AFTER")${NO_RECALL:+, no recall tool}${FACTS_SET:+, facts $FACTS_SET}]"
# What of the run changes the model's requests without changing what the user says: runs of
# different routes are not compared (economics compare).
ROUTE="$PROVIDER, $SHAPE, $SESSIONS sessions, restarted after turn $RESTART_AFTER, reset after turn ${RESETS:-none}"
FIGURES_BIN="${VILVONA_FIGURES_BIN:-$ROOT/target/debug/economics}"
[ -x "$FIGURES_BIN" ] || fail "$FIGURES_BIN is missing (cargo build -p vilvona-benches --bin economics)"

install_openclaw
# --panel's playwright-core stays in the user's cache (make_work moves HOME).
export VILVONA_UI_CACHE="${VILVONA_UI_CACHE:-$HOME/.cache/vilvona-ui}"
make_work
OUT="${OUT:-$WORK/out}"
mkdir -p "$OUT"
: >"$OUT/results.jsonl"
: >"$OUT/mock.jsonl"
GATEWAY_PID=""
MOCK_PID=""
cleanup() {
  [ -f "$WORK/gateway.pid" ] && [ -n "$GATEWAY_PID" ] && GATEWAY_PID=$(cat "$WORK/gateway.pid")
  [ -n "$GATEWAY_PID" ] && kill "$GATEWAY_PID" 2>/dev/null && wait "$GATEWAY_PID" 2>/dev/null || true
  [ -f "$WORK/reader.pid" ] && kill "$(cat "$WORK/reader.pid")" 2>/dev/null || true
  [ -n "$MOCK_PID" ] && kill "$MOCK_PID" 2>/dev/null || true
  if [ -n "${VILVONA_SOAK_KEEP:-}" ]; then echo "$NAME: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
on_failure() {
  echo "--- the last turns ---"
  tail -n 5 "$OUT/results.jsonl" | cut -c1-600
  echo "--- gateway log: the context engine and compaction ---"
  grep -aiE "context engine|context-engine|compaction|overflow|vilvona" "$WORK/gateway.out" 2>/dev/null | tail -n 20 | cut -c1-400
  echo "--- gateway log (last lines) ---"
  tail -n 20 "$WORK/gateway.out" 2>/dev/null | cut -c1-400
}

# The workspace the `read` tool reads: the seeded source files.
mkdir -p "$WORK/workspace/src"
node --input-type=module -e '
  import { writeFileSync } from "node:fs";
  const { FILES, fileText, modulePath } = await import(process.argv[1]);
  for (let module = 1; module <= FILES; module++) writeFileSync(`${process.argv[2]}/${modulePath(module)}`, fileText(module));
' "$ROOT/bindings/openclaw/test/soak-session.mjs" "$WORK/workspace"

if [ "$PROVIDER" = anthropic ]; then
  start_mock "$OUT/mock.jsonl" "$WINDOW" mock-anthropic.mjs
  # Anthropic auth in the gateway's environment: OpenClaw applies its defaults for the
  # provider (contextPruning cache-ttl, among others), which this cell leaves untouched.
  export ANTHROPIC_API_KEY=local-test
  PROVIDERS="anthropic: { baseUrl: \"http://127.0.0.1:$MOCK_PORT\", apiKey: \"local-test\", api: \"anthropic-messages\",
      models: [{ id: \"mock-claude\", name: \"Mock Claude\", reasoning: false, input: [\"text\"],
        cost: $COST, contextWindow: $WINDOW, maxTokens: 4096 }] }"
  PRIMARY="anthropic/mock-claude"
else
  start_mock "$OUT/mock.jsonl" "$WINDOW"
  PROVIDERS="mock: { baseUrl: \"http://127.0.0.1:$MOCK_PORT/v1\", apiKey: \"local\", api: \"openai-completions\",
      models: [{ id: \"mock-1\", name: \"Mock 1\", reasoning: false, input: [\"text\"],
        cost: $COST, contextWindow: $WINDOW, maxTokens: 4096 }] }"
  PRIMARY="mock/mock-1"
fi
GATEWAY_PORT=$(free_port)
TOKEN="soak-$(date +%s)-$$"
cat >"$OPENCLAW_CONFIG_PATH" <<JSON
{
  update: { checkOnStart: false, auto: { enabled: false } },
  telemetry: { enabled: false },
  logging: { file: "$WORK/openclaw.log" },
  models: { mode: "merge", catalogRefresh: { enabled: false }, providers: { $PROVIDERS } },
  agents: { defaults: { model: { primary: "$PRIMARY" }, workspace: "$WORK/workspace" } },
  gateway: { mode: "local", port: $GATEWAY_PORT, bind: "loopback", auth: { mode: "token", token: "$TOKEN" },
    http: { endpoints: { chatCompletions: { enabled: true } } },
    // --panel: plugin UI loads (what the README's "See the context" says to set).
    controlUi: { experimental: { customPlugins: $([ "$PANEL" -eq 1 ] && echo true || echo false) } } },
  // Only vilvona may load (the README's install block sets the same), so no bundled plugin
  // (a memory plugin's pre-compaction flush turns, say) differs between the engines compared;
  // for legacy, OpenClaw's own engine, it is not installed at all.
  plugins: { allow: ["vilvona"] },
}
JSON
if [ "$ENGINE" = vilvona ]; then
  install_vilvona_as_the_readme_says
  if [ -n "${VILVONA_SOAK_ENGINE:-}" ]; then
    # Settings of the lossless engine to try (JSON), instead of its defaults.
    node -e '
      const fs = require("fs");
      const config = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
      config.plugins.entries.vilvona.config = { ...(config.plugins.entries.vilvona.config ?? {}), engine: JSON.parse(process.argv[2]) };
      fs.writeFileSync(process.argv[1], JSON.stringify(config, null, 2));
    ' "$OPENCLAW_CONFIG_PATH" "$VILVONA_SOAK_ENGINE"
  fi
  if [ "$STOPS" -gt 0 ]; then
    # A call unanswered for 5 s: the plugin takes the child as stuck.
    node -e '
      const fs = require("fs");
      const config = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
      config.plugins.entries.vilvona.config = { ...(config.plugins.entries.vilvona.config ?? {}), callTimeoutMs: 5000 };
      fs.writeFileSync(process.argv[1], JSON.stringify(config, null, 2));
    ' "$OPENCLAW_CONFIG_PATH"
  fi
fi

start_gateway() {
  step "starting the gateway"
  OPENCLAW_GATEWAY_TOKEN="$TOKEN" openclaw gateway run >>"$WORK/gateway.out" 2>&1 &
  GATEWAY_PID=$!
  # A restart happens in the driver's subshell: the file says which gateway runs now.
  echo "$GATEWAY_PID" >"$WORK/gateway.pid"
  echo "started" >>"$WORK/gateway.starts"
  wait_http "http://127.0.0.1:$GATEWAY_PORT/v1/models" 180 "$TOKEN" || fail "the gateway did not answer on 127.0.0.1:$GATEWAY_PORT within 180 s"
}

# Stops the gateway as an operator does (SIGTERM). OpenClaw drains its work before it exits
# (up to 315 s). A subagent's cleanup that it schedules after the child's end can keep that
# drain waiting on itself; past a minute the gateway is killed, and the cell says so.
stop_gateway() {
  if kill "$GATEWAY_PID" 2>/dev/null; then
    for _ in $(seq 600); do kill -0 "$GATEWAY_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$GATEWAY_PID" 2>/dev/null; then
      echo "$NAME: the gateway was still draining 60 s after SIGTERM ($(grep -a 'still draining' "$WORK/gateway.out" | tail -n 1 | sed 's/.*still draining/still draining/' | cut -c1-200)); killed"
      # Its children (the spawn broker, `vilvona serve`) go with it, by parent id.
      CHILDREN=$(ps -o pid= --ppid "$GATEWAY_PID" 2>/dev/null || true)
      kill -KILL "$GATEWAY_PID" $CHILDREN 2>/dev/null || true
    fi
    wait "$GATEWAY_PID" 2>/dev/null || true
  fi
  GATEWAY_PID=""
}

: >"$WORK/gateway.out"
start_gateway

# The `vilvona serve` children of the gateway this script started (by parent id, never by name).
vilvona_children() {
  local pid
  # The gateway that runs now (a restart happens in the driver's subshell).
  for pid in $(ps -o pid= --ppid "$(cat "$WORK/gateway.pid")" 2>/dev/null); do
    [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = vilvona ] && echo "$pid"
  done
}

# Waits until the driver has answered `$1` turns; fails when it ended first.
until_turn() {
  while [ "$(wc -l <"$OUT/results.jsonl")" -lt "$1" ]; do
    kill -0 "$DRIVER_PID" 2>/dev/null || return 1
    sleep 0.1
  done
}

# --kills: SIGKILL the child at evenly spaced turns, alternately at once (between turns, most
# often) and 0.4 s later (in flight, most often).
killer() {
  local kill=1 target pid
  while [ "$kill" -le "$KILLS" ]; do
    target=$((kill * TURNS * SESSIONS / (KILLS + 1)))
    until_turn "$target" || return 0
    [ $((kill % 2)) -eq 0 ] && sleep 0.4
    for pid in $(vilvona_children); do
      kill -KILL "$pid" 2>/dev/null && echo "killed vilvona $pid after $target turns" >>"$OUT/kills.log"
    done
    kill=$((kill + 1))
  done
}

# --stops: SIGSTOP the child at evenly spaced turns for 12 s (past the 5 s deadline), then
# SIGCONT whatever is left of it (the plugin has killed it by then).
stopper() {
  local stop=1 target pid
  while [ "$stop" -le "$STOPS" ]; do
    target=$((stop * TURNS * SESSIONS / (STOPS + 1)))
    until_turn "$target" || return 0
    sleep 0.2
    for pid in $(vilvona_children); do
      kill -STOP "$pid" 2>/dev/null && echo "stopped vilvona $pid after $target turns" >>"$OUT/stops.log"
      (sleep 12; kill -CONT "$pid" 2>/dev/null || true) &
    done
    stop=$((stop + 1))
  done
}

# --damage: the store damaged under the running gateway, each kind named at its turn (one kind
# halfway through; two at a third and two thirds). The index must be back within a minute
# (damage.log says how long it took, or that it did not come back).
damager() {
  local store="$HOME/.vilvona/agents/main/lossless" count=${#DAMAGES[@]} nth=0 kind target waited
  if damages wal; then
    until_turn "$READER_BEFORE" || return 0
    start_reader || return 0
  fi
  for kind in "${DAMAGES[@]}"; do
    nth=$((nth + 1))
    target=$((nth * TURNS * SESSIONS / (count + 1)))
    until_turn "$target" || return 0
    [ -f "$OUT/damage.at" ] || wc -l <"$WORK/gateway.out" >"$OUT/damage.at"
    case "$kind" in
    index)
      waited=0
      rm -rf "$store/index" && echo "deleted the recall index after $target turns" >>"$OUT/damage.log"
      while [ ! -f "$store/index/meta.json" ]; do
        [ "$waited" -ge 600 ] && { echo "the index was not rebuilt within 60 s" >>"$OUT/damage.log"; break; }
        sleep 0.1
        waited=$((waited + 1))
      done
      [ "$waited" -ge 600 ] || echo "rebuilt after $((waited / 10)).$((waited % 10)) s" >>"$OUT/damage.log" ;;
    wal)
      reader_finds "$READER_BEFORE" >>"$OUT/damage.log" || true
      truncate -s 0 "$store/vilvona.db-wal" && echo "truncated the WAL after $target turns" >>"$OUT/damage.log" ;;
    esac
  done
}

# With `--damage wal`, a reader holds the store beside the gateway all along, as the panel's
# server does (`vilvona ui`, which the panel's meter starts beside the engine): the cut log must
# heal with it there, and it must read the healed store by itself. `reader_finds N` asks it for
# work turn N (the panel's grep view) and says whether it found it.
start_reader() {
  "$VILVONA" --state-dir "$HOME/.vilvona" ui --port 0 >"$WORK/reader.out" 2>"$WORK/reader.err" &
  echo $! >"$WORK/reader.pid"
  for _ in $(seq 100); do grep -q "^vilvona ui: http://" "$WORK/reader.out" && return 0; sleep 0.1; done
  echo "vilvona ui did not start within 10 s: $(tail -n 3 "$WORK/reader.err")" >>"$OUT/damage.log"
  return 1
}
reader_finds() {
  node -e '
    const [line, turn] = process.argv.slice(1);
    const [, address, token] = /^vilvona ui: (http:\/\/[^/]+)\/#token=(\S+)/.exec(line);
    const view = { view: "grep", session: "agent:main:openai-user:soak", query: `refactor step ${turn}`, mode: "phrase" };
    fetch(`${address}/api/view`, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(view) })
      .then(async (response) => {
        const body = await response.text();
        const found = response.status === 200 && body.includes(`«${turn}»`);
        console.log(`the reader ${found ? "found" : "did not find"} work turn ${turn} (HTTP ${response.status}${found ? "" : `: ${body.slice(0, 200)}`})`);
        process.exit(found ? 0 : 1);
      }, (error) => { console.log(`the reader did not answer: ${error.message}`); process.exit(1); });
  ' "$(head -n 1 "$WORK/reader.out")" "$1"
}

step "driving $TURNS turns in $SESSIONS session(s)"
DRIVEN=0
: >"$OUT/kills.log"
: >"$OUT/damage.log"
: >"$OUT/results.jsonl"
# With --restart-after, the turns up to it first; the rest once the gateway is back.
drive() {
  SOAK_FROM_TURN="$1" SOAK_TO_TURN="$2" node "$ROOT/bindings/openclaw/test/soak-driver.mjs" "http://127.0.0.1:$GATEWAY_PORT" "$TOKEN" "$TURNS" "$OUT/results.jsonl" "$SESSIONS" >>"$WORK/driver.out" 2>&1
}
restarting_driver() {
  drive 1 "$RESTART_AFTER" || return $?
  step "restarting the gateway after turn $RESTART_AFTER"
  stop_gateway
  start_gateway
  drive $((RESTART_AFTER + 1)) "$TURNS"
}
if [ "$RESTART_AFTER" -gt 0 ]; then
  restarting_driver &
else
  drive 1 "$TURNS" &
fi
DRIVER_PID=$!
KILLER_PID=""
if [ "$KILLS" -gt 0 ] && [ "$ENGINE" = vilvona ]; then
  killer &
  KILLER_PID=$!
fi
STOPPER_PID=""
: >"$OUT/stops.log"
if [ "$STOPS" -gt 0 ] && [ "$ENGINE" = vilvona ]; then
  stopper &
  STOPPER_PID=$!
fi
DAMAGER_PID=""
if [ -n "$DAMAGE" ] && [ "$ENGINE" = vilvona ]; then
  if damages wal; then
    WORK_TURNS=$(node -e 'import(process.argv[1]).then((session) => console.log(session.script(Number(process.argv[2])).filter((turn) => turn.kind === "work").length))' "$ROOT/bindings/openclaw/test/soak-session.mjs" "$TURNS")
    READER_BEFORE=$((TURNS * SESSIONS / (2 * ${#DAMAGES[@]} + 2)))
  fi
  damager &
  DAMAGER_PID=$!
fi
wait "$DRIVER_PID" || DRIVEN=$?
if [ -n "$KILLER_PID" ]; then
  kill "$KILLER_PID" 2>/dev/null || true
  wait "$KILLER_PID" 2>/dev/null || true
fi
if [ -n "$DAMAGER_PID" ]; then
  wait "$DAMAGER_PID" 2>/dev/null || true
fi
if [ -n "$STOPPER_PID" ]; then
  kill "$STOPPER_PID" 2>/dev/null || true
  wait "$STOPPER_PID" 2>/dev/null || true
fi
if [ "$PANEL" -eq 1 ] && [ "$ENGINE" = vilvona ] && [ "$DRIVEN" -eq 0 ]; then
  # The panel in the gateway's own Control UI, in Chromium, while the gateway still runs.
  step "opening the vilvona panel in the Control UI"
  PLAYWRIGHT_CORE="$(bash "$ROOT/scripts/ui-browser.sh" --install-only)" \
    node "$ROOT/bindings/openclaw/test/ui.gateway.mjs" "http://127.0.0.1:$GATEWAY_PORT" "$TOKEN" "$VILVONA" "$HOME/.vilvona" "$ROOT/target/ui" \
    || fail "the vilvona panel in the Control UI (screenshots in target/ui)"
fi
if [ -n "$SPAWNS" ] && [ "$DRIVEN" -eq 0 ]; then
  # A child spawned a few turns before the end may not have run yet: stopping the gateway now
  # would drop it, which would say nothing about the engine.
  node "$ROOT/bindings/openclaw/test/soak-subagents.mjs" --settle "$OUT/mock.jsonl" 120
fi
GATEWAY_PID=$(cat "$WORK/gateway.pid")
# Legacy's own compaction, fed the mock's digests, is now and then refused by OpenClaw's own
# summary audit ("duplicate_section"; every later turn then fails with HTTP 500): a failure
# of such a run's turns is the host's, named so, and exits 4 (.ci/run runs that baseline once
# more); any other failure of the run exits 1 as ever.
AUDIT_REFUSED=0
if [ "$ENGINE" = legacy ] && grep -aq "duplicate_section" "$WORK/gateway.out"; then
  AUDIT_REFUSED=1
  echo "$NAME: OpenClaw's own compaction audit refused a summary (duplicate_section): failed turns of this run are OpenClaw's, not the engine's"
fi
GATEWAY_UP=1
kill -0 "$GATEWAY_PID" 2>/dev/null || GATEWAY_UP=0
stop_gateway
# The gateway's own logs stay with the figures, for whoever reads a surprising one.
cp "$WORK/gateway.out" "$OUT/gateway.out" 2>/dev/null || true
cp "$WORK/openclaw.log" "$OUT/openclaw.log" 2>/dev/null || true

"$FIGURES_BIN" soak --requests "$OUT/mock.jsonl" --turns "$OUT/results.jsonl" --engine "$ENGINE" --window "$WINDOW" ${CELL:+--cell "$CELL"} --host "openclaw@$OPENCLAW_VERSION" --route "$ROUTE" >"$OUT/figures.json" \
  || fail "could not compute the figures"
node -e '
  const f = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const pct = (x) => (100 * x).toFixed(1) + "%";
  console.log(`turns ok ${f.turnsOk}/${f.turns}, wall per turn ${f.wallPerTurnMs.median}/${f.wallPerTurnMs.p90} ms (median/p90), ` +
    `compactions ${f.promptRewrites}, prompt tokens per request ${Math.round(f.turnPromptTokensMean)}/${f.turnPromptTokensMax} (mean/max), ` +
    `facts ${f.factsAnswered}/${f.facts}, cache hit ${pct(f.turnCacheHitRatio)}, cached units per turn ${Math.round(f.cachedUnitsPerTurn)}, ` +
    `summarizer share ${pct(f.summarizerShare)}`);
' "$OUT/figures.json"

[ "$GATEWAY_UP" -eq 1 ] || fail "the gateway was not running at the end (it crashed): $(tail -n 5 "$OUT/gateway.out" | cut -c1-400)"
QUARANTINES=$(cat "$OUT/gateway.out" "$OUT/openclaw.log" 2>/dev/null | grep -ac "quarantining" || true)
[ "$QUARANTINES" -eq 0 ] || fail "OpenClaw quarantined the engine: $(cat "$OUT/gateway.out" "$OUT/openclaw.log" 2>/dev/null | grep -a "quarantining" | head -n 2 | cut -c1-400)"
KILLED=$(($(wc -l <"$OUT/kills.log") + $(wc -l <"$OUT/stops.log")))
if [ "$STOPS" -gt 0 ]; then
  STUCK_KILLS=$(grep -ac "was killed and is started again" "$OUT/gateway.out" || true)
  echo "$NAME: $(wc -l <"$OUT/stops.log") stop(s); the plugin killed the stopped child $STUCK_KILLS time(s)"
  [ "$(wc -l <"$OUT/stops.log")" -gt 0 ] || fail "--stops $STOPS: no vilvona child was found to stop"
  # Each stop outlasts the deadline: the plugin must have taken the child for stuck each time
  # (a stop it never noticed tests nothing).
  [ "$STUCK_KILLS" -ge "$(wc -l <"$OUT/stops.log")" ] || fail "the plugin's deadline fired $STUCK_KILLS time(s) for $(wc -l <"$OUT/stops.log") stop(s) longer than it"
fi
if [ -n "$CUT_EMOJI" ]; then
  DEGRADED=$(grep -ac "degraded to" "$OUT/gateway.out" || true)
  echo "$NAME: $DEGRADED turn(s) degraded to legacy with strings cut mid-emoji"
  [ "$DEGRADED" -eq 0 ] || fail "turns degraded to legacy: $(grep -a "degraded to" "$OUT/gateway.out" | head -n 2 | cut -c1-400)"
fi
if [ "$SLOW_SUMMARIZER" -gt 0 ]; then
  # The cell is about OpenClaw aborting background maintenance for the next turn: it must have.
  ABORTS=$(grep -ac "yielded to a foreground turn" "$OUT/gateway.out" || true)
  echo "$NAME: OpenClaw aborted background maintenance $ABORTS time(s)"
  [ "$ABORTS" -gt 0 ] || fail "OpenClaw never aborted a maintenance compaction: the cell tested no abort (a slower summarizer, or more turns)"
fi
if damages wal && [ "$ENGINE" = vilvona ]; then
  grep -q "^the reader found" "$OUT/damage.log" || fail "the reader beside the gateway did not read the store before the cut: $(head -n 1 "$OUT/damage.log")"
  reader_finds "$WORK_TURNS" >>"$OUT/damage.log" || fail "the reader beside the gateway did not read the healed store: $(tail -n 1 "$OUT/damage.log")"
fi
if [ -n "$DAMAGE" ]; then
  echo "$NAME: $(tr '\n' ' ' <"$OUT/damage.log")"
  grep -q . "$OUT/damage.log" || fail "--damage $DAMAGE: the session ended before the damage"
  ! grep -q "not rebuilt" "$OUT/damage.log" || fail "the recall index was not rebuilt within a minute"
  AFTER=$(tail -n +"$(($(cat "$OUT/damage.at") + 1))" "$OUT/gateway.out" | grep -aci "vilvona\|lossless\|recall index" || true)
  echo "$NAME: $AFTER log lines of vilvona's after the damage"
  [ "$AFTER" -lt $((100 * ${#DAMAGES[@]})) ] || fail "$AFTER log lines of vilvona's after ${#DAMAGES[@]} damage(s) (at most 99 a damage): $(tail -n 3 "$OUT/gateway.out" | cut -c1-300)"
  [ "$(grep -c "after [0-9]* turns" "$OUT/damage.log")" -eq ${#DAMAGES[@]} ] || fail "--damage $DAMAGE: the session ended before every damage: $(tr '\n' ' ' <"$OUT/damage.log")"
fi
FAILED=$(grep -vc '"status":200' "$OUT/results.jsonl" || true)
[ "$AUDIT_REFUSED" -eq 0 ] || FAIL_STATUS=4
if [ "$KILLS" -gt 0 ] || [ "$STOPS" -gt 0 ]; then
  [ "$KILLED" -gt 0 ] || fail "--kills $KILLS --stops $STOPS: no vilvona child was found to kill or stop"
  [ "$FAILED" -le "$KILLED" ] || fail "$FAILED turns failed with $KILLED kills (at most the turn in flight a kill): $(grep -v '"status":200' "$OUT/results.jsonl" | head -n 3 | cut -c1-400)"
else
  if [ "$DRIVEN" -ne 0 ]; then
    # A driver that died before it wrote a failed turn says why only in its own output.
    # (No line at all is grep's status 1: under pipefail that alone would end the script unsaid.)
    FAILED_TURNS=$(grep -v '"status":200' "$OUT/results.jsonl" | head -n 3 | cut -c1-400 || true)
    DRIVER_SAID=$(grep -a -m 1 "Error:" "$WORK/driver.out" || tail -n 5 "$WORK/driver.out")
    fail "the driver exited with status $DRIVEN after $(wc -l <"$OUT/results.jsonl") turn(s): ${FAILED_TURNS:-no turn failed; it said: $(echo "$DRIVER_SAID" | cut -c1-400 | tr '\n' ' ')}"
  fi
fi
FAIL_STATUS=1
if [ "$ENGINE" = vilvona ]; then
  # Every work turn the gateway answered is in the store: its STEP line, in its session.
  "$VILVONA" --state-dir "$HOME/.vilvona" sessions --json >"$OUT/sessions.json" || fail "vilvona sessions failed"
  node -e '
    const { execFileSync } = require("child_process");
    const fs = require("fs");
    const [binary, stateDir, results, sessionsFile, out] = process.argv.slice(1);
    const sessions = JSON.parse(fs.readFileSync(sessionsFile, "utf8"));
    const list = Array.isArray(sessions) ? sessions : sessions.sessions ?? [];
    // The store of each driver session: OpenClaw keys a session by its client user.
    const stored = new Map();
    for (const session of list) {
      const id = session.sessionId ?? session.id;
      const key = session.key ?? session.sessionKey ?? "";
      const file = `${out}/export-${id}.jsonl`;
      execFileSync(binary, ["--state-dir", stateDir, "export", "--session", id, "--out", file]);
      const user = key.split(":").pop();
      stored.set(user, (stored.get(user) ?? "") + fs.readFileSync(file, "utf8"));
      fs.rmSync(file);
    }
    const answered = fs.readFileSync(results, "utf8").split("\n").filter(Boolean).map(JSON.parse)
      .filter((turn) => turn.status === 200 && turn.kind === "work");
    // The request of each turn and its answer.
    const lost = answered.filter((turn) => {
      const held = stored.get(turn.session) ?? "";
      return !held.includes(`STEP-${turn.turn}: refactor step ${turn.turn} `) || !held.includes(`Step ${turn.turn} done:`);
    });
    console.log(`stored: ${list.length} session(s) (${[...stored.keys()].join(", ")}), ${answered.length} answered work turns, ${lost.length} missing from the store`);
    if (lost.length) { console.error(`missing from the store: ${lost.slice(0, 5).map((t) => `${t.session} turn ${t.turn}`).join(", ")}`); process.exit(1); }
    // A string cut mid-emoji reached the store with U+FFFD in place of the lone surrogate.
    if (process.env.SOAK_CUT_EMOJI) {
      const cut = answered.filter((turn) => turn.turn % 10 === 5);
      const replaced = (held) => held.includes("The deploy log said: finished \uFFFD") || held.includes("The deploy log said: finished \\ufffd");
      const missing = cut.filter((turn) => !replaced(stored.get(turn.session) ?? ""));
      console.log(`cut emoji: ${cut.length - missing.length} of ${cut.length} turns stored with U+FFFD in place of the lone surrogate`);
      if (cut.length === 0 || missing.length) { console.error(`not stored with U+FFFD: ${missing.map((t) => `turn ${t.turn}`).join(", ") || "no cut turn was answered"}`); process.exit(1); }
    }
  ' "$VILVONA" "$HOME/.vilvona" "$OUT/results.jsonl" "$OUT/sessions.json" "$OUT" || fail "acknowledged turns are missing from the store"
  if [ "$PROVIDER" = anthropic ]; then
    # OpenClaw commits no turn on this route: vilvona takes each in at the next, says so once
    # per gateway process, and doctor and the session's stats count them.
    SAID=$(grep -ac "holds turns it never committed" "$OUT/gateway.out" || true)
    STARTS=$(wc -l <"$WORK/gateway.starts")
    echo "$NAME: vilvona said $SAID time(s) in $STARTS gateway process(es) that it takes turns in without commits"
    [ "$SAID" -ge 1 ] && [ "$SAID" -le "$((STARTS * SESSIONS))" ] || fail "vilvona said $SAID time(s) that it takes in uncommitted turns (once per gateway process and session: $STARTS)"
    "$VILVONA" --state-dir "$HOME/.vilvona" doctor --json >"$OUT/doctor.json" || true
    "$VILVONA" --state-dir "$HOME/.vilvona" stats --session "agent:main:openai-user:soak" --json >"$OUT/stats.json" || fail "vilvona stats failed"
    node -e '
      const fs = require("fs");
      const doctor = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
      const stats = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
      const notice = (doctor.checks ?? []).find((check) => check.name.startsWith("turns taken in from the host"));
      const answered = fs.readFileSync(process.argv[3], "utf8").split("\n").filter(Boolean).map(JSON.parse).filter((turn) => turn.status === 200).length;
      const caught = stats.catchUp?.turns ?? 0;
      console.log(`doctor: ${notice ? notice.detail : "says nothing of the uncommitted turns"}; stats: ${caught} turns taken in of ${answered} answered`);
      if (!notice) process.exit(1);
      // Turn 1 comes on first sight; the newest turn waits for the next.
      if (caught < answered - 2) process.exit(1);
    ' "$OUT/doctor.json" "$OUT/stats.json" "$OUT/results.jsonl" || fail "doctor and the stats must count the turns taken in without commits"
  fi
  if [ -n "$RESETS" ]; then
    "$VILVONA" --state-dir "$HOME/.vilvona" stats --session "agent:main:openai-user:soak" --json >"$OUT/stats.json" || fail "vilvona stats --session agent:main:openai-user:soak failed"
    node "$ROOT/bindings/openclaw/test/soak-resets.mjs" "$OUT/mock.jsonl" "$OUT/sessions.json" "$OUT/stats.json" "$TURNS" || fail "the session reset"
  fi
  if [ -n "$STAND_INS" ]; then
    "$VILVONA" --state-dir "$HOME/.vilvona" context --session "agent:main:openai-user:soak" dag --format json >"$OUT/dag.json" || fail "vilvona context dag failed"
    node "$ROOT/bindings/openclaw/test/soak-stand-ins.mjs" "$OUT/gateway.out" "$OUT/dag.json" "$OUT/mock.jsonl" "$([ "$STAND_INS" = none ] && echo none || echo rewritten)" || fail "the stand-ins"
  fi
  if [ -n "$SPAWNS" ]; then
    # Exit 3: OpenClaw failed a child's run while its own database was held (the script says
    # which child and shows the lines); the cell exits 3 as well, and .ci/run runs it once more.
    SUBAGENTS=0
    node "$ROOT/bindings/openclaw/test/soak-subagents.mjs" "$OUT/mock.jsonl" "$OUT/gateway.out" "$OUT/sessions.json" || SUBAGENTS=$?
    [ "$SUBAGENTS" -eq 3 ] && FAIL_STATUS=3 fail "the subagents: OpenClaw failed a child's run in its own database (above)"
    [ "$SUBAGENTS" -eq 0 ] || fail "the subagents"
  fi
fi
node -e '
  const f = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const problems = [];
  if (f.turns - f.turnsOk > Number(process.argv[4])) problems.push(`${f.turns - f.turnsOk} turns failed`);
  if (f.promptRewrites < 1) problems.push("the prompt was never compacted");
  if (f.factsAnswered !== f.facts && process.argv[2] === "vilvona") problems.push(`${f.facts - f.factsAnswered} planted facts were not answered`);
  if (process.argv[2] === "vilvona" && process.argv[3] === "host" && f.summarizerRequests === 0) problems.push("the host summarizer never reached the model");
  if (problems.length) { console.error(problems.join("; ")); process.exit(1); }
' "$OUT/figures.json" "$ENGINE" "$SUMMARIZER" "$KILLED" || fail "$(head -c 1500 "$OUT/figures.json")"
step "passed"
