// Checks the gateway soak's folds against what the summarizer model did (the host summarizer's
// cells): node soak-stand-ins.mjs GATEWAY_OUT DAG_JSON MOCK_JSONL MODE
//   none       the model answered all along: no summary a stand-in wrote was ever published
//   rewritten  the model was down for a stretch (MOCK_SUMMARIZER_REFUSE): the folds of that
//              stretch were published by a stand-in, and by the end of the run (20 turns after
//              the stretch) the model rewrote each (`maintain`, a few a call, or a compaction
//              before it condensed them): none is left anywhere in the DAG, in the context or
//              under a parent, but those whose rewrite could not fit (the engine says which)
// Prints the counts either way; exits 1 when the mode's rule is broken.
import { readFileSync } from "node:fs";

const [gatewayOut, dagJson, mockJsonl, mode] = process.argv.slice(2);
const log = readFileSync(gatewayOut, "utf8").split("\n");
const published = log.filter((line) => line.includes("published a summary a stand-in wrote")).length;
// What each `maintain` rewrote, as OpenClaw logs its result.
const rewritten = log
  .map((line) => Number(line.match(/rewrittenEntries=(\d+)/)?.[1] ?? 0))
  .reduce((sum, count) => sum + count, 0);
// Rewritten by a compaction before it condensed them.
const beforeCondensing = log
  .map((line) => (line.includes("before condensing them") ? Number(line.match(/rewritten=(\d+)/)?.[1] ?? 0) : 0))
  .reduce((sum, count) => sum + count, 0);
// Whose rewrite could not fit: left as the stand-in wrote them, and said so.
const unfit = new Set(log.flatMap((line) => (line.includes("does not fit") ? [line.match(/summary=(sum_\w+)/)?.[1]] : [])).filter(Boolean));
const dag = JSON.parse(readFileSync(dagJson, "utf8"));
const standIn = (summary) => summary.level === "fallback" || summary.summarizer.includes(" in place of ");
const left = dag.summaries.filter((summary) => summary.inContext && standIn(summary) && !unfit.has(summary.summaryId));
// A stand-in folded further as it was: condensed without being rewritten.
const condensed = dag.summaries.filter((summary) => !summary.inContext && standIn(summary) && !unfit.has(summary.summaryId));
const refused = readFileSync(mockJsonl, "utf8")
  .split("\n")
  .filter(Boolean)
  .map(JSON.parse)
  .filter((request) => request.__mock?.refused).length;
console.log(
  `stand-ins: ${published} folds published by a stand-in, ${rewritten} rewritten by the model in maintenance and ` +
    `${beforeCondensing} before condensing them, ${unfit.size} whose rewrite did not fit, ${condensed.length} condensed as a ` +
    `stand-in wrote them, ${left.length} left in the context; the model refused ${refused} summary requests`,
);
const problems = [];
if (mode === "none" && published > 0) problems.push(`${published} folds were published by a stand-in while the model answered`);
if (mode === "rewritten") {
  if (refused === 0) problems.push("the model never refused (the cell tests nothing)");
  if (published === 0) problems.push("no fold was published by a stand-in while the model was down");
  if (left.length > 0) {
    problems.push(`${left.length} summaries a stand-in wrote are still in the context: ${left.map((s) => `${s.summaryId} (${s.summarizer})`).join(", ")}`);
  }
  if (condensed.length > 0) {
    problems.push(`${condensed.length} summaries a stand-in wrote were condensed as they were: ${condensed.map((s) => `${s.summaryId} (${s.summarizer})`).join(", ")}`);
  }
}
if (problems.length) {
  console.error(problems.join("; "));
  process.exit(1);
}
