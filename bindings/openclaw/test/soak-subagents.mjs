// The subagent checks of a gateway soak run with SOAK_SPAWNS (scripts/soak-gateway.sh --spawns):
// what every child's model requests and the gateway's log say about the spawns.
//   node soak-subagents.mjs MOCK_JSONL GATEWAY_LOG SESSIONS_JSON
//   node soak-subagents.mjs --settle MOCK_JSONL SECONDS
// Each planned child (and a nested fork's own child) was asked by the model and its result
// reached the session that spawned it (the announce); no child request was refused for its
// size; each fork child's prompt holds its parent's history once (no raw turn and no summary
// twice) and the parent's turn that spawned it; an isolated child recalled the parent's fact
// through vilvona_grep; a child spawned with cleanup "delete" left no session in the store; the
// gateway's log has no UNIQUE constraint failure and no turn degraded to legacy. Prints one line
// of figures; exits 1 with the problems. A child never asked, with OpenClaw's own database held
// past its busy timeout in the log (a run it fails before the model call: seen once in CI on 2
// cores, a 10 s hold in its `heartbeat.outcome.claim`), is the host's failure, not the engine's:
// the gateway's lines about that child and the database are printed, and it exits 3 (the
// caller may run the cell once more) unless another problem stands.
// `--settle` waits (at most SECONDS) until every child's result has reached a model request:
// a child spawned near the session's last turn may not have started when the driver is done,
// and a gateway stopped then never runs it. It says what it waited for; the checks judge.
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { FACTS, SPAWNS } from "./soak-session.mjs";

const text = (content) => (typeof content === "string" ? content : Array.isArray(content) ? content.map((block) => block.text ?? "").join("\n") : "");

const children = [];
for (const spawn of SPAWNS) {
  children.push({ id: String(spawn.turn), mode: spawn.mode === "default" ? "isolated" : spawn.mode, spawn, parent: null });
  if (spawn.nest) children.push({ id: `${spawn.turn}.1`, mode: "fork", spawn, parent: String(spawn.turn) });
}

if (process.argv[2] === "--settle") {
  const [, mockFile, seconds] = process.argv.slice(2);
  const started = performance.now();
  const waiting = () => {
    const all = readFileSync(mockFile, "utf8");
    return children.filter((child) => !all.includes(`CHILD_DONE-${child.id} `)).map((child) => child.id);
  };
  let left = waiting();
  while (left.length && performance.now() - started < Number(seconds) * 1000) {
    await sleep(250);
    left = waiting();
  }
  const waited = ((performance.now() - started) / 1000).toFixed(1);
  console.log(left.length ? `subagents: still waiting for child ${left.join(", ")} after ${waited} s` : `subagents: every child's result reached a model ${waited} s after the last turn`);
  process.exit(0);
}

const [mockFile, gatewayLog, sessionsFile] = process.argv.slice(2);
const requests = readFileSync(mockFile, "utf8").split("\n").filter(Boolean).map(JSON.parse);
const taskOf = (request) => {
  const at = request.messages.findLastIndex((m) => m.role === "user" && text(m.content).includes("[Subagent Task]"));
  return at < 0 ? null : /CHILD_TASK-([\d.]+) /.exec(text(request.messages[at].content))?.[1];
};

// What became of the `sessions_spawn` call that should have made child `id`: the tool's answer
// in the first request that carries it, or that the model never made the call.
const spawnOutcome = (id) => {
  const task = `CHILD_TASK-${id} `;
  let called = false;
  for (const request of requests) {
    const at = request.messages.findIndex((m) => (m.tool_calls ?? []).some((call) => call.function?.arguments?.includes(task)));
    if (at < 0) continue;
    called = true;
    const answer = request.messages.slice(at + 1).find((m) => m.role === "tool");
    if (answer) return `the spawn answered: ${text(answer.content).replace(/\s+/g, " ").slice(0, 400)}`;
  }
  return called ? "the spawn was called and no answer reached the model" : "the model never called sessions_spawn for it";
};

