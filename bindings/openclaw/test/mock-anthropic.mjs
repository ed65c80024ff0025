// A mock of Anthropic's Messages API for the gateway soak, on 127.0.0.1 only.
//   node mock-anthropic.mjs PORT LOGFILE [WINDOW]
// Serves GET /v1/models and POST /v1/messages (and /messages): streaming (SSE: message_start,
// content_block_start / _delta / _stop for text and tool_use, message_delta, message_stop) or
// one JSON message. The answers are the scripted model's (mock-model.mjs).
//
// Its prompt cache is the API's: explicit. A request marks at most four blocks with
// `cache_control` (OpenClaw: the last tool, the stable part of the system prompt, the last user
// block and, in a tool loop, the newest tool result). In the prompt's order — tools, system,
// messages — each marked block writes the prefix that ends with it to the cache, for five
// minutes (refreshed by each read), when that prefix holds at least 1,024 tokens. A later
// request reads the longest prefix an earlier one wrote that ends at one of its own marked
// blocks or at one of the 20 blocks before each. So the usage says, as Anthropic's does:
// `cache_read_input_tokens` (read), `cache_creation_input_tokens` (written past what was
// read, up to the last marked block) and `input_tokens` (the rest). Tokens are characters of
// each block's JSON / 4.
//
// Like the API, it refuses a prompt above WINDOW tokens: 400 "prompt is too long".
// Each request body is appended to LOGFILE with `__mock`: its stream (`turn`, or `summarizer`
// for a request without tools that asks for a summary), `promptTokens` (the whole prompt),
// `input`, `cacheRead`, `cacheWrite`, and whether it was rejected. MOCK_SUMMARIZER_DELAY_MS
// delays summaries as mock-openai.mjs does.
import { createServer } from "node:http";
import { appendFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { reply as scriptedReply, isSummaryRequest, text } from "./mock-model.mjs";

const [port, logFile, windowArg] = process.argv.slice(2);
const window = windowArg ? Number(windowArg) : Infinity;
const summarizerDelayMs = Number(process.env.MOCK_SUMMARIZER_DELAY_MS ?? 0);
const CACHE_LIFETIME_MS = 5 * 60_000;
const MIN_CACHED_TOKENS = 1024;
const LOOKBACK_BLOCKS = 20;
let counter = 0;

/** Prefix hash → {tokens, expires}: what earlier requests wrote to the cache. */
const cache = new Map();

const tokensOf = (value) => Math.ceil(JSON.stringify(value).length / 4);

/** A block without its cache marker (the marker is not part of the prompt). */
function unmarked(block) {
  if (block === null || typeof block !== "object") return block;
  const { cache_control: _marker, ...rest } = block;
  return rest;
}

/** The prompt's blocks in the cache's order — tools, system, messages — each with its tokens and whether it is marked. */
function blocksOf(body) {
  const blocks = [];
  for (const tool of body.tools ?? []) blocks.push({ value: unmarked(tool), marked: Boolean(tool.cache_control) });
  const system = typeof body.system === "string" ? [{ type: "text", text: body.system }] : body.system ?? [];
  for (const block of system) blocks.push({ value: unmarked(block), marked: Boolean(block.cache_control) });
  for (const message of body.messages ?? []) {
    const content = typeof message.content === "string" ? [{ type: "text", text: message.content }] : message.content ?? [];
    content.forEach((block, index) => blocks.push({ value: { role: message.role, first: index === 0, ...unmarked(block) }, marked: Boolean(block.cache_control) }));
  }
  return blocks;
}

/** What the cache serves and takes of a prompt: `{total, read, written}` tokens. */
function cacheUsage(body, now) {
  const blocks = blocksOf(body);
  let hash = "";
  let total = 0;
  const prefixes = blocks.map((block) => {
    hash = createHash("sha256").update(hash).update(JSON.stringify(block.value)).digest("hex");
    total += tokensOf(block.value);
    return { hash, tokens: total, marked: block.marked };
  });
  const live = (prefix) => {
    const entry = cache.get(prefix.hash);
    return entry && entry.expires > now ? entry : null;
  };
  let read = 0;
  prefixes.forEach((prefix, at) => {
    if (!prefix.marked) return;
    for (let back = at; back >= Math.max(0, at - LOOKBACK_BLOCKS); back--) {
      const entry = live(prefixes[back]);
      if (entry) {
        entry.expires = now + CACHE_LIFETIME_MS;
        read = Math.max(read, prefixes[back].tokens);
        break;
      }
    }
  });
  const marked = prefixes.filter((prefix) => prefix.marked && prefix.tokens >= MIN_CACHED_TOKENS);
  for (const prefix of marked) cache.set(prefix.hash, { tokens: prefix.tokens, expires: now + CACHE_LIFETIME_MS });
  const last = marked.at(-1);
  const written = last ? Math.max(0, last.tokens - read) : 0;
  return { total, read, written };
}

/** The request as a chat in OpenAI's shape, for the scripted model. */
function asChat(body) {
  const chat = [];
  const system = typeof body.system === "string" ? body.system : (body.system ?? []).map((block) => block.text ?? "").join("\n");
  if (system) chat.push({ role: "system", content: system });
  for (const message of body.messages ?? []) {
    const content = typeof message.content === "string" ? [{ type: "text", text: message.content }] : message.content ?? [];
    if (message.role === "assistant") {
      const calls = content
        .filter((block) => block.type === "tool_use")
        .map((block) => ({ id: block.id, type: "function", function: { name: block.name, arguments: JSON.stringify(block.input ?? {}) } }));
      chat.push({ role: "assistant", content: text(content.filter((block) => block.type === "text")), ...(calls.length ? { tool_calls: calls } : {}) });
      continue;
    }
    for (const block of content.filter((block) => block.type === "tool_result")) {
      chat.push({ role: "tool", tool_call_id: block.tool_use_id, content: text(block.content) });
    }
    const words = content.filter((block) => block.type === "text");
    if (words.length) chat.push({ role: "user", content: text(words) });
  }
  return chat;
}

function sendMessage(res, reply, stream, usage) {
  const id = `msg_mock_${++counter}`;
  const { body = "", toolCall = null } = reply;
  const block = toolCall
    ? { type: "tool_use", id: `toolu_mock_${counter}`, name: toolCall.name, input: JSON.parse(toolCall.arguments || "{}") }
    : { type: "text", text: body };
  const output = Math.ceil(JSON.stringify(block).length / 4);
  const stopReason = toolCall ? "tool_use" : "end_turn";
  const start = { input_tokens: usage.input, cache_creation_input_tokens: usage.written, cache_read_input_tokens: usage.read, output_tokens: 1 };
  if (!stream) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ id, type: "message", role: "assistant", model: "mock-claude", content: [block], stop_reason: stopReason, stop_sequence: null, usage: { ...start, output_tokens: output } }));
    return;
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  const event = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  event("message_start", { message: { id, type: "message", role: "assistant", model: "mock-claude", content: [], stop_reason: null, stop_sequence: null, usage: start } });
  if (toolCall) {
    event("content_block_start", { index: 0, content_block: { ...block, input: {} } });
    event("content_block_delta", { index: 0, delta: { type: "input_json_delta", partial_json: JSON.stringify(block.input) } });
  } else {
    event("content_block_start", { index: 0, content_block: { type: "text", text: "" } });
    event("content_block_delta", { index: 0, delta: { type: "text_delta", text: body } });
  }
  event("content_block_stop", { index: 0 });
  event("message_delta", { delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: output } });
  event("message_stop", {});
  res.end();
}

