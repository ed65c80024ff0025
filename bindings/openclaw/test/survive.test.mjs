// The plugin inside OpenClaw answers in one of three ways: a result, an abort (the signal's
// own reason, so OpenClaw does not quarantine the engine for it), or a failure that means the
// engine cannot work. Its child process may die at any moment without taking the gateway down.
// Each call's summaries are written by that call's own host model.
//   VILVONA_BIN=target/debug/vilvona node --test bindings/openclaw/test/
import { AsyncLocalStorage } from "node:async_hooks";
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import register, { TransientError, UiServer, callDeadlineMs, errorKind } from "../index.js";

const binary = process.env.VILVONA_BIN;
const SHARED = Symbol.for("vilvona.openclaw.process");

// OpenClaw 2026.9.6's rule (`isContextEngineAbortRejection`): an aborted call is forgiven only
// when it rejects with the signal's reason or an AbortError; anything else quarantines.
const forgiven = (error, signal) => error === signal.reason || error?.name === "AbortError";

/** A fresh plugin (its own child process) over a fresh state directory. */
function plugin(config = {}) {
  delete globalThis[SHARED];
  const stateDir = config.stateDir ?? mkdtempSync(join(tmpdir(), "vilvona-survive-"));
  let factory;
  const warnings = [];
  register({
    pluginConfig: { binary, stateDir, ...config },
    registerContextEngine: (_id, make) => (factory = make),
    logger: { warn: (line) => warnings.push(line), info: () => {}, error: () => {} },
  });
  const proc = globalThis[SHARED];
  return {
    engine: factory(),
    proc,
    stateDir,
    warnings,
    async close() {
      const child = proc.child;
      child?.stdin.end();
      if (child && child.exitCode === null && child.signalCode === null) await new Promise((resolve) => child.once("exit", resolve));
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

function turn(index, topic = "ledger") {
  const notes = `step ${index}: the ${topic} shard ${index} was rebalanced and the cursor moved ${index * 3} rows. `.repeat(30);
  return [
    { role: "user", content: `Request ${index} about the ${topic}: ${notes}`, timestamp: 1772442351000 + index * 1000 },
    { role: "assistant", content: [{ type: "text", text: `Done ${index} with the ${topic}: ${notes}` }], timestamp: 1772442351500 + index * 1000 },
  ];
}

async function commitTurns(engine, scope, count, topic) {
  for (let index = 1; index <= count; index++) {
    await engine.commitTurn({ ...scope, advancementKey: `${scope.sessionId}-${index}`, messages: turn(index, topic), prePromptMessageCount: 0 });
  }
}

const abortError = () => Object.assign(new Error("Session maintenance yielded to a foreground turn"), { name: "AbortError" });

test("an aborted call rejects with the signal's own reason, whatever it was doing", async () => {
  assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (.ci/run does)");
  const { engine, close } = plugin();
  const scope = { sessionId: "abort-1", sessionKey: "agent:main:abort-1" };
  try {
    await commitTurns(engine, scope, 8);
    const calls = {
      compact: (signal) => engine.compact({ ...scope, tokenBudget: 2000, force: true, compactionTarget: "budget", currentTokenCount: 9000, abortSignal: signal }),
      maintain: (signal) => engine.maintain({ ...scope, reason: "turn", abortSignal: signal }),
      assemble: (signal) => engine.assemble({ ...scope, messages: [], tokenBudget: 2000, abortSignal: signal }),
      commitTurn: (signal) => engine.commitTurn({ ...scope, advancementKey: "abort-late", messages: turn(9), prePromptMessageCount: 0, abortSignal: signal }),
    };
    for (const [name, call] of Object.entries(calls)) {
      for (const when of ["in flight", "before the call"]) {
        const controller = new AbortController();
        // Reasons of both kinds: an AbortError, and a plain reason (forgiven only as itself).
        const reason = when === "in flight" ? abortError() : new Error("the run ended");
        if (when === "before the call") controller.abort(reason);
        const pending = call(controller.signal);
        if (when === "in flight") setImmediate(() => controller.abort(reason));
        try {
          await pending;
        } catch (error) {
          assert.ok(forgiven(error, controller.signal), `${name} aborted ${when} rejected with ${error?.name}: ${error?.message}`);
        }
      }
    }
    // The next turn goes on as usual.
    const result = await engine.commitTurn({ ...scope, advancementKey: "after-aborts", messages: turn(10), prePromptMessageCount: 0 });
    assert.equal(result.status, "committed");
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 4000 });
    assert.ok(assembled.messages.length > 0);
  } finally {
    await close();
  }
});

test("a child killed mid-call takes nothing down: the call is sent again to a new one, with the history", async () => {
  const { engine, proc, close } = plugin();
  const scope = { sessionId: "kill-1", sessionKey: "agent:main:kill-1" };
  const uncaught = [];
  const onUncaught = (error) => uncaught.push(error);
  process.on("uncaughtException", onUncaught);
  try {
    await commitTurns(engine, scope, 6);
    const history = turn(1).concat(turn(2));
    await engine.assemble({ ...scope, messages: history, tokenBudget: 4000 });
    await engine.assemble({ ...scope, messages: history, tokenBudget: 4000 });
    for (let kill = 0; kill < 4; kill++) {
      const first = proc.child;
      // A call in flight, the child killed under it, and more calls written to the dead pipe
      // before its exit is seen (the write that crashed the gateway with EPIPE).
      const inFlight = engine.commitTurn({ ...scope, advancementKey: `after-kill-${kill}`, messages: turn(20 + kill), prePromptMessageCount: 0 });
      first.kill("SIGKILL");
      const written = engine.assemble({ ...scope, messages: history, tokenBudget: 4000 });
      const [committed, assembled] = await Promise.all([inFlight, written]);
      assert.ok(["committed", "duplicate"].includes(committed.status), JSON.stringify(committed));
      assert.ok(assembled.messages.length > 0);
      assert.notEqual(proc.child, first, "a new child serves");
    }
    // Every turn acknowledged before and after the kills is in the store.
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 100000 });
    const text = JSON.stringify(assembled.messages);
    for (let kill = 0; kill < 4; kill++) assert.ok(text.includes(`Request ${20 + kill} about`), `turn ${20 + kill} is missing`);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.deepEqual(uncaught.map(String), []);
  } finally {
    process.off("uncaughtException", onUncaught);
    await close();
  }
});

