#!/usr/bin/env bash
# The gateway soak: one long session through a real OpenClaw gateway, as a user runs it.
#
#   scripts/soak-gateway.sh [--engine vilvona|legacy] [--window TOKENS] [--turns N] [--out DIR]
#
# `openclaw gateway run` serves the scripted session of bindings/openclaw/test/soak-session.mjs
# through its OpenAI-compatible endpoint (one session, one request at a time), with OpenClaw's
# full system prompt, against the mock model on 127.0.0.1 that enforces the window (a request
# above it is refused with context_length_exceeded, as a provider does) and records every
# request. vilvona is installed exactly as the README's "Use with OpenClaw" block says; `legacy`
# is OpenClaw's built-in engine, for comparison.
#
# Checks: every turn succeeds, the prompt was compacted at least once, and every planted fact is
# answered at the end (from the context or from the recall tool). Writes to DIR (default: a
# temporary directory): results.jsonl (a line per turn), mock.jsonl (every model request) and
# figures.json (turns, wall per turn, compactions, prompt tokens, prompt-cache economics).
set -euo pipefail
NAME="soak-gateway"
source "$(dirname "$0")/openclaw-env.sh"

ENGINE=vilvona
WINDOW=32000
TURNS=60
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE="$2"; shift 2 ;;
    --window) WINDOW="$2"; shift 2 ;;
    --turns) TURNS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--engine vilvona|legacy] [--window TOKENS] [--turns N] [--out DIR]" >&2; exit 2 ;;
  esac
done
case "$ENGINE" in vilvona | legacy) ;; *) echo "$0: --engine is vilvona or legacy" >&2; exit 2 ;; esac
NAME="soak-gateway[$ENGINE, $WINDOW, $TURNS turns]"
FIGURES_BIN="${VILVONA_FIGURES_BIN:-$ROOT/target/debug/economics}"
[ -x "$FIGURES_BIN" ] || fail "$FIGURES_BIN is missing (cargo build -p vilvona-benches --bin economics)"

install_openclaw
make_work
OUT="${OUT:-$WORK/out}"
mkdir -p "$OUT"
: >"$OUT/results.jsonl"
: >"$OUT/mock.jsonl"
GATEWAY_PID=""
MOCK_PID=""
cleanup() {
  [ -n "$GATEWAY_PID" ] && kill "$GATEWAY_PID" 2>/dev/null && wait "$GATEWAY_PID" 2>/dev/null || true
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

start_mock "$OUT/mock.jsonl" "$WINDOW"
GATEWAY_PORT=$(free_port)
TOKEN="soak-$(date +%s)-$$"
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
  gateway: { mode: "local", port: $GATEWAY_PORT, bind: "loopback", auth: { mode: "token", token: "$TOKEN" },
    http: { endpoints: { chatCompletions: { enabled: true } } } },
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
fi

step "starting the gateway"
OPENCLAW_GATEWAY_TOKEN="$TOKEN" openclaw gateway run >"$WORK/gateway.out" 2>&1 &
GATEWAY_PID=$!
wait_http "http://127.0.0.1:$GATEWAY_PORT/v1/models" 180 "$TOKEN" || fail "the gateway did not answer on 127.0.0.1:$GATEWAY_PORT within 180 s"

step "driving $TURNS turns"
DRIVEN=0
node "$ROOT/bindings/openclaw/test/soak-driver.mjs" "http://127.0.0.1:$GATEWAY_PORT" "$TOKEN" "$TURNS" "$OUT/results.jsonl" >"$WORK/driver.out" 2>&1 || DRIVEN=$?
kill "$GATEWAY_PID" 2>/dev/null && wait "$GATEWAY_PID" 2>/dev/null || true
GATEWAY_PID=""
# The gateway's own logs stay with the figures, for whoever reads a surprising one.
cp "$WORK/gateway.out" "$OUT/gateway.out" 2>/dev/null || true
cp "$WORK/openclaw.log" "$OUT/openclaw.log" 2>/dev/null || true

"$FIGURES_BIN" soak --requests "$OUT/mock.jsonl" --turns "$OUT/results.jsonl" --engine "$ENGINE" --window "$WINDOW" >"$OUT/figures.json" \
  || fail "could not compute the figures"
node -e '
  const f = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const pct = (x) => (100 * x).toFixed(1) + "%";
  console.log(`turns ok ${f.turnsOk}/${f.turns}, wall per turn ${f.wallPerTurnMs.median}/${f.wallPerTurnMs.p90} ms (median/p90), ` +
    `compactions ${f.promptRewrites}, prompt tokens per request ${Math.round(f.turnPromptTokensMean)}/${f.turnPromptTokensMax} (mean/max), ` +
    `facts ${f.factsAnswered}/${f.facts}, cache hit ${pct(f.turnCacheHitRatio)}, cached units per turn ${Math.round(f.cachedUnitsPerTurn)}, ` +
    `summarizer share ${pct(f.summarizerShare)}`);
' "$OUT/figures.json"

[ "$DRIVEN" -eq 0 ] || fail "turns failed: $(grep -v '"status":200' "$OUT/results.jsonl" | head -n 3 | cut -c1-400)"
node -e '
  const f = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const problems = [];
  if (f.turnsOk !== f.turns) problems.push(`${f.turns - f.turnsOk} turns failed`);
  if (f.promptRewrites < 1) problems.push("the prompt was never compacted");
  if (f.factsAnswered !== f.facts && process.argv[2] === "vilvona") problems.push(`${f.facts - f.factsAnswered} planted facts were not answered`);
  if (problems.length) { console.error(problems.join("; ")); process.exit(1); }
' "$OUT/figures.json" "$ENGINE" || fail "$(head -c 1500 "$OUT/figures.json")"
step "passed"
