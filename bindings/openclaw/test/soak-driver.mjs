// Drives the gateway soak's scripted session through OpenClaw's OpenAI-compatible endpoint, one
// turn at a time, as a client app would (a fixed `user`, so every turn is one session).
//   node soak-driver.mjs GATEWAY_URL TOKEN TURNS RESULTS_FILE [SESSIONS]
// With SESSIONS > 1, that many sessions (users `soak-1` …) run the script at once, each one turn
// at a time. `SOAK_FROM_TURN` / `SOAK_TO_TURN` drive only those turns of the script (a gateway
// restarted between two runs of the driver). Appends one JSON line per turn to RESULTS_FILE ({session, turn, kind, fact?,
// expect?, said, status, ms, reply}: `said`, a digest of the turn's text, tells two runs of one conversation from two of
// different ones) and prints a line per turn; exits 0 when every turn was answered
// (the checks on the answers are the caller's).
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { appendFileSync } from "node:fs";
import { FACTS, script } from "./soak-session.mjs";

const [url, token, turnsArg, resultsFile, sessionsArg] = process.argv.slice(2);
const sessions = Number(sessionsArg ?? 1);
const TURN_TIMEOUT_MS = 240_000;
let failed = 0;

// `SOAK_RESETS` (turn numbers): after each, the session is reset as `/new` does (OpenClaw's
// `sessions.reset`, reason "new").
const RESETS = (process.env.SOAK_RESETS ?? "").split(",").filter(Boolean).map(Number);
function reset(user) {
  const params = JSON.stringify({ key: `agent:main:openai-user:${user}`, reason: "new" });
  const answer = execFileSync("openclaw", ["gateway", "call", "sessions.reset", "--url", url.replace(/^http/, "ws"), "--token", token, "--params", params, "--json"], { encoding: "utf8" });
  console.log(`${user}: reset: ${answer.replace(/\s+/g, " ").slice(0, 300)}`);
}

const FROM_TURN = Number(process.env.SOAK_FROM_TURN ?? 1);
const TO_TURN = Number(process.env.SOAK_TO_TURN ?? Infinity);

async function drive(user) {
  for (const turn of script(Number(turnsArg)).filter((turn) => turn.turn >= FROM_TURN && turn.turn <= TO_TURN)) {
    const started = performance.now();
    let status = 0;
    let reply = "";
    try {
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: JSON.stringify({ model: "openclaw", user, messages: [{ role: "user", content: turn.text }] }),
        signal: AbortSignal.timeout(TURN_TIMEOUT_MS),
      });
      status = response.status;
      const body = await response.text();
      try {
        const parsed = JSON.parse(body);
        reply = parsed.choices?.[0]?.message?.content ?? parsed.error?.message ?? body;
      } catch {
        reply = body;
      }
    } catch (error) {
      reply = String(error?.message ?? error);
    }
    const ms = Math.round(performance.now() - started);
    if (status !== 200) failed += 1;
    const expect = turn.fact ? FACTS.find((fact) => fact.id === turn.fact).value : undefined;
    const said = createHash("sha256").update(turn.text).digest("hex").slice(0, 16);
    const record = { session: user, turn: turn.turn, kind: turn.kind, fact: turn.fact, expect, said, status, ms, reply: String(reply).slice(0, 2000) };
    appendFileSync(resultsFile, JSON.stringify(record) + "\n");
    console.log(`${user} turn ${turn.turn} ${turn.kind}${turn.fact ? ` ${turn.fact}` : ""}: ${status} in ${ms} ms${status === 200 ? "" : `: ${String(reply).slice(0, 300)}`}`);
    if (RESETS.includes(turn.turn)) reset(user);
  }
}

const users = sessions === 1 ? ["soak"] : Array.from({ length: sessions }, (_, index) => `soak-${index + 1}`);
await Promise.all(users.map(drive));
process.exit(failed === 0 ? 0 : 1);
