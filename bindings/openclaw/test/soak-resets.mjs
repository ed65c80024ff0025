// The reset checks of a gateway soak run with SOAK_RESETS (scripts/soak-gateway.sh --resets):
// OpenClaw's `/new` keeps the session id and starts a new window of its transcript.
//   node soak-resets.mjs MOCK_JSONL SESSIONS_JSON STATS_JSON TURNS
// After each reset, no request of the session holds a turn of before (the driver's own user
// message) or a summary that a request before it held; `vilvona stats --session KEY` (the
// panel's lookup) names the session as it is now, and the earlier window is stored under the
// session id with the reset appended. Prints one line of figures; exits 1 with the problems.
import { readFileSync } from "node:fs";
import { script } from "./soak-session.mjs";

const [mockFile, sessionsFile, statsFile, turnCount] = process.argv.slice(2);
const requests = readFileSync(mockFile, "utf8").split("\n").filter(Boolean).map(JSON.parse);
const text = (content) => (typeof content === "string" ? content : Array.isArray(content) ? content.map((block) => block.text ?? "").join("\n") : "");
const resets = (process.env.SOAK_RESETS ?? "").split(",").filter(Boolean).map(Number);
const turns = script(Number(turnCount));

// The driver's turns a request holds, by number: its user messages that are one (OpenClaw may
// put a time in front).
const turnsIn = (request) =>
  request.messages
    .filter((m) => m.role === "user")
    .map((m) => text(m.content))
    .flatMap((body) => turns.filter((turn) => body === turn.text || body.endsWith(`] ${turn.text}`)).map((turn) => turn.turn));
const summariesIn = (request) => request.messages.flatMap((m) => [...text(m.content).matchAll(/<summary id="(sum_[0-9a-f]+)"/g)].map((found) => found[1]));

const problems = [];
const figures = [];
for (const reset of resets) {
  const first = requests.findIndex((request) => turnsIn(request).some((turn) => turn > reset));
  if (first < 0) {
    problems.push(`reset after turn ${reset}: no request came after it`);
    continue;
  }
  const before = new Set(requests.slice(0, first).flatMap(summariesIn));
  const after = requests.slice(first);
  for (const [index, request] of after.entries()) {
    const old = turnsIn(request).filter((turn) => turn <= reset);
    const kept = summariesIn(request).filter((id) => before.has(id));
    if (old.length || kept.length) {
      problems.push(`reset after turn ${reset}: request ${first + index} holds ${[...old.map((turn) => `turn ${turn}`), ...kept].slice(0, 4).join(", ")} of before`);
      break;
    }
  }
  figures.push(`${after.length} requests after the reset of turn ${reset}, none with a turn or summary of before`);
}

const sessions = JSON.parse(readFileSync(sessionsFile, "utf8"));
const stats = JSON.parse(readFileSync(statsFile, "utf8"));
const mine = sessions.filter((session) => session.key === "agent:main:openai-user:soak");
const live = mine.find((session) => !session.id.includes("@"));
const earlier = mine.filter((session) => session.id.includes("@"));
if (!live) problems.push(`no session of the key under its own id: ${JSON.stringify(mine)}`);
else if (stats.session !== live.id) problems.push(`vilvona stats --session KEY shows ${stats.session}, not the session as it is now (${live.id})`);
if (earlier.length !== resets.length || earlier.some((session) => !live || !session.id.startsWith(`${live.id}@new-`))) {
  problems.push(`${earlier.length} earlier windows stored (${earlier.map((session) => session.id).join(", ")}), ${resets.length} expected under ${live?.id}@new-…`);
}
figures.push(`the key names ${stats.session} (${stats.messages} messages); before: ${earlier.map((session) => `${session.id} (${session.messages} messages)`).join(", ")}`);
console.log(`resets: ${figures.join("; ")}`);
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
