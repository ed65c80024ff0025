// The scripted model behind the mock providers (mock-openai.mjs, mock-anthropic.mjs): what it
// answers a request, whichever API the request came by. A request reaches it as a chat in
// OpenAI's shape — `{role: system|user|assistant|tool, content, tool_calls?}` — and the names of
// the tools it offers; the answer is `{body}` (text) or `{toolCall: {name, arguments}}`
// (arguments as JSON text).
//
// Replies are deterministic:
//   - a request without tools that mentions summarizing: a naive digest (the first 80 characters
//     of each line, at most 1,600) under the sections OpenClaw's compaction audit requires;
//   - a turn whose text says READ_FILE <path> (and has no tool result yet): a `read` call;
//   - a turn whose text says RECALL_TOOL <words>: a `vilvona_grep` call with those words;
//   - a soak question (`QUESTION <fact>:`): the planted value when the prompt holds it, else one
//     call to the recall tool the request offers, then the value if the tool's result holds it
//     (with MOCK_NO_RECALL=1, a model that never calls a recall tool: the value when the prompt
//     holds it, else "unknown");
//   - a spawned child's task, and a turn that delegates to one (soak-session.mjs);
//   - otherwise a short answer.
import { FACTS, SPAWNS, childTask } from "./soak-session.mjs";

const REQUIRED_SECTIONS = ["## Decisions", "## Open TODOs", "## Constraints/Rules", "## Pending user asks", "## Exact identifiers"];

/** A model that answers only from its prompt and never calls a recall tool (MOCK_NO_RECALL=1). */
const NO_RECALL = process.env.MOCK_NO_RECALL === "1";

let counter = 0;

/** The text of a message's content: a string, or the text of its parts. */
export function text(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part?.text ?? "").join("\n");
  return "";
}

/** Whether a request asks for a summary: no tools, and the words say so. */
export function isSummaryRequest(messages, toolNames) {
  return toolNames.length === 0 && /summar/i.test(messages.map((m) => text(m.content)).join("\n"));
}

/** A lossy digest: a fact in the middle of a long line does not survive it. */
function digest(messages) {
  const lines = messages
    .filter((m) => m.role !== "system")
    .flatMap((m) => text(m.content).split("\n"))
    .map((line) => line.trim().slice(0, 80))
    .filter(Boolean);
  let body = "";
  for (const line of lines) {
    if (body.length + line.length + 3 > 1600) break;
    body += `- ${line}\n`;
  }
  return [REQUIRED_SECTIONS[0], body.trimEnd() || "- none", REQUIRED_SECTIONS[1], "- none", REQUIRED_SECTIONS[2], "- none", REQUIRED_SECTIONS[3], "none", REQUIRED_SECTIONS[4], "- none"].join("\n");
}

/** The recall call this request can make: the tool directly, or through OpenClaw's tool_call. */
function recallCall(toolNames, query) {
  if (NO_RECALL) return null;
  const names = new Set(toolNames);
  if (names.has("vilvona_grep")) return { name: "vilvona_grep", arguments: JSON.stringify({ query }) };
  if (names.has("tool_call")) return { name: "tool_call", arguments: JSON.stringify({ id: "vilvona_grep", args: { query } }) };
  return null;
}

