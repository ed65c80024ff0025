// The vilvona panel inside a real OpenClaw gateway's Control UI, in Debian's Chromium: the
// session the soak drove is opened, its header shows vilvona's window meter, the side panel
// shows "vilvona context", and the meter's and the panel's
// numbers, search and expansion are checked against the vilvona binary's own answers over the
// same store. Run by `scripts/soak-gateway.sh --panel` while its gateway is up.
//   node ui.gateway.mjs GATEWAY_URL TOKEN VILVONA STATE_DIR OUT_DIR
// (PLAYWRIGHT_CORE: where playwright-core is installed; CHROMIUM: the browser, /usr/bin/chromium)
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const [gateway, token, binary, stateDir, out] = process.argv.slice(2);
const { chromium } = createRequire(join(process.env.PLAYWRIGHT_CORE, "package.json"))("playwright-core");
const parse = (message) => {
  try {
    return typeof message === "string" ? JSON.parse(message) : undefined;
  } catch {
    return undefined;
  }
};
/** A response's headers for a body served again decoded: without its encoding and length. */
const plain = (headers) => Object.fromEntries(Object.entries(headers).filter(([name]) => !["content-encoding", "content-length"].includes(name.toLowerCase())));
const vilvona = (...args) => JSON.parse(execFileSync(binary, ["--state-dir", stateDir, ...args], { encoding: "utf8" }));
mkdirSync(out, { recursive: true });

