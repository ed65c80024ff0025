// The subagent checks of a gateway soak run with SOAK_SPAWNS (scripts/soak-gateway.sh --spawns):
// what every child's model requests and the gateway's log say about the spawns.
//   node soak-subagents.mjs MOCK_JSONL GATEWAY_LOG SESSIONS_JSON
// Each planned child (and a nested fork's own child) was asked by the model and its result
// reached the session that spawned it (the announce); no child request was refused for its
// size; each fork child's prompt holds its parent's history once (no raw turn and no summary
// twice) and the parent's turn that spawned it; an isolated child recalled the parent's fact
// through vilvona_grep; a child spawned with cleanup "delete" left no session in the store; the
// gateway's log has no UNIQUE constraint failure and no turn degraded to legacy. Prints one line
// of figures; exits 1 with the problems.
import { readFileSync } from "node:fs";
import { FACTS, SPAWNS } from "./soak-session.mjs";

const [mockFile, gatewayLog, sessionsFile] = process.argv.slice(2);
const requests = readFileSync(mockFile, "utf8").split("\n").filter(Boolean).map(JSON.parse);
const text = (content) => (typeof content === "string" ? content : Array.isArray(content) ? content.map((block) => block.text ?? "").join("\n") : "");
const taskOf = (request) => {
  const at = request.messages.findLastIndex((m) => m.role === "user" && text(m.content).includes("[Subagent Task]"));
  return at < 0 ? null : /CHILD_TASK-([\d.]+) /.exec(text(request.messages[at].content))?.[1];
};

const children = [];
for (const spawn of SPAWNS) {
  children.push({ id: String(spawn.turn), mode: spawn.mode === "default" ? "isolated" : spawn.mode, spawn, parent: null });
  if (spawn.nest) children.push({ id: `${spawn.turn}.1`, mode: "fork", spawn, parent: String(spawn.turn) });
}
const problems = [];
const figures = [];
for (const child of children) {
  const own = requests.filter((request) => taskOf(request) === child.id);
  if (own.length === 0) {
    problems.push(`child ${child.id} (${child.mode}): its model was never asked`);
    continue;
  }
  const refused = own.filter((request) => request.__mock.rejected);
  if (refused.length) problems.push(`child ${child.id}: ${refused.length} request(s) refused above the window (${refused[0].__mock.countedTokens} tokens)`);
  // The announce: the spawning session's next requests carry the child's result.
  const announced = requests.some((request) => taskOf(request) === child.parent && request.messages.some((m) => m.role === "user" && text(m.content).includes(`CHILD_DONE-${child.id} `)));
  if (!announced) problems.push(`child ${child.id} (${child.mode}): its result never reached ${child.parent ? `child ${child.parent}` : "the parent"}`);
  const largest = Math.max(...own.map((request) => request.__mock.countedTokens));
  figures.push(`${child.id} ${child.mode}: ${own.length} requests, ≤${largest} tokens`);
  if (child.mode === "fork") {
    for (const request of own) {
      const raw = new Map();
      const summaries = new Map();
      for (const m of request.messages) {
        const body = text(m.content);
        const step = m.role === "user" && /^(?:\[[^\]]*\] )?STEP-(\d+): refactor step/.exec(body);
        if (step) raw.set(step[1], (raw.get(step[1]) ?? 0) + 1);
        for (const [, id] of body.matchAll(/<summary id="(sum_[0-9a-f]+)"/g)) summaries.set(id, (summaries.get(id) ?? 0) + 1);
      }
      const twice = [...raw].filter(([, count]) => count > 1).map(([step]) => `STEP-${step}`).concat([...summaries].filter(([, count]) => count > 1).map(([id]) => id));
      if (twice.length) problems.push(`fork ${child.id}: its prompt holds ${twice.slice(0, 4).join(", ")} more than once`);
    }
    const first = own[0];
    const spawning = child.parent ? `CHILD_TASK-${child.parent} ` : `STEP-${child.spawn.turn}: refactor step`;
    if (!first.messages.some((m) => text(m.content).includes(spawning))) problems.push(`fork ${child.id}: its prompt lacks the turn that spawned it (${spawning})`);
  }
  if (child.spawn.recall && !child.parent) {
    const fact = FACTS.find((planted) => planted.id === child.spawn.recall);
    const found = requests.some((request) => request.messages.some((m) => text(m.content).includes(`CHILD_DONE-${child.id} ${child.spawn.mode}: found ${fact.value}`)));
    if (!found) problems.push(`child ${child.id}: did not recall the parent's ${fact.id} (${fact.value}) through vilvona_grep`);
  }
}

const log = readFileSync(gatewayLog, "utf8");
for (const [what, pattern] of [["a UNIQUE constraint failure", /UNIQUE constraint/], ["a turn degraded to legacy", /degraded to "?legacy/]]) {
  const line = log.split("\n").find((l) => pattern.test(l));
  if (line) problems.push(`the gateway's log has ${what}: ${line.slice(0, 300)}`);
}
// Children kept (not deleted) stay in the store, besides the session that spawned them.
const sessions = JSON.parse(readFileSync(sessionsFile, "utf8"));
const list = Array.isArray(sessions) ? sessions : sessions.sessions ?? [];
const stored = list.filter((session) => /:subagent:/.test(session.key ?? session.sessionKey ?? "")).length;
const kept = children.filter((child) => child.spawn.cleanup !== "delete" || child.parent).length;
if (stored !== kept) problems.push(`${stored} child sessions stored, ${kept} expected (a child spawned with cleanup "delete" goes)`);
console.log(`subagents: ${children.length} children (${figures.join("; ")}), ${stored} kept in the store`);
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
