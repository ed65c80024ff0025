// The scripted session of the gateway soak (scripts/soak-gateway.sh), shared by its driver and
// its mock model: deterministic work turns that each read a seeded source file, facts planted
// in the middle of long lines early on, and questions about them at the end.
//
// A work turn is about 3.1k tokens: a user message of about 3.4k characters (a `STEP-n` task
// line naming `READ_FILE src/mod_NN.py`, then one long line of notes), the model's `read` call,
// the file (about 8k characters) and a short answer.

const WORDS = (
  "trigger table index token snapshot retry endpoint module shard future session worker " +
  "invoice backoff cache mutex migration budget column cursor span webhook router gauge " +
  "payload buffer closure lexer metric ledger stream parser allocator lease iterator " +
  "tenant queue replica account channel header batch promise schema"
).split(" ");

/**
 * Planted facts: the turn that states one, the sentence, the value a question must get back.
 * With `SOAK_FACTS=passing` every fact is stated in passing (no "remember", nothing a
 * summarizer pins) and asked in other words: only recall finds them once their turns are
 * folded.
 */
const REMEMBERED = [
  { id: "port", turn: 3, sentence: "Please remember: the staging DB port is 6543.", value: "6543", question: "What is the staging DB port?", query: "staging DB port" },
  { id: "flag", turn: 6, sentence: "Please remember: the billing rollout flag is BILLING_V2_KESTREL.", value: "BILLING_V2_KESTREL", question: "Which flag gates the billing rollout?", query: "billing rollout flag" },
  { id: "oncall", turn: 9, sentence: "Please remember: the on-call engineer this week is Oriana Blevins.", value: "Oriana Blevins", question: "Who is the on-call engineer this week?", query: "on-call engineer" },
  { id: "branch", turn: 12, sentence: "Please remember: the release branch is release/2026.12-wren.", value: "release/2026.12-wren", question: "What is the release branch?", query: "release branch" },
  { id: "bucket", turn: 15, sentence: "Please remember: the nightly backup bucket is acme-nightly-bk-4410.", value: "acme-nightly-bk-4410", question: "Which bucket holds the nightly backups?", query: "nightly backup bucket" },
];

/** The remembered facts, said in passing and asked in other words (`SOAK_FACTS=passing`). */
const IN_PASSING = {
  port: { sentence: "We bumped the staging DB onto 6543 last week, which is why the old connection strings time out.", question: "Which port does the staging database listen on now?" },
  flag: { sentence: "The new billing code path only runs when BILLING_V2_KESTREL is on, so the old toggle does nothing anymore.", question: "What is the name of the switch for the new billing code?" },
  oncall: { sentence: "Oriana Blevins carries the pager until Friday, so the alerts go to her.", question: "Who gets paged for alerts these days?" },
  branch: { sentence: "The cut goes out from release/2026.12-wren this time, not from main.", question: "Which branch does the next release ship from?" },
  bucket: { sentence: "Every night the backups land in acme-nightly-bk-4410 now that the old one filled up.", question: "Where do the nightly backups end up?" },
};

const ALWAYS_IN_PASSING = [
  // Stated in passing (no "remember", nothing a summarizer pins) and asked in other words: only
  // recall through the tools finds them once their turns are summarized.
  { id: "canary", turn: 4, sentence: "By the way we moved the canary fleet over to eu-north-3 yesterday, which is why the latency graphs shifted.", value: "eu-north-3", question: "In which region do the canary machines run these days?", query: "canary fleet moved" },
  { id: "flaky", turn: 7, sentence: "Side note, the flaky login test is tracked as QA-3318 and Dmitri owns it.", value: "QA-3318", question: "Which ticket tracks the unstable sign-in test?", query: "flaky login test tracked" },
];

export const FACTS = [
  ...(process.env.SOAK_FACTS === "passing" ? REMEMBERED.map((fact) => ({ ...fact, ...IN_PASSING[fact.id] })) : REMEMBERED),
  ...ALWAYS_IN_PASSING,
];

/**
 * Subagents the session spawns (`SOAK_SPAWNS`, as `5:fork,12:isolated:flag,20:default:delete`):
 * at work turn `turn`, after its `read`, the model calls `sessions_spawn` with the `context`
 * (`fork`, `isolated`, or `default`: none given), the child recalling a planted fact of the
 * parent's when one is named, `cleanup: "delete"` when asked, and (`nest`) the child forking
 * a child of its own.
 */