const log = readFileSync(gatewayLog, "utf8").split("\n");
// OpenClaw's own database held (a write refused, a transaction held for seconds), near the
// lines about a child it never ran: a line that names OpenClaw's agent database, or says a
// database is locked and is not vilvona's (vilvona's stderr is in the same log).
const hostHeldAt = (index) => {
  const line = log[index];
  const openclaws = /openclaw-agent\.sqlite/.test(line) || (!/vilvona/i.test(line) && /database is locked/.test(line));
  return openclaws && /database is locked|slow SQLite transaction hold/.test(line);
};
const NEAR = 200;
const hostHeld = [];
const problems = [];
// Children the host never ran: with its database held, the host's failure.
const neverAsked = [];
const figures = [];
for (const child of children) {
  const own = requests.filter((request) => taskOf(request) === child.id);
  if (own.length === 0) {
    const outcome = spawnOutcome(child.id);
    neverAsked.push(`child ${child.id} (${child.mode}): its model was never asked; ${outcome}`);
    // What the gateway said about it: the lines naming its session or run.
    const names = outcome.match(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g) ?? [];
    const naming = log.flatMap((l, index) => (names.some((name) => l.includes(name)) ? [index] : []));
    for (const index of naming.slice(0, 8)) neverAsked.push(`  gateway: ${log[index].slice(0, 300)}`);
    // The host's database held within a few hundred lines of them.
    for (const index of naming) {
      for (let near = Math.max(0, index - NEAR); near < Math.min(log.length, index + NEAR); near++) {
        if (hostHeldAt(near) && !hostHeld.includes(log[near])) hostHeld.push(log[near]);
      }
    }
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
      // The work turns a summary in the prompt stands for (their requests' STEP lines).
      const summarized = new Set();
      for (const m of request.messages) {
        const body = text(m.content);
        const step = m.role === "user" && /^(?:\[[^\]]*\] )?STEP-(\d+): refactor step/.exec(body);
        if (step) raw.set(step[1], (raw.get(step[1]) ?? 0) + 1);
        for (const [, id] of body.matchAll(/<summary id="(sum_[0-9a-f]+)"/g)) summaries.set(id, (summaries.get(id) ?? 0) + 1);
        for (const [block] of body.matchAll(/<summary id="sum_[0-9a-f]+"[\s\S]*?<\/summary>/g)) {
          for (const [, held] of block.matchAll(/STEP-(\d+): refactor step/g)) summarized.add(held);
        }
      }
      const twice = [...raw].filter(([, count]) => count > 1).map(([step]) => `STEP-${step}`).concat([...summaries].filter(([, count]) => count > 1).map(([id]) => id));
      if (twice.length) problems.push(`fork ${child.id}: its prompt holds ${twice.slice(0, 4).join(", ")} more than once`);
      // A summary shown beside its own raw rows is that history twice too.
      const beside = [...raw.keys()].filter((step) => summarized.has(step));
      if (beside.length) problems.push(`fork ${child.id}: its prompt holds STEP-${beside.slice(0, 4).join(", STEP-")} raw beside a summary of it`);
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

for (const [what, pattern] of [["a UNIQUE constraint failure", /UNIQUE constraint/], ["a turn degraded to legacy", /degraded to "?legacy/]]) {
  const line = log.find((l) => pattern.test(l));
  if (line) problems.push(`the gateway's log has ${what}: ${line.slice(0, 300)}`);
}
// Children kept (not deleted) stay in the store, besides the session that spawned them.
const sessions = JSON.parse(readFileSync(sessionsFile, "utf8"));
const list = Array.isArray(sessions) ? sessions : sessions.sessions ?? [];
const stored = list.filter((session) => /:subagent:/.test(session.key ?? session.sessionKey ?? "")).length;
const kept = children.filter((child) => child.spawn.cleanup !== "delete" || child.parent).length;
// A child never run is a session never stored: counted with the children never asked.
const storedProblem = stored !== kept ? `${stored} child sessions stored, ${kept} expected (a child spawned with cleanup "delete" goes)` : null;
if (storedProblem && !neverAsked.length) problems.push(storedProblem);
console.log(`subagents: ${children.length} children (${figures.join("; ")}), ${stored} kept in the store`);
if (neverAsked.length) {
  const held = hostHeld.map((line) => `  gateway: ${line.slice(0, 300)}`);
  console.error([...neverAsked, ...(storedProblem ? [storedProblem] : []), ...(held.length ? ["OpenClaw's own database was held meanwhile:", ...held] : [])].join("\n"));
  if (!hostHeld.length) problems.push("a child was never asked, with OpenClaw's database never held");
}
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
if (neverAsked.length) {
  console.error("subagents: OpenClaw failed a child's run while its own database was held (the host's failure, not the engine's)");
  process.exit(3);
}