test("a child that stops answering is killed past the call's deadline; the call is sent again to a new one and nothing waits on the old", async () => {
  const { engine, proc, close } = plugin({ callTimeoutMs: { default: 1500 } });
  const scope = { sessionId: "stop-1", sessionKey: "agent:main:stop-1" };
  try {
    await commitTurns(engine, scope, 2);
    for (const how of ["SIGSTOP", "sleeps"]) {
      const first = proc.child;
      if (how === "SIGSTOP") first.kill("SIGSTOP");
      // A process that sleeps forever in a call: its input is never read again.
      else first.stdout.pause();
      const started = Date.now();
      const committed = await engine.commitTurn({ ...scope, advancementKey: `after-${how}`, messages: turn(30), prePromptMessageCount: 0 });
      assert.ok(["committed", "duplicate"].includes(committed.status), JSON.stringify(committed));
      assert.ok(Date.now() - started < 10_000, `answered after ${Date.now() - started} ms`);
      assert.notEqual(proc.child, first, `${how}: a new child serves`);
      assert.equal(proc.pending.size, 0, "no call waits on the stuck child");
      assert.equal(proc.llms.size, 0);
      assert.ok(first.signalCode === "SIGKILL" || first.killed, "the stuck child was killed");
    }
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 100000 });
    assert.ok(JSON.stringify(assembled.messages).includes("Request 30 about"));
  } finally {
    await close();
  }
});

