// A mock OpenAI-compatible model for the end-to-end test and the gateway soak, on 127.0.0.1 only.
//   node mock-openai.mjs PORT LOGFILE [WINDOW]
// Serves GET /v1/models and POST /v1/chat/completions (SSE when `stream` is set, else JSON) and
// appends each request body to LOGFILE, one JSON object per line, with `__mock`: the stream it
// belongs to (`turn`, or `summarizer` for a request without tools that asks for a summary), its
// prompt tokens (characters of the serialized `messages` / 4, as a provider counts them; also
// reported as `usage.prompt_tokens`) and whether it was rejected.
//
// Like a provider, it enforces its window: a request above WINDOW prompt tokens (when given) gets
// 400 context_length_exceeded.
//
// Providers differ in how they count and what they report; the environment chooses the shape:
//   MOCK_CHARS_PER_TOKEN  characters a token when counting (default 4; a tokenizer on code: ~3.3)
//   MOCK_COUNT_TOOLS=1    the tool schemas count toward the prompt, as every real provider does
//   MOCK_MAX_TOKENS=1     the window holds the prompt plus the request's max_tokens
//   MOCK_USAGE=0          no usage is reported (servers streaming without include_usage)
//   MOCK_CACHE=1          the usage says what a prompt cache served (prompt_tokens_details.cached_tokens):
//                         the leading messages an earlier prompt began with
//   MOCK_SUMMARIZER_DELAY_MS  summaries take this long (a slow summarizer model)
//   MOCK_SUMMARIZER_REFUSE=FROM-TO  summary requests get 503 while the newest `STEP-n` a turn
//                         request holds is within FROM..TO (a model down for a stretch of turns;
//                         logged with `refused`, and not billed)
// The count that is enforced and reported is `countedTokens`; `promptTokens` stays characters/4
// of the messages, so the cost of runs of different shapes compares.
//
// Replies are the scripted model's (mock-model.mjs); besides, a user message containing a new
// TRIGGER_OVERFLOW_<n> token gets one 400, then normal replies.
import { createServer } from "node:http";
import { appendFileSync } from "node:fs";
import { reply as scriptedReply, text } from "./mock-model.mjs";

const [port, logFile, windowArg] = process.argv.slice(2);
const window = windowArg ? Number(windowArg) : Infinity;
const overflowed = new Set();
const SHAPE = {
  charsPerToken: Number(process.env.MOCK_CHARS_PER_TOKEN ?? 4),
  countTools: process.env.MOCK_COUNT_TOOLS === "1",
  maxTokens: process.env.MOCK_MAX_TOKENS === "1",
  usage: process.env.MOCK_USAGE !== "0",
  cache: process.env.MOCK_CACHE === "1",
  summarizerDelayMs: Number(process.env.MOCK_SUMMARIZER_DELAY_MS ?? 0),
  summarizerRefused: (process.env.MOCK_SUMMARIZER_REFUSE ?? "").split("-").filter(Boolean).map(Number),
};
// The newest work turn a turn request has held.
let newestStep = 0;
let counter = 0;

// The prompts a cache holds (MOCK_CACHE=1): the newest requests' messages, as JSON each.
const cached = [];
const CACHED_PROMPTS = 16;

/**
 * What a provider's prompt cache serves of `messages` (tokens of `promptTokens`): the longest
 * run of leading messages an earlier prompt began with, as a share of the prompt's characters;
 * then the prompt is cached in its turn.
 */
function cacheRead(messages, promptTokens) {
  const parts = messages.map((m) => JSON.stringify(m));
  let longest = 0;
  for (const earlier of cached) {
    let same = 0;
    while (same < parts.length && same < earlier.length && parts[same] === earlier[same]) same += 1;
    longest = Math.max(longest, same);
  }
  cached.unshift(parts);
  cached.length = Math.min(cached.length, CACHED_PROMPTS);
  const all = parts.reduce((sum, part) => sum + part.length, 0);
  const prefix = parts.slice(0, longest).reduce((sum, part) => sum + part.length, 0);
  return all > 0 ? Math.floor((promptTokens * prefix) / all) : 0;
}

