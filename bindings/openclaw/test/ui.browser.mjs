// `vilvona ui` in a real browser (Debian's Chromium, driven by playwright-core): a replayed
// session whose history holds a planted fact and a `<script>`, the page opened at 1280 px and
// 360 px. It checks the bar's numbers against `vilvona context json`, finds the fact by
// search, expands a summary down to its source messages, shows the script as text (it never
// runs), and the plugin's panel action (the Control UI's backend) answers the same view.
// Screenshots and timings go to target/ui/.
//
//   VILVONA_BIN=target/debug/vilvona PLAYWRIGHT_CORE=<dir with node_modules/playwright-core> \
//     node --test bindings/openclaw/test/ui.browser.mjs      (scripts/ui-browser.sh does this)
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFile, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createServer } from "node:http";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { UiServer, registerPanelAction, fitForOpenClaw, withinOpenClaw } from "../index.js";
import { unwrap } from "../dist/control-ui/index.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..", "..");
const binary = process.env.VILVONA_BIN;
const out = join(root, "target", "ui");
const chromium = process.env.CHROMIUM ?? "/usr/bin/chromium";
const SESSION = "synthetic-11-15";
const SCRIPT = "<script>window.__vvRan = 1</script><img src=x onerror=\"window.__vvRan = 2\">";

assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (scripts/ui-browser.sh does)");
assert.ok(process.env.PLAYWRIGHT_CORE, "set PLAYWRIGHT_CORE to the directory playwright-core is installed in (scripts/ui-browser.sh does)");
const { chromium: browserType } = createRequire(join(process.env.PLAYWRIGHT_CORE, "package.json"))("playwright-core");

const vilvona = (state, ...args) => execFileSync(binary, ["--state-dir", state, ...args], { encoding: "utf8" });

/** The fixture session's transcript, with a script planted in its first message. */
function transcriptLines() {
  const lines = readFileSync(join(root, "fixtures", "gen-session-15.jsonl"), "utf8").trimEnd().split("\n");
  const first = JSON.parse(lines[1]);
  first.message.content = `${first.message.content} Keep this markup verbatim: ${SCRIPT}`;
  lines[1] = JSON.stringify(first);
  // What a provider with a prompt cache reports (the fixture's usage is all zeros): the
  // panel's second chart draws it, and its cached share.
  let call = 0;
  return lines.map((line) => {
    const entry = JSON.parse(line);
    if (entry.message?.role !== "assistant" || !entry.message.usage) return line;
    call += 1;
    entry.message.usage = { input: 200 + 10 * call, output: 40, cacheRead: 1500 + 50 * call, cacheWrite: call % 3 === 0 ? 120 : 0 };
    return JSON.stringify(entry);
  });
}

/** Replays the transcript's first `count` lines (all by default) into `state`; again, the rest. */
function replayInto(state, count) {
  const file = join(state, "session.jsonl");
  writeFileSync(file, `${transcriptLines().slice(0, count).join("\n")}\n`);
  vilvona(state, "replay", file, "--engine", "lossless", "--context-window", "6000");
}

/** A state directory holding the fixture session (all of it, or its first `count` lines). */
function replayedState(count) {
  const state = mkdtempSync(join(tmpdir(), "vilvona-ui-"));
  replayInto(state, count);
  return state;
}

const children = [];
after(() => children.forEach((child) => child.kill()));

