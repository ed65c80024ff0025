// The soak's mock of Anthropic's Messages API bills as the API does: a prefix is read from its
// cache only up to a `cache_control` breakpoint an earlier request wrote (or within the 20 blocks
// before one of its own), writes cost what lies past the read up to the last breakpoint, and a
// prompt above the window is refused as "prompt is too long".
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer } from "node:net";

const here = new URL(".", import.meta.url).pathname;

async function freePort() {
  return new Promise((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function startMock(window) {
  const port = await freePort();
  const log = join(mkdtempSync(join(tmpdir(), "mock-anthropic-")), "mock.jsonl");
  const child = spawn(process.execPath, [join(here, "mock-anthropic.mjs"), String(port), log, String(window)], { stdio: ["ignore", "ignore", "pipe"] });
  await new Promise((resolve, reject) => {
    child.stderr.on("data", (data) => String(data).includes("listening") && resolve());
    child.on("exit", (code) => reject(new Error(`the mock exited (${code})`)));
  });
  return { url: `http://127.0.0.1:${port}/v1/messages`, log, stop: () => child.kill() };
}

const long = (word) => `${word} `.repeat(1_200);
const marked = (block) => ({ ...block, cache_control: { type: "ephemeral" } });
const user = (words, mark = false) => ({ role: "user", content: [mark ? marked({ type: "text", text: words }) : { type: "text", text: words }] });
const assistant = (words) => ({ role: "assistant", content: [{ type: "text", text: words }] });

async function send(mock, body) {
  const response = await fetch(mock.url, { method: "POST", headers: { "content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01" }, body: JSON.stringify({ model: "mock-claude", max_tokens: 100, ...body }) });
  return { status: response.status, body: await response.json() };
}

test("a prefix is read only up to a breakpoint an earlier request wrote", async () => {
  const mock = await startMock(1_000_000);
  try {
    const system = [marked({ type: "text", text: long("stable") })];
    const first = await send(mock, { system, messages: [user(long("first"), true)] });
    assert.equal(first.status, 200);
    const one = first.body.usage;
    assert.equal(one.cache_read_input_tokens, 0);
    assert.ok(one.cache_creation_input_tokens > 2_000, JSON.stringify(one));

    // The next turn extends the prompt: everything through the first request's last breakpoint is read.
    const second = await send(mock, { system, messages: [user(long("first")), assistant("ok"), user(long("second"), true)] });
    const two = second.body.usage;
    assert.equal(two.cache_read_input_tokens, one.cache_creation_input_tokens, JSON.stringify(two));
    assert.ok(two.cache_creation_input_tokens > 1_000);

    // A prompt whose history was rewritten reads only the system prompt's breakpoint.
    const third = await send(mock, { system, messages: [user(long("summary")), assistant("ok"), user(long("third"), true)] });
    const three = third.body.usage;
    const systemOnly = await send(mock, { system, messages: [user("x", true)] });
    assert.equal(three.cache_read_input_tokens, systemOnly.body.usage.cache_read_input_tokens, JSON.stringify(three));
    assert.ok(three.cache_read_input_tokens > 0 && three.cache_read_input_tokens < two.cache_read_input_tokens);

    const logged = readFileSync(mock.log, "utf8").trim().split("\n").map(JSON.parse);
    assert.equal(logged.length, 4);
    assert.deepEqual(
      logged.map((request) => request.__mock.cacheRead),
      [0, one.cache_creation_input_tokens, three.cache_read_input_tokens, systemOnly.body.usage.cache_read_input_tokens],
    );
    for (const request of logged) {
      const { input, cacheRead, cacheWrite, promptTokens } = request.__mock;
      assert.equal(input + cacheRead + cacheWrite, promptTokens);
    }
  } finally {
    mock.stop();
  }
});

test("a prompt above the window is refused as too long, and a stream says what it used", async () => {
  const mock = await startMock(2_000);
  try {
    const refused = await send(mock, { messages: [user(long("far too long"))] });
    assert.equal(refused.status, 400);
    assert.match(refused.body.error.message, /prompt is too long/);
    const response = await fetch(mock.url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "mock-claude", max_tokens: 10, stream: true, messages: [user("hello")] }) });
    const events = (await response.text()).split("\n").filter((line) => line.startsWith("event: ")).map((line) => line.slice(7));
    assert.deepEqual(events, ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
  } finally {
    mock.stop();
  }
});