// The session the soak drove, and what vilvona says of it.
const [session] = vilvona("sessions", "--json").filter((row) => row.messages > 0);
assert.ok(session, "the store holds no session with messages");
// OpenClaw told the engine its window: the bar is the host's prompt as last counted and the
// engine's context, against that window (`vilvona stats --json`).
const stats = vilvona("stats", "--session", session.key, "--json");
assert.ok(stats.plan?.window > 0, `the engine knows no window: ${JSON.stringify(stats.plan)}`);
const expected = { total: (stats.plan.hostPrompt ?? 0) + stats.contextTokens, window: stats.plan.window };
// OpenClaw's session link: each segment of the key after `agent:<agent>:` is a path segment.
const [, agent, ...rest] = session.key.split(":");
const path = `/chat/${agent}/${rest.map(encodeURIComponent).join("/")}`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-sync"],
});
const timings = {};
let page;
try {
  for (const width of [1280, 360]) {
    const context = await browser.newContext({ viewport: { width, height: 900 } });
    page = await context.newPage();
    // The console on load, and every failed request: none of the panel's (its module, its
    // styles, its views). OpenClaw 2026.9.6's own page asks for a user avatar and a workspace
    // icon it answers 404 (printed, not ours to fix).
    const errors = [];
    page.on("console", (message) => message.type() === "error" && errors.push(`console: ${message.text()} (${message.location().url})`));
    page.on("pageerror", (error) => errors.push(`${error}: ${error.stack ?? ""}`));
    page.on("response", (response) => response.status() >= 400 && errors.push(`HTTP ${response.status()}: ${response.url()}`));
    const loaded = Date.now();
    await page.goto(`${gateway}${path}#token=${token}`);
    // The window meter on the session's header.
    const meter = page.locator("[data-part=meter][data-percent]");
    await meter.waitFor({ timeout: 60_000 });
    const appMs = Date.now() - loaded;
    assert.equal(await meter.getAttribute("data-percent"), String(Math.round((1000 * expected.total) / expected.window) / 10));
    // The side panel, then vilvona's entry in it.
    await page.getByRole("button", { name: "Side panel" }).first().click({ timeout: 60_000 });
    const opened = Date.now();
    await page.locator("button[role=listitem]", { hasText: "vilvona context" }).first().click({ timeout: 30_000 });
    const view = page.locator("openclaw-plugin-view");
    const total = view.locator("[data-total]");
    await total.waitFor({ timeout: 30_000 });
    timings[width] = { appWithMeterMs: appMs, firstPaintMs: Date.now() - opened };
    assert.equal(await total.getAttribute("data-total"), String(expected.total));
    assert.equal(await view.locator("[data-window]").getAttribute("data-window"), String(expected.window));
    assert.ok((await view.locator("[data-part=limits]").textContent()).includes(stats.plan.ceiling.toLocaleString("en-US")));
    // The compaction steps: one a summary of the store's DAG.
    const dag = vilvona("context", "dag", "--format", "json", "--session", session.key);
    assert.equal(await view.locator("[data-compactions]").getAttribute("data-compactions"), String(dag.summaries.length));
    // The charts, turn by turn: their points are `vilvona context history --json`'s (the
    // newest 300, as the panel asks), every fold marked, the cached share where reported.
    const turns = vilvona("context", "history", "--json", "--session", session.key).slice(-300);
    assert.ok(turns.length > 0, "the gateway's session recorded no turn");
    await view.locator("[data-chart=prompt] g[data-turn]").first().waitFor({ timeout: 30_000 });
    const drawn = await view.locator("[data-chart=prompt] g[data-turn]").evaluateAll((groups) => groups.map((g) => ({
      turn: Number(g.dataset.turn), host: Number(g.dataset.host), summaries: Number(g.dataset.summaries), messages: Number(g.dataset.messages) })));
    const sum = (context, summary) => Object.entries(context).filter(([kind]) => kind.startsWith("summary") === summary).reduce((all, [, tokens]) => all + tokens, 0);
    assert.deepEqual(drawn, turns.map((turn) => ({ turn: turn.turn, host: turn.hostPrompt ?? 0, summaries: sum(turn.context, true), messages: sum(turn.context, false) })));
    const marked = await view.locator("[data-chart=prompt] [data-fold-turn]").evaluateAll((marks) => marks.map((m) => [Number(m.dataset.foldTurn), m.dataset.folds]));
    const folded = turns.filter((turn) => turn.folds?.length).map((turn) => [turn.turn, turn.folds.join(" ")]);
    assert.ok(folded.length > 0, "no turn of the gateway's session folded");
    assert.deepEqual(marked, folded);
    // What recall at assembly brought into the prompts: as many turns as the records say.
    const recalledTurns = turns.filter((turn) => turn.recalled?.length).length;
    assert.equal(await view.locator("[data-recalled-turns]").getAttribute("data-recalled-turns"), String(recalledTurns));
    const charged = await view.locator("[data-chart=provider] g[data-turn]").evaluateAll((groups) => groups.map((g) => ({
      turn: Number(g.dataset.turn), cacheRead: Number(g.dataset.cacheRead), input: Number(g.dataset.input), share: g.dataset.cachedShare, cost: g.dataset.cost })));
    const share = ({ input, cacheRead, cacheWrite }) => (input + cacheRead + cacheWrite > 0 ? String(Math.round((1000 * cacheRead) / (input + cacheRead + cacheWrite)) / 10) : "");
    assert.deepEqual(charged, turns.filter((turn) => turn.usage).map(({ turn, usage }) => ({ turn, cacheRead: usage.cacheRead, input: usage.input, share: share(usage), cost: String(usage.cost ?? "") })));
    // The soak's provider reports its cache and its model has prices (soak-gateway.sh --panel).
    assert.ok(charged.filter((point) => Number(point.share) > 50).length > charged.length / 2, `most turns read little from the provider's cache: ${JSON.stringify(charged.slice(-3))}`);
    assert.ok(charged.every((point) => Number(point.cost) > 0), `a turn the host did not price: ${JSON.stringify(charged.find((point) => !(Number(point.cost) > 0)))}`);
    timings[width].turnsCharted = drawn.length;
    timings[width].foldsMarked = marked.length;
    await page.screenshot({ path: join(out, `openclaw-panel-${width}-window.png`) });
    await view.locator("[data-part=history]").screenshot({ path: join(out, `openclaw-panel-${width}-history.png`) });

    // A planted fact, found by search, its text shown.
    const typed = Date.now();
    await view.locator("[data-part=search]").fill("canary region");
    await view.locator("[data-part=search]").press("Enter");
    await view.locator("[data-part=hits] li", { hasText: "eu-north-3" }).first().waitFor({ timeout: 30_000 });
    timings[width].searchMs = Date.now() - typed;
    // The same two, as the page timed them: from asking the views to drawing them (without
    // mounting the panel and the test's polling for the result).
    const panel = view.locator(".vv-panel");
    timings[width].paintInPageMs = Number(await panel.getAttribute("data-painted"));
    timings[width].searchInPageMs = Number(await panel.getAttribute("data-search-ms"));

    // A summary in the context expanded one level.
    const expand = view.locator("[data-part=dag] button[data-expand]").first();
    await expand.click();
    await view.locator("[data-part=dag] .vv-children > li").first().waitFor({ timeout: 30_000 });

    // The token's connection may write: the repair is offered, and its preview answers
    // through the gateway's operator.write action (the rebuild itself is not run here).
    await view.locator("[data-repair=rebuild-index] [data-part=repair]").click({ timeout: 30_000 });
    assert.match(await view.locator("[data-part=repair-preview]").textContent({ timeout: 30_000 }), /rebuild the recall index/);

    await page.screenshot({ path: join(out, `openclaw-panel-${width}-search.png`) });
    const ours = errors.filter((error) => /vilvona|vv-/i.test(error));
    assert.deepEqual(ours, [], `the panel at ${width} px`);
    timings[width].hostErrors = errors.filter((error) => !ours.includes(error)).map((error) => error.slice(0, 160));
    await context.close();
  }

  // An operator.read connection: the panel reads, offers no repair, and the gateway refuses
  // one. OpenClaw 2026.9.6's Control UI asks for every operator scope and token auth grants
  // what it asks (a read-only operator is a named role bound to a verified identity, which the
  // test gateway's token auth has not): here the page asks for operator.read alone — its list
  // of scopes replaced as the script is served, so the device signature over them holds — and
  // the gateway grants only that.
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const everyScope = /\[`operator\.admin`,`operator\.read`,`operator\.write`,`operator\.approvals`,`operator\.questions`,`operator\.pairing`\]/g;
  let narrowed = 0;
  await context.route(/\/assets\/.*\.js(\?|$)/, async (route) => {
    const response = await route.fetch();
    const text = await response.text();
    const body = text.replace(everyScope, "[`operator.read`]");
    if (body !== text) narrowed += 1;
    await route.fulfill({ response, body, headers: plain(response.headers()) });
  });
  const granted = [];
  let probe;
  const refusal = new Promise((resolve) => { probe = resolve; });
  await context.routeWebSocket(/./, (ws) => {
    const server = ws.connectToServer();
    ws.onMessage((message) => server.send(message));
    server.onMessage((message) => {
      const frame = parse(message);
      if (frame?.id === "vilvona-repair-probe") return probe(frame);
      if (frame?.payload?.type === "hello-ok") {
        granted.push(frame.payload.auth?.scopes);
        // What the page would send for a repair, on this connection: the gateway answers it.
        server.send(JSON.stringify({
          type: "req", id: "vilvona-repair-probe", method: "plugins.sessionAction",
          params: { pluginId: "vilvona", actionId: "repair", payload: { repair: "rebuild-index" }, sessionKey: session.key },
        }));
      }
      ws.send(message);
    });
  });
  page = await context.newPage();
  await page.goto(`${gateway}${path}#token=${token}`);
  await page.locator("[data-part=meter][data-percent]").waitFor({ timeout: 60_000 });
  assert.ok(narrowed > 0, "no script of the Control UI lists the operator scopes it asks for (is OpenClaw 2026.9.6 installed?)");
  assert.ok(granted.length > 0 && granted.every((scopes) => scopes.includes("operator.read") && !scopes.includes("operator.write") && !scopes.includes("operator.admin")),
    `the gateway granted ${JSON.stringify(granted)}`);
  const refused = await refusal;
  console.log(`a repair asked on the read-only connection: ${JSON.stringify(refused).slice(0, 300)}`);
  assert.equal(refused.ok, false, JSON.stringify(refused));
  await page.getByRole("button", { name: "Side panel" }).first().click({ timeout: 60_000 });
  await page.locator("button[role=listitem]", { hasText: "vilvona context" }).first().click({ timeout: 30_000 });
  const view = page.locator("openclaw-plugin-view");
  await view.locator("[data-total]").waitFor({ timeout: 30_000 });
  await view.locator("[data-part=health] [data-ok]").waitFor({ timeout: 30_000 });
  assert.equal(await view.locator("[data-part=repair]").count(), 0, "a read-only connection is offered a repair");
  await page.screenshot({ path: join(out, "openclaw-panel-read-only.png") });
  await context.close();
} catch (error) {
  if (page) {
    await page.screenshot({ path: join(out, "openclaw-panel-failure.png"), fullPage: true }).catch(() => {});
    const text = await page.evaluate(() => document.body.innerText.slice(0, 1500)).catch(() => "");
    console.error(`the page at ${page.url()}:\n${text}`);
  }
  throw error;
} finally {
  await browser.close();
}
writeFileSync(join(out, "openclaw-panel-timings.json"), `${JSON.stringify(timings, null, 2)}\n`);
console.log(`the vilvona panel in OpenClaw's Control UI: ${JSON.stringify(timings)}`);