/** `vilvona ui` started on a free port: its URL (with the token). */
async function startUi(state, ...options) {
  const child = spawn(binary, ["--state-dir", state, "ui", "--port", "0", ...options], { stdio: ["ignore", "pipe", "inherit"] });
  children.push(child);
  const [line] = await Promise.race([
    new Promise((resolve) => createInterface({ input: child.stdout }).once("line", (l) => resolve([l]))),
    new Promise((_, reject) => child.once("exit", (code) => reject(new Error(`vilvona ui exited with ${code}`)))),
  ]);
  assert.match(line, /^vilvona ui: http:\/\/127\.0\.0\.1:\d+\/#token=[0-9a-f]{32}$/);
  return line.replace("vilvona ui: ", "");
}

const grouped = (n) => Number(n).toLocaleString("en-US");

test("vilvona ui: the window, search, the DAG to its sources, and stored markup as text", async () => {
  mkdirSync(out, { recursive: true });
  const state = replayedState();
  const expected = JSON.parse(vilvona(state, "context", "json", "--session", SESSION)).report;
  // A replay tells the engine a budget, not a window: the bar is the report's, the limits the engine's.
  const { plan } = JSON.parse(vilvona(state, "stats", "--session", SESSION, "--json"));
  assert.equal(plan.window, null);
  const dag = JSON.parse(vilvona(state, "context", "dag", "--format", "json", "--session", SESSION));
  assert.ok(dag.summaries.some((s) => s.inContext), "the replay made no summaries to show");
  const folds = JSON.parse(vilvona(state, "context", "timeline", "--json", "--session", SESSION));
  const turns = JSON.parse(vilvona(state, "context", "history", "--json", "--session", SESSION));
  assert.ok(turns.some((turn) => turn.folds?.length) && turns.every((turn) => turn.usage), "the replay recorded no fold, or a turn without usage");
  const url = `${await startUi(state)}&session=${SESSION}`;

  // A request without the token reads nothing.
  const refused = await fetch(new URL("/api/view", url), { method: "POST", body: JSON.stringify({ view: "sessions" }) });
  assert.equal(refused.status, 401);

  const browser = await browserType.launch({
    executablePath: chromium,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"],
  });
  const timings = {};
  try {
    for (const width of [1280, 360]) {
      const page = await browser.newPage({ viewport: { width, height: 900 } });
      const errors = [];
      page.on("pageerror", (error) => errors.push(String(error)));
      page.on("console", (message) => message.type() === "error" && errors.push(`console: ${message.text()}`));
      page.on("response", (response) => response.status() >= 400 && errors.push(`HTTP ${response.status()}: ${response.url()}`));
      page.on("request", (request) => !request.url().startsWith(new URL(url).origin) && !request.url().startsWith("data:") && errors.push(`an outside request: ${request.url()}`));
      const opened = Date.now();
      await page.goto(url);
      await page.waitForSelector("[data-total]");
      const paint = Date.now() - opened;

      // The charts' points are `context history --json`'s, turn by turn.
      await page.waitForSelector("[data-chart=prompt] g[data-turn]");
      const drawn = await page.$$eval("[data-chart=prompt] g[data-turn]", (groups) => groups.map((g) => ({
        turn: Number(g.dataset.turn), host: Number(g.dataset.host), summaries: Number(g.dataset.summaries), messages: Number(g.dataset.messages) })));
      const sum = (context, summary) => Object.entries(context).filter(([kind]) => kind.startsWith("summary") === summary).reduce((total, [, tokens]) => total + tokens, 0);
      assert.deepEqual(drawn, turns.map((turn) => ({ turn: turn.turn, host: turn.hostPrompt ?? 0, summaries: sum(turn.context, true), messages: sum(turn.context, false) })));
      const marked = await page.$$eval("[data-chart=prompt] [data-fold-turn]", (marks) => marks.map((m) => [Number(m.dataset.foldTurn), m.dataset.folds]));
      assert.deepEqual(marked, turns.filter((turn) => turn.folds?.length).map((turn) => [turn.turn, turn.folds.join(" ")]));
      const charged = await page.$$eval("[data-chart=provider] g[data-turn]", (groups) => groups.map((g) => ({
        turn: Number(g.dataset.turn), input: Number(g.dataset.input), cacheRead: Number(g.dataset.cacheRead), cacheWrite: Number(g.dataset.cacheWrite), output: Number(g.dataset.output), share: Number(g.dataset.cachedShare) })));
      assert.deepEqual(charged, turns.map(({ turn, usage }) => ({ turn, input: usage.input, cacheRead: usage.cacheRead, cacheWrite: usage.cacheWrite, output: usage.output,
        share: Math.round((1000 * usage.cacheRead) / (usage.input + usage.cacheRead + usage.cacheWrite)) / 10 })));
      assert.ok(charged.every((point) => point.share > 50), JSON.stringify(charged.slice(0, 3)));
      // The plugin's version and the store's size.
      assert.match(await page.textContent("[data-part=about]"), /^vilvona \d+\.\d+\.\d+; the store: \d+\.\d MiB/);

      // The bar's numbers are the report's.
      assert.equal(await page.getAttribute("[data-total]", "data-total"), String(expected.sessionTokens));
      assert.equal(await page.getAttribute("[data-window]", "data-window"), String(expected.window));
      assert.equal(await page.textContent("[data-total]"), grouped(expected.sessionTokens));
      const limits = await page.textContent("[data-part=limits]");
      for (const limit of [plan.trigger, plan.goal, plan.ceiling]) assert.ok(limits.includes(grouped(limit)), limits);
      const depths = expected.conversation.filter((part) => part.name.startsWith("Summaries"));
      for (const part of depths) {
        assert.ok((await page.textContent(".vv-legend")).includes(`${part.name} ×${part.count}: ${grouped(part.tokens)} tok`), part.name);
      }

      // The compaction steps, newest first: one a summary, each folding more than it wrote;
      // the rows' figures are `context timeline --json`'s, which reads the DAG.
      assert.equal(folds.folds, dag.summaries.length);
      for (const fold of folds.rows) assert.ok(fold.before > fold.after && fold.after > 0, JSON.stringify(fold));
      assert.equal(await page.getAttribute("[data-compactions]", "data-compactions"), String(folds.folds));
      const rows = page.locator("[data-part=timeline] li");
      assert.equal(await rows.count(), Math.min(folds.folds, 40));
      const newest = dag.summaries.reduce((a, b) => (b.createdAtMs > a.createdAtMs || (b.createdAtMs === a.createdAtMs && b.depth > a.depth) ? b : a));
      assert.equal(await rows.first().getAttribute("data-id"), newest.summaryId);
      assert.equal(await rows.first().getAttribute("data-after"), String(newest.tokens));
      assert.ok((await rows.first().textContent()).includes(newest.summarizer));
      // Each summary in the context shows the time span of the messages below it.
      const top = dag.summaries.find((summary) => summary.inContext);
      const span = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 16);
      assert.ok((await page.locator(`[data-part=dag] li[data-id="${top.summaryId}"] .vv-row`).first().textContent())
        .includes(`${span(top.earliestAtMs)} → ${span(top.latestAtMs)}`), top.summaryId);
      // The cache-hit estimate: each row's prefix, and their mean; a fold over messages keeps
      // the cache for every summary ahead of it, so some fold keeps some.
      assert.equal(await rows.first().getAttribute("data-cache-kept"), String(folds.rows[0].cacheKept));
      assert.ok(folds.rows.some((fold) => fold.cacheKept > 0), JSON.stringify(folds.rows.slice(0, 5)));
      assert.equal(await page.getAttribute("p[data-cache-kept]", "data-cache-kept"), String(folds.meanCacheKept));
      assert.ok((await page.textContent("p[data-cache-kept]")).includes(grouped(folds.meanCacheKept)));

      // Search finds the planted fact (its text shown), and leads to its place in the DAG.
      const typed = Date.now();
      await page.fill("[data-part=search]", "staging database password rotation");
      await page.press("[data-part=search]", "Enter");
      const hit = page.locator("[data-part=hits] li", { hasText: "OPS-48292" }).first();
      await hit.waitFor();
      const found = Date.now() - typed;
      const reveal = hit.getByRole("button", { name: "Show in the DAG" });
      if (await reveal.count()) {
        await reveal.click();
        await page.waitForSelector("[data-part=dag] [aria-expanded=true]");
      }

      // A summary expanded down to its source messages (the lowest one in the context).
      const lowest = dag.summaries.filter((s) => s.inContext).sort((a, b) => a.depth - b.depth)[0];
      let rowId = lowest.summaryId;
      for (let depth = lowest.depth; ; depth -= 1) {
        const row = page.locator(`[data-part=dag] li[data-id="${rowId}"]`).first();
        const button = row.locator(`:scope > .vv-row > button[data-expand="${rowId}"]`);
        if ((await button.getAttribute("aria-expanded")) !== "true") await button.click();
        await row.locator(":scope > .vv-children > li").first().waitFor();
        if (depth === 0) {
          await row.locator(":scope > .vv-children > li.vv-message .vv-text").first().waitFor();
          break;
        }
        rowId = await row.locator(":scope > .vv-children > li.vv-summary").first().getAttribute("data-id");
      }

      // Stored markup is text: searching for it shows it, and it never ran.
      await page.fill("[data-part=search]", "markup verbatim");
      await page.press("[data-part=search]", "Enter");
      await page.locator("[data-part=hits] li", { hasText: "<script>" }).first().waitFor();
      assert.equal(await page.evaluate(() => window.__vvRan), undefined);
      assert.equal(await page.locator("#panel script, #panel img").count(), 0);

      // Previews render Markdown, sanitized by construction: markup in a stored text stays
      // text, and a link goes only to http(s).
      const rendered = await page.evaluate(async (script) => {
        const { markdown } = await import("/index.js");
        const node = markdown(`## Decisions\n- keep **the API** and \`cargo test\`\n- see [the run](https://example.test/run) or [no](javascript:alert(1))\n\n${script}\n\n\`\`\`\nfn main() {}\n\`\`\``);
        return { html: node.innerHTML, text: node.textContent, tags: [...node.querySelectorAll("*")].map((n) => n.tagName.toLowerCase()), links: [...node.querySelectorAll("a")].map((a) => a.href) };
      }, SCRIPT);
      assert.deepEqual(rendered.tags, ["h5", "ul", "li", "strong", "code", "li", "a", "p", "pre", "code"]);
      assert.deepEqual(rendered.links, ["https://example.test/run"]);
      assert.ok(rendered.text.includes(SCRIPT), rendered.html);
      assert.ok(rendered.text.includes("[no](javascript:alert(1))"), rendered.html);

      // Read-only by default: no repair is offered.
      await page.waitForSelector("[data-part=health] [data-ok]");
      assert.equal(await page.locator("[data-part=repair]").count(), 0);

      await page.screenshot({ path: join(out, `vilvona-ui-${width}.png`), fullPage: true });
      await page.evaluate(() => window.scrollTo(0, 0));
      await page.screenshot({ path: join(out, `vilvona-ui-${width}-top.png`) });
      await page.locator("[data-part=history]").screenshot({ path: join(out, `vilvona-ui-${width}-history.png`) });
      assert.deepEqual(errors, []);
      // Also as the page timed them: from asking the views to drawing them.
      timings[width] = {
        firstPaintMs: paint,
        searchMs: found,
        paintInPageMs: Number(await page.getAttribute(".vv-panel", "data-painted")),
        searchInPageMs: Number(await page.getAttribute(".vv-panel", "data-search-ms")),
      };
      await page.close();
    }
  } finally {
    await browser.close();
  }
  writeFileSync(join(out, "timings.json"), `${JSON.stringify(timings, null, 2)}\n`);
  console.log(`vilvona ui in Chromium: ${JSON.stringify(timings)}`);
});