function respond(res, reply, stream, promptTokens, cachedTokens) {
  const { body = "", toolCall = null } = reply;
  const id = `chatcmpl-${++counter}`;
  const created = Math.floor(Date.now() / 1000);
  const completion = Math.ceil((body.length + JSON.stringify(toolCall ?? "").length) / 4);
  const usage = { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion,
    ...(cachedTokens === undefined ? {} : { prompt_tokens_details: { cached_tokens: cachedTokens } }) };
  const call = toolCall && { id: `call_${counter}`, type: "function", function: toolCall };
  if (!stream) {
    const message = call ? { role: "assistant", content: null, tool_calls: [call] } : { role: "assistant", content: body };
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ id, object: "chat.completion", created, model: "mock-1", choices: [{ index: 0, message, finish_reason: call ? "tool_calls" : "stop" }], ...(SHAPE.usage ? { usage } : {}) }));
    return;
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  const chunk = (choices, extra = {}) => res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: "mock-1", choices, ...extra })}\n\n`);
  if (call) {
    chunk([{ index: 0, delta: { role: "assistant", tool_calls: [{ index: 0, ...call }] }, finish_reason: null }]);
    chunk([{ index: 0, delta: {}, finish_reason: "tool_calls" }]);
  } else {
    chunk([{ index: 0, delta: { role: "assistant", content: body }, finish_reason: null }]);
    chunk([{ index: 0, delta: {}, finish_reason: "stop" }]);
  }
  if (SHAPE.usage) chunk([], { usage });
  res.write("data: [DONE]\n\n");
  res.end();
}

function reject(res, promptTokens) {
  res.writeHead(400, { "content-type": "application/json" });
  res.end(
    JSON.stringify({
      error: {
        message: `This model's maximum context length is ${Number.isFinite(window) ? window : 8192} tokens. However, your messages resulted in ${promptTokens} tokens.`,
        type: "invalid_request_error",
        code: "context_length_exceeded",
      },
    }),
  );
}

/** The scripted model's answer to an OpenAI-shaped request. */
function reply(body) {
  return scriptedReply(body.messages ?? [], (body.tools ?? []).map((tool) => tool?.function?.name).filter(Boolean));
}

createServer((req, res) => {
  if (req.method === "GET" && req.url.startsWith("/v1/models")) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [{ id: "mock-1", object: "model", owned_by: "vilvona-e2e" }] }));
    return;
  }
  if (req.method !== "POST" || !req.url.startsWith("/v1/chat/completions")) {
    res.writeHead(404);
    res.end();
    return;
  }
  let raw = "";
  req.on("data", (part) => (raw += part));
  req.on("end", () => {
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      res.writeHead(400);
      res.end();
      return;
    }
    const messages = body.messages ?? [];
    const promptTokens = Math.ceil(JSON.stringify(messages).length / 4);
    const countedChars = JSON.stringify(messages).length + (SHAPE.countTools ? JSON.stringify(body.tools ?? []).length : 0);
    const countedTokens = Math.ceil(countedChars / SHAPE.charsPerToken);
    const reserved = SHAPE.maxTokens ? Number(body.max_completion_tokens ?? body.max_tokens ?? 0) : 0;
    const summarizing = (body.tools ?? []).length === 0 && /summar/i.test(messages.map((m) => text(m.content)).join("\n"));
    const users = messages.filter((m) => m.role === "user").map((m) => text(m.content));
    const overflow = users.join("\n").match(/TRIGGER_OVERFLOW_\d+/g)?.find((token) => !overflowed.has(token));
    if (!summarizing) {
      for (const step of users.join("\n").matchAll(/STEP-(\d+):/g)) newestStep = Math.max(newestStep, Number(step[1]));
    }
    const [refuseFrom, refuseTo] = SHAPE.summarizerRefused;
    const refused = summarizing && refuseFrom !== undefined && newestStep >= refuseFrom && newestStep <= refuseTo;
    const rejected = countedTokens + reserved > window || Boolean(overflow) || refused;
    appendFileSync(logFile, JSON.stringify({ ...body, __mock: { stream: summarizing ? "summarizer" : "turn", promptTokens, countedTokens, reserved, rejected, ...(refused ? { refused, step: newestStep } : {}) } }) + "\n");
    if (refused) {
      res.writeHead(503, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "the model is down for maintenance", type: "server_error" } }));
      return;
    }
    if (rejected) {
      if (overflow) overflowed.add(overflow);
      reject(res, countedTokens + reserved);
      return;
    }
    const served = SHAPE.cache && !summarizing ? cacheRead(messages, countedTokens) : undefined;
    const answer = () => respond(res, reply(body), body.stream, countedTokens, served);
    if (summarizing && SHAPE.summarizerDelayMs > 0) setTimeout(answer, SHAPE.summarizerDelayMs);
    else answer();
  });
}).listen(Number(port), "127.0.0.1", () => {
  console.error(`mock-openai listening on 127.0.0.1:${port}`);
});
