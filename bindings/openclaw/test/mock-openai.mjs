// A mock OpenAI-compatible server for the end-to-end test, on 127.0.0.1 only.
//   node mock-openai.mjs PORT LOGFILE
// Serves GET /v1/models and POST /v1/chat/completions (SSE when `stream` is set, else JSON),
// appends each request body to LOGFILE (one JSON object per line), and:
//   - a user message containing a new TRIGGER_OVERFLOW_<n> token gets one 400
//     context_length_exceeded, then normal replies;
//   - a turn whose prompt contains RECALL_TOOL (and no tool result yet) gets a tool call to
//     vilvona_grep (through OpenClaw's tool_call) with the words after the token as the query.
import { createServer } from "node:http";
import { appendFileSync } from "node:fs";

const [port, logFile] = process.argv.slice(2);
const overflowed = new Set();
let counter = 0;

function text(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part?.text ?? "").join("\n");
  return "";
}

function respond(res, body, stream, toolCall) {
  const id = `chatcmpl-${++counter}`;
  const created = Math.floor(Date.now() / 1000);
  const usage = { prompt_tokens: 1000, completion_tokens: 10, total_tokens: 1010 };
  if (!stream) {
    const message = toolCall
      ? { role: "assistant", content: null, tool_calls: [{ id: "call_recall", type: "function", function: toolCall }] }
      : { role: "assistant", content: body };
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ id, object: "chat.completion", created, model: "mock-1", choices: [{ index: 0, message, finish_reason: toolCall ? "tool_calls" : "stop" }], usage }));
    return;
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  const chunk = (choices, extra = {}) => res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: "mock-1", choices, ...extra })}\n\n`);
  if (toolCall) {
    chunk([{ index: 0, delta: { role: "assistant", tool_calls: [{ index: 0, id: "call_recall", type: "function", function: toolCall }] }, finish_reason: null }]);
    chunk([{ index: 0, delta: {}, finish_reason: "tool_calls" }]);
  } else {
    chunk([{ index: 0, delta: { role: "assistant", content: body }, finish_reason: null }]);
    chunk([{ index: 0, delta: {}, finish_reason: "stop" }]);
  }
  chunk([], { usage });
  res.write("data: [DONE]\n\n");
  res.end();
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
    appendFileSync(logFile, JSON.stringify(body) + "\n");
    const messages = body.messages ?? [];
    const users = messages.filter((m) => m.role === "user").map((m) => text(m.content));
    const everything = users.join("\n");
    const overflow = everything.match(/TRIGGER_OVERFLOW_\d+/g)?.find((token) => !overflowed.has(token));
    if (overflow) {
      overflowed.add(overflow);
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.", type: "invalid_request_error", code: "context_length_exceeded" } }));
      return;
    }
    // The current turn: everything after the previous turn's final answer (an assistant message
    // without tool calls). OpenClaw appends an internal-context user block after the prompt.
    let turnStart = 0;
    messages.forEach((m, index) => {
      if (m.role === "assistant" && !(m.tool_calls && m.tool_calls.length)) turnStart = index + 1;
    });
    const turn = messages.slice(turnStart);
    const turnText = turn.filter((m) => m.role === "user").map((m) => text(m.content)).join("\n");
    const recall = /RECALL_TOOL\s+([^\n<]*)/.exec(turnText);
    const toolDone = turn.some((m) => m.role === "tool");
    if (recall && !toolDone) {
      // vilvona's tools are deferred-schema tools in OpenClaw 2026.9: called through tool_call.
      const args = { id: "vilvona_grep", args: { query: recall[1].trim() || "ticket" } };
      respond(res, "", body.stream, { name: "tool_call", arguments: JSON.stringify(args) });
      return;
    }
    const toolText = turn.filter((m) => m.role === "tool").map((m) => text(m.content)).join(" ");
    respond(res, toolText ? `Recalled: ${toolText.slice(0, 400)}` : `ok ${counter}`, body.stream, null);
  });
}).listen(Number(port), "127.0.0.1", () => {
  console.error(`mock-openai listening on 127.0.0.1:${port}`);
});