/** What the model answers `messages` (OpenAI's shape), offered the tools named `toolNames`. */
export function reply(messages, toolNames) {
  counter += 1;
  const everything = messages.map((m) => text(m.content)).join("\n");
  if (toolNames.length === 0 && /summar/i.test(everything)) return { body: digest(messages) };
  // The current turn: everything after the previous turn's final answer (an assistant message
  // without tool calls). OpenClaw appends an internal-context user block after the prompt.
  let turnStart = 0;
  messages.forEach((m, index) => {
    if (m.role === "assistant" && !(m.tool_calls && m.tool_calls.length)) turnStart = index + 1;
  });
  const turn = messages.slice(turnStart);
  // What the engine recalled into the prompt (a `<recall …>` block before the request) is
  // reference, not the request: the turn's directives are read without it, as a model would.
  const userText = turn.filter((m) => m.role === "user").map((m) => text(m.content)).join("\n");
  const turnText = userText.replace(/<recall[\s\S]*?<\/recall>/g, "");
  const toolText = turn.filter((m) => m.role === "tool").map((m) => text(m.content)).join(" ");
  const toolDone = turn.some((m) => m.role === "tool");
  // A spawned child's task: the last `[Subagent Task]` (a fork's copy of its parent's turn
  // comes before it, and a fork of a fork also holds its parent's task as background). What
  // the child did is what follows that message.
  const taskAt = messages.findLastIndex((m) => m.role === "user" && text(m.content).includes("[Subagent Task]"));
  const child = taskAt >= 0 && /CHILD_TASK-([\d.]+) (\w+)(?: RECALL (\w+))?( NEST)?/.exec(text(messages[taskAt].content));
  if (child) {
    const [, id, mode, recall, nest] = child;
    const own = messages.slice(taskAt + 1);
    const ownTools = own.filter((m) => m.role === "tool").map((m) => text(m.content)).join(" ");
    const fact = recall && FACTS.find((planted) => planted.id === recall);
    if (fact && !ownTools) {
      const call = recallCall(toolNames, fact.query);
      if (call) return { toolCall: call };
    }
    if (nest && !ownTools) {
      const args = { task: `CHILD_TASK-${id}.1 fork: review what step ${id.split(".")[0]} found and report.`, label: `step-${id}-nested`, context: "fork" };
      return { toolCall: { name: "tool_call", arguments: JSON.stringify({ id: "sessions_spawn", args }) } };
    }
    const found = fact ? (ownTools.includes(fact.value) ? ` found ${fact.value}` : " found nothing") : "";
    return { body: `CHILD_DONE-${id} ${mode}:${found} reviewed the module of step ${id}.` };
  }
  // A turn that delegates: its read first, then the spawn, then the step's answer.
  const delegate = /SPAWN_SUBAGENT (\d+)/.exec(turnText);
  const spawned = turn.some((m) => (m.tool_calls ?? []).some((c) => /sessions_spawn/.test(`${c.function?.name} ${c.function?.arguments}`)));
  const readDone = turn.some((m) => (m.tool_calls ?? []).some((c) => c.function?.name === "read"));
  const spawn = delegate && SPAWNS.find((planned) => planned.turn === Number(delegate[1]));
  if (spawn && readDone && !spawned) {
    const args = { task: childTask(spawn), label: `step-${spawn.turn}-${spawn.mode}`, ...(spawn.mode === "default" ? {} : { context: spawn.mode }), ...(spawn.cleanup ? { cleanup: spawn.cleanup } : {}) };
    return { toolCall: { name: "tool_call", arguments: JSON.stringify({ id: "sessions_spawn", args }) } };
  }
  const question = /QUESTION (\w+):/.exec(turnText);
  const fact = question && FACTS.find((planted) => planted.id === question[1]);
  if (fact) {
    const before = messages.slice(0, turnStart).map((m) => text(m.content)).join("\n");
    // The prompt's own text of the turn (a recall block the engine placed before the question,
    // say) counts as the prompt too; a tool's result does not.
    const prompt = `${before}\n${userText}`;
    if (prompt.replace(/QUESTION \w+:[^\n]*/g, "").includes(fact.value)) return { body: `ANSWER ${fact.id} (from the context): ${fact.value}` };
    if (!toolDone) {
      const call = recallCall(toolNames, fact.query);
      if (call) return { toolCall: call };
    }
    return { body: toolText.includes(fact.value) ? `ANSWER ${fact.id} (from recall): ${fact.value}` : `ANSWER ${fact.id}: unknown` };
  }
  const read = /READ_FILE (\S+)/.exec(turnText);
  if (read && !toolDone) return { toolCall: { name: "read", arguments: JSON.stringify({ path: read[1] }) } };
  const step = /STEP-(\d+)/.exec(turnText);
  if (step) {
    return {
      body: `Step ${step[1]} done: reviewed ${read?.[1] ?? "the module"} (${toolText.length} chars of tool output). The change keeps the public API stable, adds a regression test, and leaves the migration for later.`,
    };
  }
  const recall = /RECALL_TOOL\s+([^\n<]*)/.exec(turnText);
  if (recall && !toolDone) {
    // vilvona's tools are deferred-schema tools in OpenClaw 2026.9: called through tool_call.
    const args = { id: "vilvona_grep", args: { query: recall[1].trim() || "ticket" } };
    return { toolCall: { name: "tool_call", arguments: JSON.stringify(args) } };
  }
  return { body: toolText ? `Recalled: ${toolText.slice(0, 400)}` : `ok ${counter}` };
}