test("a call queued behind a slow compact of its session waits past its own deadline, and a call is not timed while the host's model answers", async () => {
  // Deadlines shorter than the host's model takes: before, the queued assemble expired (its
  // clock ran from the send) and the compact's did while the model answered, and either
  // killed the shared process under both.
  const { engine, proc, warnings, close } = plugin({ engine: { summarizer: { kind: "host" } }, callTimeoutMs: { default: 1000, compact: 1000 } });
  const scope = { sessionId: "queued-1", sessionKey: "agent:main:queued-1" };
  try {
    await commitTurns(engine, scope, 10);
    const first = proc.child;
    let asked = 0;
    const slowModel = { complete: async () => { asked += 1; await new Promise((resolve) => setTimeout(resolve, 1_500)); return { text: "Summary by the slow model." }; } };
    const compacting = engine.compact({ ...scope, tokenBudget: 3000, force: true, runtimeContext: { llm: slowModel } });
    await new Promise((resolve) => setTimeout(resolve, 200));
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 3000 });
    const compacted = await compacting;
    assert.ok(compacted.compacted, JSON.stringify(compacted));
    assert.ok(asked > 0, "the host's model wrote the summaries");
    assert.ok(assembled.messages.some((message) => JSON.stringify(message).includes("Summary by the slow model")), "the queued assemble ran after the compact");
    assert.equal(proc.child, first, "nothing was taken for stuck");
    assert.deepEqual(warnings.filter((line) => line.includes("killed")), []);
  } finally {
    await close();
  }
});

test("a stuck process's calls it never began are sent again to the next; those it began retry", async () => {
  const { engine, proc, close } = plugin({ callTimeoutMs: { default: 1500 } });
  const scope = { sessionId: "resent-1", sessionKey: "agent:main:resent-1" };
  try {
    await commitTurns(engine, scope, 2);
    const first = proc.child;
    first.kill("SIGSTOP");
    // Four calls of one session: none begins in the stopped process.
    const calls = [3, 4, 5, 6].map((index) => engine.commitTurn({ ...scope, advancementKey: `resent-${index}`, messages: turn(index), prePromptMessageCount: 0 }));
    const results = await Promise.all(calls);
    assert.deepEqual(results.map((result) => result.status), ["committed", "committed", "committed", "committed"]);
    assert.notEqual(proc.child, first);
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 100000 });
    for (const index of [3, 4, 5, 6]) assert.ok(JSON.stringify(assembled.messages).includes(`Request ${index} about`), `turn ${index}`);
  } finally {
    await close();
  }
});

test("an ingest sent again after its child stored it but died before it answered stores nothing twice", async () => {
  const { engine, proc, close } = plugin({ callTimeoutMs: { default: 1500 } });
  const scope = { sessionId: "retry-1", sessionKey: "agent:main:retry-1" };
  try {
    await engine.ingest({ ...scope, message: turn(1)[0] });
    for (const [method, call] of [
      ["ingest", () => engine.ingest({ ...scope, message: { role: "user", content: "stored once, single", timestamp: 5 } })],
      ["ingestBatch", () => engine.ingestBatch({ ...scope, messages: [{ role: "user", content: "stored once, batch", timestamp: 6 }] })],
    ]) {
      // The child stores the message and answers, but the answer is never read: past the
      // deadline the child is killed and the call is sent again to a new one.
      const first = proc.child;
      first.stdout.pause();
      await call();
      assert.notEqual(proc.child, first, `${method}: a new child served the retry`);
    }
    const assembled = await engine.assemble({ ...scope, messages: [], tokenBudget: 100000 });
    const texts = assembled.messages.map((message) => message.content);
    assert.equal(texts.filter((text) => text === "stored once, single").length, 1, JSON.stringify(texts));
    assert.equal(texts.filter((text) => text === "stored once, batch").length, 1, JSON.stringify(texts));
  } finally {
    await close();
  }
});

