// The host's model, per run: OpenClaw scopes `runtimeContext.llm.complete` to the one run it
// passes it to, and a closed scope fails ("Async work scope is closed"). A summary the engine
// asks for during a call is written by that call's model, on the 2nd and 10th call of a
// session as on the first; and a summary that fell back to the extractive summarizer says so.
//   VILVONA_BIN=target/debug/vilvona node --test bindings/openclaw/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import register from "../index.js";

const binary = process.env.VILVONA_BIN;

function turn(index) {
  const notes = `step ${index}: the ledger shard ${index} was rebalanced and the cursor moved ${index * 3} rows. `.repeat(30);
  return [
    { role: "user", content: `Request ${index}: ${notes}`, timestamp: 1772442351000 + index * 1000 },
    { role: "assistant", content: [{ type: "text", text: `Done ${index}: ${notes}` }], timestamp: 1772442351500 + index * 1000 },
  ];
}

/** A run's model as OpenClaw gives it: usable while the run lasts, closed after. */
function runModel(run, calls) {
  let open = true;
  return {
    llm: {
      complete: async (params) => {
        if (!open) {
          calls.push({ run, closed: true });
          throw new Error("Async work scope is closed");
        }
        calls.push({ run, purpose: params.purpose });
        return { text: `Run ${run} summary: ledger shards were rebalanced; cursors moved.` };
      },
    },
    close: () => {
      open = false;
    },
  };
}

test("each call's summaries are written by that call's own host model", async () => {
  assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (.ci/run does)");
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-host-model-"));
  let engine;
  register({
    pluginConfig: { binary, stateDir, engine: { summarizer: { kind: "host" } } },
    registerContextEngine: (_id, factory) => (engine = factory()),
  });
  const proc = globalThis[Symbol.for("vilvona.openclaw.process")];
  const calls = [];
  const scope = { sessionId: "host-model", sessionKey: "agent:main:host-model" };
  try {
    // As OpenClaw 2026.9 runs a turn: `assemble` (its message budget, its window and its
    // reserve), `commitTurn` with no model in scope (the turn's usage says what the whole
    // prompt took), then `maintain` with the run's model, which closes when the run ends.
    const window = { limits: { promptTokenBudget: 8000, maxOutputTokens: 1000 } };
    let context = 0;
    for (let run = 1; run <= 10; run++) {
      await engine.assemble({ ...scope, messages: [], tokenBudget: 2000, runtimeSettings: window });
      const messages = turn(run);
      messages[1].usage = { input: 3000 + context + 700, output: 20 };
      await engine.commitTurn({ ...scope, advancementKey: `k-${run}`, messages, prePromptMessageCount: 0, runtimeContext: {} });
      const model = runModel(run, calls);
      await engine.maintain({ ...scope, reason: "turn", runtimeContext: { llm: model.llm } });
      model.close();
      context = (await proc.request("assemble", { ...scope, messages: [], tokenBudget: 2000 })).estimatedTokens;
    }
    assert.deepEqual(calls.filter((call) => call.closed), [], "a model was asked after its run ended");
    const runs = new Set(calls.map((call) => call.run));
    for (const run of [2, 10]) assert.ok(runs.has(run), `run ${run}'s model was never asked (asked: ${[...runs]})`);

    // A call without a model in scope: the summary falls back to the extractive summarizer,
    // and the result says so.
    await engine.commitTurn({ ...scope, advancementKey: "k-late", messages: turn(11), prePromptMessageCount: 0 });
    const late = await engine.compact({ ...scope, force: true });
    const details = late.result?.details ?? {};
    assert.ok(late.compacted, JSON.stringify(late));
    assert.ok(details.degradedSummaries > 0, `the fallback was not reported: ${JSON.stringify(details)}`);
    assert.match(details.degradedReason ?? "", /no host model in scope/);
    // The store says so too: stats name the stand-in, doctor counts it.
    const cli = (...args) => JSON.parse(spawnSync(binary, ["--state-dir", stateDir, ...args, "--json"], { encoding: "utf8" }).stdout);
    const stats = cli("stats", "--session", scope.sessionId);
    assert.ok(
      Object.keys(stats.summariesBySummarizer).some((writer) => writer === "extractive/v1 in place of host-llm/v1"),
      JSON.stringify(stats.summariesBySummarizer),
    );
    const doctor = cli("doctor");
    assert.match(doctor.checks[0].detail, /written by a fallback in place of the configured summarizer/);
  } finally {
    proc.child?.stdin.end();
    await new Promise((resolve) => (proc.child ? proc.child.once("exit", resolve) : resolve()));
    rmSync(stateDir, { recursive: true, force: true });
  }
});
