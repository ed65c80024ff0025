// The bridge's cost: what an OpenClaw user pays per call, measured from Node through the plugin's
// own code (bindings/openclaw/index.js) to a `vilvona serve --stdio` process and back.
//
//   node benches/bridge/bridge.mjs --vilvona target/release/vilvona --transcript s1000.jsonl
//        [--turns N] [--whole]
//
// Replays a generated transcript turn by turn: `commitTurn` with the turn's messages (the host
// model answers the engine's summary requests at once), then `assemble` at a 128k budget with
// the whole history, as OpenClaw calls them each turn. Prints one JSON document: medians
// and p99 of each call's round trip, the assembled size, and the bytes each way on the pipe.

import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";

import register from "../../bindings/openclaw/index.js";

const BUDGET = 128000;

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  if (at >= 0 && at + 1 < process.argv.length) return process.argv[at + 1];
  if (fallback === undefined) throw new Error(`bridge: --${name} is required`);
  return fallback;
}

function spread(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0;
  return { count: sorted.length, median_ms: at(0.5), p99_ms: at(0.99) };
}

function median(values) {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0;
}

/** The transcript's turns: each user message opens one. */
function turns(path) {
  const out = [];
  for (const line of readFileSync(path, "utf8").split("\n")) {
    if (!line) continue;
    const entry = JSON.parse(line);
    if (entry.type !== "message") continue;
    if (entry.message.role === "user" || out.length === 0) out.push([]);
    out.at(-1).push(entry.message);
  }
  return out;
}

const binary = option("vilvona");
const transcript = option("transcript");
const limit = Number(option("turns", "0"));
const whole = process.argv.includes("--whole");
const stateDir = mkdtempSync(join(tmpdir(), "vilvona-bridge-"));

let engine;
register({
  pluginConfig: { binary, stateDir },
  registerContextEngine: (_id, factory) => {
    engine = factory();
  },
});

// Count the bytes each way on the pipe, as the plugin writes and reads them.
const proc = globalThis[Symbol.for("vilvona.openclaw.process")];
const wire = { sent: 0, received: 0 };
const write = proc.send.bind(proc);
proc.send = (method, params, signal) => {
  wire.sent += JSON.stringify(params).length;
  return write(method, params, signal);
};
const receive = proc.receive.bind(proc);
proc.receive = (line) => {
  wire.received += line.length;
  return receive(line);
};

const llm = { complete: async () => "The turns so far: routine edits and test runs; nothing left open." };
const scope = { sessionId: "bridge-1", sessionKey: "agent:main:bridge" };
const settings = { limits: { promptTokenBudget: BUDGET } };
const history = [];
const commit = [];
const assemble = [];
let assembled = { tokens: 0, messages: 0 };
const assembleBytes = { sent: [], received: [] };

const all = turns(transcript);
const count = limit > 0 ? Math.min(limit, all.length) : all.length;
for (let index = 0; index < count; index++) {
  const messages = all[index];
  let begin = performance.now();
  await engine.commitTurn({
    ...scope,
    advancementKey: `turn-${index}`,
    messages,
    prePromptMessageCount: history.length,
    runtimeContext: { llm },
    runtimeSettings: settings,
  });
  commit.push(performance.now() - begin);
  history.push(...messages);
  const before = { ...wire };
  begin = performance.now();
  const params = { ...scope, messages: history, tokenBudget: BUDGET, runtimeSettings: settings };
  // --whole: the history and the context whole each way, as before the plugin sent deltas.
  const result = whole ? await proc.request("assemble", params) : await engine.assemble(params);
  assemble.push(performance.now() - begin);
  assembled = { tokens: result.estimatedTokens, messages: result.messages.length };
  assembleBytes.sent.push(wire.sent - before.sent);
  assembleBytes.received.push(wire.received - before.received);
}

console.log(
  JSON.stringify(
    {
      transcript,
      turns: count,
      wire: whole ? "whole" : "delta",
      commitTurn: spread(commit),
      assemble: spread(assemble),
      assembledTokens: assembled.tokens,
      assembledMessages: assembled.messages,
      assembleBytesSentMedian: median(assembleBytes.sent),
      assembleBytesReceivedMedian: median(assembleBytes.received),
      historyBytes: JSON.stringify(history).length,
    },
    null,
    2,
  ),
);
const child = proc.child;
child.stdin.end();
await new Promise((resolve) => child.once("exit", resolve));
rmSync(stateDir, { recursive: true, force: true });