test("the panel's server that could not start is started on the next request", async () => {
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-ui-start-"));
  // A binary the system cannot start (its interpreter is missing: the spawn itself fails).
  const broken = join(stateDir, "vilvona");
  writeFileSync(broken, "#!/nonexistent/interpreter\n");
  chmodSync(broken, 0o755);
  const ui = new UiServer({ binary: broken, stateDir });
  try {
    await assert.rejects(ui.view({ view: "sessions" }));
    ui.config = { binary, stateDir };
    const sessions = await ui.view({ view: "sessions" });
    assert.ok(sessions !== undefined);
  } finally {
    (await ui.started)?.child.kill();
    rmSync(stateDir, { recursive: true, force: true });
  }
});

test("deadlines per method, and what each error code is to OpenClaw (ARCHITECTURE's three answers)", () => {
  assert.equal(callDeadlineMs({}, "commitTurn"), 30_000);
  assert.equal(callDeadlineMs({}, "compact"), 600_000);
  assert.equal(callDeadlineMs({ callTimeoutMs: 5000 }, "compact"), 5000);
  assert.equal(callDeadlineMs({ callTimeoutMs: { assemble: 2000, default: 9000 } }, "assemble"), 2000);
  assert.equal(callDeadlineMs({ callTimeoutMs: { assemble: 2000, default: 9000 } }, "ingest"), 9000);
  const table = [
    [-32700, "transient"], [-32600, "transient"], [-32601, "transient"], [-32602, "transient"],
    [-32800, "transient"], [-32001, "broken"], [-32002, "transient"], [-32003, "answer"],
    [-32004, "transient"], [-32005, "answer"], [-32006, "transient"],
  ];
  for (const [code, kind] of table) assert.equal(errorKind(code), kind, String(code));
});

test("two sessions at once: each call's summaries are written by its own host model, in its own call", async () => {
  const { engine, close } = plugin({ engine: { summarizer: { kind: "host" } } });
  const sessions = ["alpha", "omega"].map((name) => ({ sessionId: `model-${name}`, sessionKey: `agent:main:${name}`, topic: `${name}ledger` }));
  const asked = [];
  // OpenClaw tracks each call's async work in its async context and refuses work started
  // outside a live one ("Async work scope is closed"): the model checks the same.
  const calls = new AsyncLocalStorage();
  try {
    // The child starts inside a call whose scope is closed long before the summaries.
    await calls.run({ session: "bootstrap", open: false }, () => engine.bootstrap({ sessionId: "starter", sessionKey: "agent:main:starter" }));
    for (const { topic, ...scope } of sessions) await commitTurns(engine, scope, 10, topic);
    const model = (session) => ({
      complete: async (params) => {
        const call = calls.getStore();
        if (!call?.open || call.session !== session) throw new Error(`Async work scope is closed (asked from ${call?.session}'s call)`);
        assert.equal(params.scope, undefined, "the server's routing field is not the host's business");
        const prompt = JSON.stringify(params.messages);
        asked.push({ session, sawAlpha: prompt.includes("alphaledger"), sawOmega: prompt.includes("omegaledger") });
        // Slow enough that the two sessions' summaries overlap.
        await new Promise((resolve) => setTimeout(resolve, 20));
        return { text: `Summary by ${session}'s model.` };
      },
    });
    const results = await Promise.all(
      sessions.map(({ topic, ...scope }) =>
        calls.run({ session: scope.sessionId, open: true }, () => engine.compact({ ...scope, tokenBudget: 3000, force: true, runtimeContext: { llm: model(scope.sessionId) } })),
      ),
    );
    for (const result of results) assert.equal(result.result?.details?.degradedSummaries ?? 0, 0, JSON.stringify(result.result?.details));
    for (const result of results) assert.ok(result.compacted, JSON.stringify(result));
    assert.ok(asked.some((call) => call.session === "model-alpha"), "alpha's model was never asked");
    assert.ok(asked.some((call) => call.session === "model-omega"), "omega's model was never asked");
    for (const call of asked) {
      const own = call.session === "model-alpha" ? call.sawAlpha : call.sawOmega;
      const other = call.session === "model-alpha" ? call.sawOmega : call.sawAlpha;
      assert.ok(own && !other, `${call.session}'s model was asked to summarize another session's history`);
    }
    // A call without a model gets no other call's model: its summaries fall back, and say so.
    const { topic, ...alpha } = sessions[0];
    await commitTurns(engine, { ...alpha, sessionId: "model-none" }, 10, topic);
    const late = await engine.compact({ sessionId: "model-none", sessionKey: "agent:main:none", tokenBudget: 3000, force: true });
    assert.match(late.result?.details?.degradedReason ?? "", /no host model in scope/);
  } finally {
    await close();
  }
});

