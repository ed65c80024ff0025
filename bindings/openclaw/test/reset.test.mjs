// OpenClaw's `/new` and `/reset` keep the session id and start a new window of its transcript,
// telling plugins through the `before_reset` hook. The plugin passes it on: the next assembly
// holds nothing of before. A gateway whose slot names another engine gets no hook from vilvona.
//   VILVONA_BIN=target/debug/vilvona node --test bindings/openclaw/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import register from "../index.js";

const binary = process.env.VILVONA_BIN;

test("before_reset: the session's next assembly holds nothing of before", async () => {
  assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (.ci/run does)");
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-reset-"));
  let engine;
  const hooks = {};
  const on = (name, handler) => (hooks[name] = handler);
  register({
    pluginConfig: { binary, stateDir },
    config: { plugins: { slots: { contextEngine: "vilvona" } } },
    registerContextEngine: (_id, factory) => (engine = factory()),
    on,
  });
  const elsewhere = {};
  register({ pluginConfig: { binary, stateDir }, config: { plugins: { slots: { contextEngine: "legacy" } } }, registerContextEngine: () => {}, on: (name) => (elsewhere[name] = true) });
  assert.deepEqual(elsewhere, {}, "a gateway that selects another engine gets no hook");
  assert.equal(typeof hooks.before_reset, "function");
  const scope = { sessionId: "anew", sessionKey: "agent:main:anew" };
  const said = (index) => ({ role: "user", content: `turn ${index}: the curlew${index} code is CW-${index}`, timestamp: 1772442351000 + index });
  const answered = (index) => ({ role: "assistant", content: [{ type: "text", text: `noted ${index}` }], timestamp: 1772442351500 + index });
  const history = [];
  try {
    for (let index = 0; index < 3; index++) {
      await engine.commitTurn({ ...scope, advancementKey: `k-${index}`, messages: [said(index), answered(index)], prePromptMessageCount: history.length });
      history.push(said(index), answered(index));
      await engine.assemble({ ...scope, messages: history, tokenBudget: 100_000 });
    }
    await hooks.before_reset({ reason: "new", messages: history }, scope);
    const after = await engine.assemble({ ...scope, messages: [said(3)], tokenBudget: 100_000 });
    const text = JSON.stringify(after.messages);
    for (let index = 0; index < 3; index++) assert.ok(!text.includes(`curlew${index} code`), `turn ${index} came before the reset: ${text}`);
  } finally {
    const child = globalThis[Symbol.for("vilvona.openclaw.process")].child;
    child.stdin.end();
    await new Promise((resolve) => child.once("exit", resolve));
    rmSync(stateDir, { recursive: true, force: true });
  }
});