test("vilvona ui follows a session as it grows, without a reload", async () => {
  // The page is open on the first 50 lines; the rest is replayed by another process.
  const state = replayedState(50);
  const url = `${await startUi(state)}&session=${SESSION}`;
  const browser = await browserType.launch({ executablePath: chromium, args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    // The store check reads every row: asked when the panel opens and on "Check again",
    // never on the refreshes the session's growth sets off.
    const asked = [];
    page.on("request", (request) => request.url().endsWith("/api/view") && asked.push(JSON.parse(request.postData() ?? "{}").view));
    await page.goto(url);
    await page.waitForSelector("[data-part=health] [data-ok]");
    const before = await page.getAttribute("[data-total]", "data-total");
    // An expanded summary stays expanded across the redraw.
    const expand = page.locator("[data-part=dag] button[data-expand]").first();
    const expanded = await expand.getAttribute("data-expand");
    await expand.click();
    await page.waitForSelector(`[data-part=dag] button[data-expand="${expanded}"][aria-expanded=true]`);
    replayInto(state);
    const expected = JSON.parse(vilvona(state, "context", "json", "--session", SESSION)).report.sessionTokens;
    assert.notEqual(String(expected), before);
    await page.waitForSelector(`[data-total="${expected}"]`, { timeout: 20_000 });
    if (await page.locator(`[data-part=dag] button[data-expand="${expanded}"]`).count()) {
      await page.waitForSelector(`[data-part=dag] button[data-expand="${expanded}"][aria-expanded=true]`);
    }
    const refreshes = asked.filter((view) => view === "context").length;
    assert.ok(refreshes >= 2, `${refreshes} refreshes`);
    assert.equal(asked.filter((view) => view === "health").length, 1, asked.join(" "));
    await page.click("[data-part=recheck]");
    // Redrawn from the second check: its button is a new, enabled one.
    await page.waitForSelector("[data-part=recheck]:not([disabled])");
    assert.equal(asked.filter((view) => view === "health").length, 2, asked.join(" "));
  } finally {
    await browser.close();
  }
});

test("vilvona ui --allow-repair: a rebuild of the index after a preview and a confirmation", async () => {
  const state = replayedState();
  const url = `${await startUi(state, "--allow-repair")}&session=${SESSION}`;
  const browser = await browserType.launch({ executablePath: chromium, args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(url);
    await page.click("[data-repair=rebuild-index] [data-part=repair]");
    const preview = await page.locator("[data-part=repair-preview]").textContent();
    assert.match(preview, /rebuild the recall index from the database/);
    assert.match(preview, /not needed/);
    await page.click("[data-part=confirm-repair]");
    const result = await page.locator("[data-part=repair-result]").textContent();
    assert.match(result, /Rebuilt the recall index: [\d,]+ documents\./);
    // Still whole: the planted fact is found through the new index.
    await page.fill("[data-part=search]", "staging database password rotation");
    await page.press("[data-part=search]", "Enter");
    await page.locator("[data-part=hits] li", { hasText: "OPS-48292" }).first().waitFor();
  } finally {
    await browser.close();
  }
});

/** An OpenAI-compatible model on 127.0.0.1 whose summaries are useless (longer than what they
 * summarize, so the engine truncates) until `useful` is set. */
async function summarizerModel() {
  const model = { useful: false, requests: 0 };
  const server = createServer((request, response) => {
    request.resume();
    request.on("end", () => {
      model.requests += 1;
      const content = model.useful ? "Ops notes: the staging database password rotation is ticket OPS-48292." : "unusable ".repeat(20_000);
      response.writeHead(200, { "content-type": "application/json" });
      response.end(JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] }));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  after(() => server.close());
  model.baseUrl = `http://127.0.0.1:${server.address().port}/v1`;
  return model;
}

test("vilvona ui --allow-repair: truncated summaries re-summarized with the configured summarizer, after a preview", async () => {
  const model = await summarizerModel();
  const state = mkdtempSync(join(tmpdir(), "vilvona-ui-"));
  const summarizer = { kind: "openai", baseUrl: model.baseUrl, model: "mock-summarizer", retries: 0, timeoutMs: 10_000 };
  writeFileSync(join(state, "vilvona.json5"), JSON.stringify({ plugins: { entries: { lossless: { config: { summarizer } } } } }));
  // Not execFileSync: the model answers from this process, which must keep running meanwhile.
  const file = join(state, "session.jsonl");
  writeFileSync(file, `${transcriptLines().join("\n")}\n`);
  await promisify(execFile)(binary, ["--state-dir", state, "replay", file, "--engine", "lossless", "--context-window", "6000"]);
  const truncated = () => JSON.parse(vilvona(state, "context", "dag", "--format", "json", "--session", SESSION))
    .summaries.filter((summary) => summary.inContext && summary.level === "fallback");
  const rewritten = truncated().map((summary) => summary.summaryId);
  const flagged = rewritten.length;
  assert.ok(flagged > 0 && model.requests > 0, `the replay truncated nothing (${model.requests} summarizer requests)`);

  model.useful = true;
  const url = `${await startUi(state, "--allow-repair")}&session=${SESSION}`;
  const browser = await browserType.launch({ executablePath: chromium, args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(url);
    // "Needs attention" lists each, marked truncated, with the rewrite beside them.
    const listed = page.locator("[data-part=attention] li[data-id]");
    await listed.first().waitFor();
    assert.deepEqual(await listed.evaluateAll((items) => items.map((item) => item.dataset.id)), rewritten);
    for (const badge of await page.locator("[data-part=attention] li .vv-badge").allTextContents()) assert.equal(badge, "truncated");
    const offer = page.locator("[data-part=attention] [data-repair=resummarize] [data-part=repair]");
    assert.equal(await offer.textContent(), `Rewrite ${flagged} ${flagged === 1 ? "summary" : "summaries"} with the configured summarizer…`);
    const asked = model.requests;
    await offer.click();
    const preview = await page.locator("[data-repair=resummarize] [data-part=repair-preview]").textContent();
    assert.match(preview, new RegExp(`rewrite the ${flagged} summaries a stand-in wrote in this session's context \\(truncated, or by a fallback summarizer\\) with \\S*mock-summarizer`));
    assert.match(preview, /It is needed\./);
    // The preview changed nothing and asked the model nothing.
    assert.equal(truncated().length, flagged);
    assert.equal(model.requests, asked);
    await page.click("[data-repair=resummarize] [data-part=confirm-repair]");
    const result = await page.locator("[data-part=repair-result]").textContent();
    assert.match(result, new RegExp(`^Re-summarized ${flagged} of ${flagged} with `));
    assert.equal(truncated().length, 0);
    // Nothing is left to offer, and the rewritten summaries' rows in the timeline carry no
    // truncation flag any more (summaries already folded deeper keep theirs: the repair
    // rewrites what the context shows).
    await page.locator("[data-repair=resummarize]").waitFor({ state: "detached" });
    assert.equal(await page.getAttribute("[data-part=attention] [data-flagged]", "data-flagged"), "0");
    let shown = 0;
    for (const id of rewritten) {
      const row = page.locator(`[data-part=timeline] li[data-id="${id}"]`);
      if (!(await row.count())) continue;
      shown += 1;
      assert.equal(await row.locator(".vv-badge", { hasText: "truncated" }).count(), 0, id);
    }
    assert.ok(shown > 0, "no rewritten summary among the timeline's rows");
  } finally {
    await browser.close();
  }
});

test("the Control UI panel's action answers the session's own views, read-only", async () => {
  const state = replayedState();
  const registered = [];
  const api = { session: { controls: { registerSessionAction: (action) => registered.push(action) } } };
  const ui = new UiServer({ binary, stateDir: state });
  assert.equal(registerPanelAction(api, ui), true);
  const [action] = registered;
  assert.equal(action.id, "view");
  assert.deepEqual(action.requiredScopes, ["operator.read"]);
  const context = await action.handler({ sessionKey: SESSION, payload: { view: "context" } });
  assert.equal(context.ok, true, JSON.stringify(context));
  const cli = JSON.parse(vilvona(state, "context", "json", "--session", SESSION));
  assert.deepEqual(context.result, cli);
  // The panel asks for its own session only: the list of sessions is not offered.
  const listed = await action.handler({ sessionKey: SESSION, payload: { view: "sessions" } });
  assert.equal(listed.ok, false);
  // A search, as the panel sends it.
  const found = await action.handler({ sessionKey: SESSION, payload: { view: "grep", query: "OPS-48292" } });
  assert.ok(JSON.stringify(found.result).includes("OPS-48292"), JSON.stringify(found));
  // The repair is a second action, for operator.write only; its preview changes nothing.
  const repair = registered.find((registration) => registration.id === "repair");
  assert.deepEqual(repair.requiredScopes, ["operator.write"]);
  const preview = await repair.handler({ sessionKey: SESSION, payload: { repair: "rebuild-index" } });
  assert.equal(preview.ok, true, JSON.stringify(preview));
  assert.equal(preview.result.needed, false);
  // The server never outlives the process that started it: its stdin closing ends it.
  const { child } = await ui.start();
  const exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
  child.stdin.end();
  assert.equal(await exited, 0);
});

test("a view beyond OpenClaw's limits on an action's result travels in pieces the panel joins", () => {
  // A long session's DAG: more JSON values than OpenClaw's 4,096 (a 150-turn gateway session
  // at a 16k window had its DAG refused: "plugin session action result must be JSON-compatible").
  const dag = { summaries: Array.from({ length: 1_500 }, (_, i) => ({ summaryId: `sum_${i}`, depth: i % 3, childSummaries: [i, i + 1], level: "normal" })) };
  assert.equal(withinOpenClaw({ ok: true, result: dag }), false);
  const carried = fitForOpenClaw(dag);
  assert.equal(withinOpenClaw({ ok: true, result: carried }), true);
  assert.deepEqual(unwrap({ ok: true, result: carried }), dag);
  // An expanded tool output: one string longer than OpenClaw's 65,536 characters, quotes in it.
  const expanded = { items: [{ id: "msg_1", text: `"quoted" \\ ${"row ok\n".repeat(12_000)}` }] };
  assert.equal(withinOpenClaw({ ok: true, result: expanded }), false);
  assert.deepEqual(unwrap({ ok: true, result: fitForOpenClaw(expanded) }), expanded);
  // What fits goes as it is; what cannot fit is refused with its size.
  const small = { report: { sessionTokens: 1 } };
  assert.equal(fitForOpenClaw(small), small);
  assert.throws(() => fitForOpenClaw({ text: "x".repeat(400_000) }), /this view is \d+ KiB of JSON; OpenClaw carries at most 256 KiB/);
});