export const SPAWNS = (process.env.SOAK_SPAWNS ?? "")
  .split(",")
  .filter(Boolean)
  .map((spec) => {
    const [turn, mode, ...rest] = spec.split(":");
    const recall = rest.find((part) => FACTS.some((fact) => fact.id === part));
    return { turn: Number(turn), mode, recall, cleanup: rest.includes("delete") ? "delete" : undefined, nest: rest.includes("nest") };
  });

/** The task a spawned child gets: what the mock answers it by (`NEST`: the child forks a child of its own, `CHILD_TASK-<turn>.1`). */
export function childTask(spawn) {
  return `CHILD_TASK-${spawn.turn} ${spawn.mode}${spawn.recall ? ` RECALL ${spawn.recall}` : ""}${spawn.nest ? " NEST" : ""}: review the module of step ${spawn.turn} and report.`;
}

/** A small deterministic generator (mulberry32), seeded per turn or file. */
function random(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function pick(next, list) {
  return list[Math.floor(next() * list.length)];
}

/** How many seeded source files there are (`src/mod_01.py` …). */
export const FILES = 12;

/** The module a work turn reads. */
export function moduleOf(turn) {
  return ((turn * 5) % FILES) + 1;
}

export function modulePath(module) {
  return `src/mod_${String(module).padStart(2, "0")}.py`;
}

/** A seeded source file of about 8k characters. */
export function fileText(module) {
  const next = random(1000 + module);
  const lines = [`# module mod_${String(module).padStart(2, "0")}: the ${pick(next, WORDS)} ${pick(next, WORDS)} service`];
  let length = lines[0].length;
  for (let index = 1; length < 7950; index += 1) {
    const [a, b, c, d] = [pick(next, WORDS), pick(next, WORDS), pick(next, WORDS), pick(next, WORDS)];
    const block =
      `def ${a}_${b}_${index}(self, ${c}, ${d}=None):\n` +
      `    """Handle the ${pick(next, WORDS)} ${pick(next, WORDS)} for the ${pick(next, WORDS)}."""\n` +
      `    value = self.${pick(next, WORDS)}.get(${c}) or ${Math.floor(next() * 1000)}\n` +
      `    return self.${pick(next, WORDS)}_${pick(next, WORDS)}(value, retries=${1 + Math.floor(next() * 8)})\n`;
    lines.push(block);
    length += block.length + 1;
  }
  return lines.join("\n");
}

/** The user message of work turn `turn` (1-based): a task line, then one long line of notes. */
export function workMessage(turn) {
  const next = random(turn);
  const head = `STEP-${turn}: refactor step ${turn} of the service. Read the module and propose the change. READ_FILE ${modulePath(moduleOf(turn))}`;
  const sentences = [];
  let length = 0;
  while (length < 3400) {
    const words = Array.from({ length: 12 }, () => pick(next, WORDS));
    const sentence = words.join(" ");
    sentences.push(sentence[0].toUpperCase() + sentence.slice(1) + ".");
    length += sentence.length + 2;
  }
  const fact = FACTS.find((planted) => planted.turn === turn);
  if (fact) sentences.splice(Math.floor(sentences.length / 2), 0, fact.sentence);
  const spawn = SPAWNS.find((planned) => planned.turn === turn);
  const delegate = spawn ? `\n\nSPAWN_SUBAGENT ${turn}` : "";
  return `${head}\n\nNotes for this step: ${sentences.join(" ")}${delegate}${cutEmoji(turn)}`;
}

/**
 * With `SOAK_CUT_EMOJI` set, work turns 5, 15, 25, … end in a string cut in the middle of an
 * emoji, as `text.slice(0, n)` leaves it: a lone UTF-16 surrogate, which `JSON.stringify`
 * writes as `\ud83d` (valid JSON text, passed on by OpenClaw as it is).
 */
function cutEmoji(turn) {
  return process.env.SOAK_CUT_EMOJI && turn % 10 === 5 ? `\n\nThe deploy log said: finished 🚀`.slice(0, -1) : "";
}

/** The question turn about `fact`. */
export function questionMessage(fact) {
  return `QUESTION ${fact.id}: ${fact.question} Answer with the exact value.`;
}

/** The whole script of `turns` turns: work turns, then one question per fact at the end. */
export function script(turns) {
  if (turns < FACTS.length + Math.max(...FACTS.map((fact) => fact.turn))) {
    throw new Error(`a soak needs at least ${FACTS.length + Math.max(...FACTS.map((fact) => fact.turn))} turns`);
  }
  const work = turns - FACTS.length;
  return [
    ...Array.from({ length: work }, (_, index) => ({ kind: "work", turn: index + 1, text: workMessage(index + 1) })),
    ...FACTS.map((fact, index) => ({ kind: "question", turn: work + index + 1, fact: fact.id, text: questionMessage(fact) })),
  ];
}
