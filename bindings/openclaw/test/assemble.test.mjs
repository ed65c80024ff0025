// `assemble` through the plugin sends only what the other side lacks: the host's history is
// left out once the engine holds the session, and the reply carries only the messages the
// plugin does not hold. What the host gets is exactly the whole context.
//   VILVONA_BIN=target/debug/vilvona node --test bindings/openclaw/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import register, { rebuild } from "../index.js";

const binary = process.env.VILVONA_BIN;

test("rebuild places held runs and fills the rest in order", () => {
  const before = ["a", "b", "c", "d", "e"];
  assert.deepEqual(rebuild(before, [], ["x"]), ["x"]);
  assert.deepEqual(rebuild(before, [[0, 0, 5]], []), before);
  assert.deepEqual(rebuild(before, [[0, 0, 1], [2, 3, 2]], ["S", "f"]), ["a", "S", "d", "e", "f"]);
  assert.deepEqual(rebuild(before, [[1, 2, 2]], ["S", "f", "g"]), ["S", "c", "d", "f", "g"]);
});

function turn(index) {
  const filler = `turn ${index} notes: the gauge reads ${index * 7} and the parser keeps ${index} rows. `.repeat(12);
  return [
    { role: "user", content: `Question ${index}: ${filler}`, timestamp: 1772442351000 + index * 1000 },
    { role: "assistant", content: [{ type: "text", text: `Answer ${index}: ${filler}` }], timestamp: 1772442351500 + index * 1000 },
  ];
}

test("assemble over the pipe: deltas each way, the whole context for the host", async () => {
  assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (.ci/run does)");
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-assemble-"));
  let engine;
  register({ pluginConfig: { binary, stateDir }, registerContextEngine: (_id, factory) => (engine = factory()) });
  const proc = globalThis[Symbol.for("vilvona.openclaw.process")];
  const sent = [];
  const send = proc.send.bind(proc);
  proc.send = (method, params, options) => {
    sent.push({ method, params });
    return send(method, params, options);
  };
  let deltas = 0;
  const receive = proc.receive.bind(proc);
  proc.receive = (child, line) => {
    if (JSON.parse(line).result?.held) deltas += 1;
    return receive(child, line);
  };
  const llm = { complete: async () => "Earlier turns: gauges read and parsers counted rows." };
  const scope = { sessionId: "delta-1", sessionKey: "agent:main:delta" };
  const budget = 3000;
  const history = [];
  let summarized = false;
  try {
    for (let index = 0; index < 40; index++) {
      const messages = turn(index);
      await engine.commitTurn({ ...scope, advancementKey: `k-${index}`, messages, prePromptMessageCount: history.length, runtimeContext: { llm } });
      history.push(...messages);
      sent.length = 0;
      const got = await engine.assemble({ ...scope, messages: history, tokenBudget: budget });
      const call = sent.find((each) => each.method === "assemble");
      if (index > 0) {
        assert.equal(call.params.historyElided, true, `turn ${index}: the history was sent again`);
        assert.deepEqual(call.params.messages, []);
      }
      // Now and then the same call whole, without a held revision: what the engine assembles.
      // (The server then holds that revision, so the plugin's next reply is whole too.)
      if (index % 4 !== 3) continue;
      const whole = await proc.request("assemble", { ...scope, messages: history, tokenBudget: budget });
      assert.equal(whole.held, undefined);
      assert.deepEqual(got.messages, whole.messages, `turn ${index}`);
      assert.equal(got.revision, undefined);
      summarized ||= (whole.summaries ?? []).length > 0;
    }
    assert.ok(summarized, "the budget never made the engine summarize");
    assert.ok(deltas >= 15, `only ${deltas} replies were deltas`);

    // A session the plugin believes the engine holds, but the store has nothing of: the engine
    // asks for the history, and the plugin sends it.
    const other = { sessionId: "delta-2", sessionKey: "agent:main:delta-2" };
    proc.assembled.set(other.sessionId, { revision: 0, messages: [], holdsHistory: true });
    sent.length = 0;
    const seeded = await engine.assemble({ ...other, messages: turn(0), tokenBudget: budget });
    const calls = sent.filter((each) => each.method === "assemble");
    assert.equal(calls.length, 2);
    assert.equal(calls[0].params.historyElided, true);
    assert.equal(calls[1].params.historyElided, undefined);
    assert.equal(seeded.messages.length, 2);
  } finally {
    const child = proc.child;
    child.stdin.end();
    await new Promise((resolve) => child.once("exit", resolve));
    rmSync(stateDir, { recursive: true, force: true });
  }
});