createServer((req, res) => {
  if (req.method === "GET" && req.url.startsWith("/v1/models")) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ data: [{ id: "mock-claude", type: "model", display_name: "Mock Claude" }], has_more: false }));
    return;
  }
  const path = req.url.split("?")[0];
  if (req.method !== "POST" || !(path === "/v1/messages" || path === "/messages")) {
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ type: "error", error: { type: "not_found_error", message: `the mock serves POST /v1/messages, not ${req.method} ${path}` } }));
    return;
  }
  let raw = "";
  req.on("data", (part) => (raw += part));
  req.on("end", () => {
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ type: "error", error: { type: "invalid_request_error", message: "the body is not JSON" } }));
      return;
    }
    const chat = asChat(body);
    const toolNames = (body.tools ?? []).map((tool) => tool.name).filter(Boolean);
    const summarizing = isSummaryRequest(chat, toolNames);
    const total = blocksOf(body).reduce((sum, block) => sum + tokensOf(block.value), 0);
    const rejected = total > window;
    // A refused prompt is not billed and writes nothing to the cache.
    const usage = rejected ? { total, read: 0, written: 0 } : cacheUsage(body, Date.now());
    const input = usage.total - usage.read - usage.written;
    appendFileSync(logFile, JSON.stringify({ ...body, __mock: { stream: summarizing ? "summarizer" : "turn", api: "anthropic-messages", promptTokens: total, countedTokens: total, input, cacheRead: usage.read, cacheWrite: usage.written, rejected } }) + "\n");
    if (rejected) {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ type: "error", error: { type: "invalid_request_error", message: `prompt is too long: ${total} tokens > ${window} maximum` } }));
      return;
    }
    const answer = () => sendMessage(res, scriptedReply(chat, toolNames), Boolean(body.stream), { ...usage, input });
    if (summarizing && summarizerDelayMs > 0) setTimeout(answer, summarizerDelayMs);
    else answer();
  });
}).listen(Number(port), "127.0.0.1", () => {
  console.error(`mock-anthropic listening on 127.0.0.1:${port}`);
});