test("a child that cannot start fails as broken; the next call starts it again", async () => {
  const root = mkdtempSync(join(tmpdir(), "vilvona-start-"));
  const stateDir = join(root, "state");
  // The state directory is a file at first: the engine cannot open its store.
  writeFileSync(stateDir, "not a directory");
  const { engine, close } = plugin({ stateDir });
  const scope = { sessionId: "start-1", sessionKey: "agent:main:start-1" };
  try {
    await assert.rejects(engine.commitTurn({ ...scope, advancementKey: "k1", messages: turn(1), prePromptMessageCount: 0 }), (error) => !error.transient);
    rmSync(stateDir);
    const result = await engine.commitTurn({ ...scope, advancementKey: "k1", messages: turn(1), prePromptMessageCount: 0 });
    assert.equal(result.status, "committed");
  } finally {
    await close();
    rmSync(root, { recursive: true, force: true });
  }
});

test("a child that keeps dying: maintenance answers without the work, a turn's messages are refused", async () => {
  const root = mkdtempSync(join(tmpdir(), "vilvona-dying-"));
  const dying = join(root, "vilvona");
  // Killed by a signal at every start (as the OOM killer would): a passing failure, each time.
  writeFileSync(dying, "#!/bin/sh\nkill -9 $$\n");
  chmodSync(dying, 0o755);
  const { engine, warnings, close } = plugin({ binary: dying });
  const scope = { sessionId: "dying-1", sessionKey: "agent:main:dying-1" };
  try {
    const compacted = await engine.compact({ ...scope, tokenBudget: 2000, force: true });
    assert.equal(compacted.compacted, false);
    assert.match(compacted.reason, /exited \(SIGKILL\).*next call tries again/);
    const maintained = await engine.maintain({ ...scope, reason: "turn" });
    assert.equal(maintained.changed, false);
    const assembled = await engine.assemble({ ...scope, messages: turn(1), tokenBudget: 2000 });
    assert.equal(assembled.messages.length, 2, "the host's own messages, as OpenClaw would use them");
    await assert.rejects(engine.commitTurn({ ...scope, advancementKey: "k", messages: turn(1), prePromptMessageCount: 0 }), TransientError);
    assert.ok(warnings.some((line) => /compact/.test(line)), warnings.join("\n"));
  } finally {
    await close();
    rmSync(root, { recursive: true, force: true });
  }
});

test("a recall tool called without a session reads nothing, not the last session's history", async () => {
  delete globalThis[SHARED];
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-tool-scope-"));
  let factory;
  const tools = new Map();
  register({
    pluginConfig: { binary, stateDir },
    registerContextEngine: (_id, make) => (factory = make),
    registerTool: (make, { name }) => tools.set(name, make),
    logger: { warn: () => {} },
  });
  const proc = globalThis[SHARED];
  const engine = factory();
  try {
    await commitTurns(engine, { sessionId: "tool-a", sessionKey: "agent:main:tool-a" }, 2, "heron");
    const grep = tools.get("vilvona_grep");
    const own = await grep({ sessionId: "tool-a", sessionKey: "agent:main:tool-a" }).execute("c1", { query: "heron" });
    assert.match(own.content[0].text, /heron/);
    await assert.rejects(grep({}).execute("c2", { query: "heron" }), /without a session/);
  } finally {
    proc.child?.stdin.end();
    await new Promise((resolve) => (proc.child ? proc.child.once("exit", resolve) : resolve()));
    rmSync(stateDir, { recursive: true, force: true });
  }
});
