// vilvona's context panel: how full the window is and with what, the summary DAG down to the
// source messages, search over the whole history, the store's health. One module for two
// pages: OpenClaw's Control UI mounts it through the default export (its data comes from the
// plugin's "view" session action), `vilvona ui` mounts it through `mountPanel` (its data comes
// from the same views over HTTP). Every stored text is put in the page as text, never as markup.

const PLUGIN_ID = "vilvona";
/** How long typing may pause before a search runs. */
const SEARCH_PAUSE_MS = 150;
/** After a failed watch, the next try waits this long. */
const WATCH_RETRY_MS = 5000;

/** An element with attributes and children (strings become text nodes). */
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return node;
}

const grouped = (n) => Number(n ?? 0).toLocaleString("en-US");
const percent = (part, whole) => (whole > 0 ? Math.round((1000 * part) / whole) / 10 : 0);

/** A snippet with the engine's «highlights» as <mark> elements, all of it text. */
function snippet(text) {
  const out = el("span", { class: "vv-snippet" });
  const parts = String(text ?? "").split(/[«»]/);
  parts.forEach((part, index) => {
    if (!part) return;
    out.append(index % 2 === 1 ? el("mark", {}, part) : document.createTextNode(part));
  });
  return out;
}

/** Inline Markdown (`code`, **strong**, *emphasis*, [text](http…)) as nodes, all of it text. */
function inline(text) {
  const nodes = [];
  const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|(?<![\w*])[*_]([^*_\s][^*_]*)[*_](?![\w*])|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let at = 0;
  for (const match of text.matchAll(pattern)) {
    if (match.index > at) nodes.push(text.slice(at, match.index));
    const [, code, strong, emphasis, label, href] = match;
    if (code !== undefined) nodes.push(el("code", {}, code));
    else if (strong !== undefined) nodes.push(el("strong", {}, strong));
    else if (emphasis !== undefined) nodes.push(el("em", {}, emphasis));
    else nodes.push(el("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, label));
    at = match.index + match[0].length;
  }
  if (at < text.length) nodes.push(text.slice(at));
  return nodes;
}

/**
 * A stored text with its Markdown rendered: headings, lists, fenced code, paragraphs, and the
 * inline marks. Sanitized by construction: every piece becomes a text node or one of a few
 * elements made here (links only to http and https), never markup parsed from the text, so a
 * stored `<script>` shows as text.
 */
export function markdown(text) {
  const out = el("div", { class: "vv-text vv-markdown" });
  const lines = String(text ?? "").split("\n");
  let list = null;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) out.append(el("p", {}, inline(paragraph.join("\n"))));
    paragraph = [];
  };
  for (let index = 0; index < lines.length; index += 1) {
    const line = lines[index];
    const fence = /^\s*```/.test(line);
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    const item = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line);
    if (fence || heading || !line.trim()) flush();
    if (!item || fence || heading) list = null;
    if (fence) {
      const code = [];
      for (index += 1; index < lines.length && !/^\s*```/.test(lines[index]); index += 1) code.push(lines[index]);
      out.append(el("pre", {}, el("code", {}, code.join("\n"))));
    } else if (heading) {
      out.append(el(`h${Math.min(heading[1].length + 3, 6)}`, {}, inline(heading[2])));
    } else if (item) {
      flush();
      if (!list) {
        list = el(item[1] ? "ol" : "ul");
        out.append(list);
      }
      list.append(el("li", {}, inline(item[2])));
    } else if (line.trim()) {
      paragraph.push(line);
    }
  }
  flush();
  return out;
}

/** Whether a stand-in wrote a summary: the truncation, or a fallback in place of the configured summarizer. */
const standIn = (summary) => summary.level === "fallback" || / in place of /.test(summary.summarizer ?? "");

/**
 * The parts of the prompt against the window. Where the host told the engine its window (a
 * gateway's session), from `stats`: the host's own prompt as last counted, the engine's
 * context by kind, the reply's reserve. Else from `context` (the report `vilvona context json`
 * prints): the system prompt with the tools' schemas, summaries by depth, messages.
 */
export function windowParts(context, stats) {
  const plan = stats?.plan;
  if (plan?.window) {
    const parts = [{ name: plan.hostPromptObserved ? "The host's prompt (as the provider counted it)" : "The host's prompt (its estimate)", kind: "system", tokens: plan.hostPrompt ?? 0 }];
    for (const [name, group] of Object.entries(stats.contextByKind ?? {})) {
      const summary = name.startsWith("summary");
      parts.push({ name: `${summary ? "Summaries, " : "Messages, "}${name.replace(/^(summary|message), /, "")} ×${group.items}`, kind: summary ? "summary" : "message", tokens: group.tokens });
    }
    if (plan.reserve) parts.push({ name: "The reply's reserve", kind: "reserve", tokens: plan.reserve });
    // What the next request sends: the host's prompt and the engine's whole context.
    return { parts, total: (plan.hostPrompt ?? 0) + stats.contextTokens, window: plan.window, budget: plan.ceiling, plan };
  }
  const report = context.report;
  const tools = (report.tools ?? []).reduce((sum, tool) => sum + (tool.tokens ?? 0), 0);
  const parts = [{ name: "System prompt and tools", kind: "system", tokens: report.systemPromptTokens + report.engineAdditionTokens + tools }];
  for (const part of report.conversation ?? []) {
    const summary = part.name.startsWith("Summaries");
    parts.push({ name: `${part.name} ×${part.count}`, kind: summary ? "summary" : "message", tokens: part.tokens });
  }
  return { parts, total: report.sessionTokens, window: report.window, budget: report.promptBudget, plan };
}

/** A time in milliseconds as `2026-12-03 14:05` (UTC). */
const minute = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 16);

/** A cost in the prices' unit, to four decimals. */
const money = (amount) => Number(amount).toFixed(4);

/** Bytes as MiB with one decimal. */
const mebibytes = (bytes) => (Number(bytes ?? 0) / 1048576).toFixed(1);

/** "1 summary", "2 summaries". */
const count = (n, one, many) => `${grouped(n)} ${n === 1 ? one : many}`;

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element with attributes and children (strings become text nodes, as in `el`). */
function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return node;
}

/**
 * The charts' points, one a turn, from the `history` view (`vilvona context history --json`):
 * the prompt by part (the host's, summaries, messages) against the window and the trigger,
 * the folds the turn made, what recall at assembly brought into its prompt, and what the
 * provider counted, with the share read from its cache.
 */
export function historyPoints(turns) {
  return turns.map((turn) => {
    let summaries = 0;
    let messages = 0;
    for (const [kind, tokens] of Object.entries(turn.context ?? {})) {
      if (kind.startsWith("summary")) summaries += tokens;
      else messages += tokens;
    }
    const host = turn.hostPrompt ?? 0;
    const usage = turn.usage ?? null;
    const read = usage ? usage.input + usage.cacheRead + usage.cacheWrite : 0;
    return {
      turn: turn.turn, at: turn.at, host, summaries, messages, total: host + summaries + messages,
      window: turn.window ?? null, trigger: turn.trigger + host, folds: turn.folds ?? [],
      before: turn.contextBeforeCompaction, after: turn.contextAfterCompaction, usage,
      recalled: turn.recalled ?? [],
      cachedShare: read > 0 ? usage.cacheRead / read : null,
      // As the host priced it (its model's prices per token kind), or `vilvona ui --prices`.
      cost: usage?.cost ?? null,
    };
  });
}

/** How many turns the charts draw, the newest. */
const HISTORY_TURNS = 300;

/** How many folds the timeline lists; the rest are counted. */
const TIMELINE_ROWS = 40;

/** Mounts the panel; `request(payload)` answers a view (see crates/cli/src/views.rs). */
export function mountPanel(container, options) {
  const state = { sessionKey: options.sessionKey, stamp: undefined, expanded: new Set(), disposed: false, generation: 0 };
  const controller = new AbortController();
  options.signal?.addEventListener("abort", () => dispose());
  const root = el("section", { class: "vv-panel", "aria-label": "vilvona context" });
  container.replaceChildren(root);

  const status = el("p", { class: "vv-status", role: "status" });
  const windowBox = el("div", { class: "vv-window", "data-part": "window" });
  const searchInput = el("input", { type: "search", placeholder: "Search the whole history", "aria-label": "Search the whole history", "data-part": "search" });
  const searchMode = el("select", { "aria-label": "How to search" },
    el("option", { value: "hybrid" }, "words and meaning"), el("option", { value: "text" }, "words"), el("option", { value: "phrase" }, "phrase"));
  const hits = el("ol", { class: "vv-hits", "data-part": "hits" });
  const dagList = el("ul", { class: "vv-dag", "data-part": "dag" });
  const health = el("div", { class: "vv-health", "data-part": "health" });
  const about = el("p", { class: "vv-muted", "data-part": "about" });
  const attention = el("div", { class: "vv-attention", "data-part": "attention" });
  const timeline = el("div", { class: "vv-timeline", "data-part": "timeline" });
  const history = el("div", { class: "vv-history", "data-part": "history" });
  root.append(
    el("h2", {}, "Context"), status, windowBox,
    el("h3", {}, "Turn by turn"), history,
    el("h3", {}, "Search"), el("div", { class: "vv-search" }, searchInput, searchMode), hits,
    el("h3", {}, "Summaries in the context"), dagList,
    el("h3", {}, "Needs attention"), attention,
    el("h3", {}, "Compactions"), timeline,
    el("h3", {}, "Store"), about, health,
  );

  const ask = (payload) => options.request({ session: state.sessionKey, ...payload });
  const say = (text) => { status.textContent = text; };

  /** The window (`windowParts` of the context and stats views). */
  function drawWindow({ parts, total, window, budget, plan }, stats) {
    const bar = el("div", { class: "vv-bar", role: "img", "aria-label": `${grouped(total)} of ${grouped(window)} tokens` });
    for (const part of parts) {
      if (!part.tokens) continue;
      // Through the style object, which a page's content security policy allows.
      const segment = el("span", { class: `vv-seg vv-${part.kind}`, title: `${part.name}: ${grouped(part.tokens)} tokens` });
      segment.style.width = `${percent(part.tokens, window)}%`;
      bar.append(segment);
    }
    const legend = el("ul", { class: "vv-legend" }, parts.map((part) =>
      el("li", { "data-tokens": part.tokens }, el("span", { class: `vv-swatch vv-${part.kind}` }), `${part.name}: ${grouped(part.tokens)} tok (${percent(part.tokens, window)} %)`)));
    windowBox.replaceChildren(
      el("p", { class: "vv-total" },
        el("strong", { "data-total": total }, grouped(total)), " of ",
        el("span", { "data-window": window }, grouped(window)), " tokens — ",
        el("span", { "data-percent": percent(total, window) }, `${percent(total, window)} %`),
        ` of the window; the context may hold ${grouped(budget)}`),
      bar, legend,
      plan ? el("p", { class: "vv-muted", "data-part": "limits" },
        (plan.trigger > 0
          ? `Compaction runs above ${grouped(plan.trigger)} tokens of context and folds it down to ${grouped(plan.goal)}; `
          // OpenClaw at a small window may plan the context no room at all (its budget).
          : `The host leaves the context no room to grow (its budget: ${count(plan.budget ?? 0, "token", "tokens")}), so compaction folds after every turn, as far as it can; `) +
        `it never holds more than ${grouped(plan.ceiling)}. Now ${grouped(stats.contextTokens)} in ${grouped(stats.contextItems)} items, ${grouped(stats.messages)} messages kept.`) : "",
      catchUpNote(stats) ? el("p", { class: "vv-muted", "data-part": "catch-up" }, catchUpNote(stats)) : "",
    );
  }

  /** A row of the DAG: a summary (expandable) or a message. */
  function row(item, path) {
    const id = item.id ?? item.summaryId;
    const isSummary = item.kind === "summary" || item.summaryId !== undefined || String(id).startsWith("sum_");
    const li = el("li", { class: isSummary ? "vv-summary" : "vv-message", "data-id": id });
    const head = el("div", { class: "vv-row" });
    if (isSummary) {
      head.append(el("span", { class: "vv-depth", title: `depth ${item.depth}` }, `D${item.depth ?? "?"}`));
    } else {
      head.append(el("span", { class: "vv-role" }, item.role ?? item.kind ?? "message"));
    }
    head.append(el("code", {}, id));
    const tokens = item.tokens ?? item.childMessageTokens;
    if (tokens !== undefined) head.append(el("span", { class: "vv-muted" }, `${grouped(tokens)} tok`));
    const when = item.earliest && item.latest ? `${item.earliest} → ${item.latest}`
      : item.earliestAtMs != null && item.latestAtMs != null ? `${minute(item.earliestAtMs)} → ${minute(item.latestAtMs)}`
      : item.time;
    if (when) head.append(el("span", { class: "vv-muted" }, when));
    if (item.childSummaries || item.childMessages) {
      head.append(el("span", { class: "vv-muted" }, `${item.childSummaries?.length ?? 0} summaries, ${grouped(item.childMessages ?? 0)} messages below`));
    }
    if (item.inContext) head.append(el("span", { class: "vv-badge" }, "in context"));
    li.append(head);
    const body = item.content ?? item.text;
    if (body) li.append(markdown(body));
    if (isSummary && !path.includes(id)) {
      const children = el("ul", { class: "vv-children" });
      const button = el("button", { type: "button", "aria-expanded": "false", "data-expand": id }, "Expand");
      const open = async (cursor) => {
        button.disabled = true;
        try {
          const expanded = await ask({ view: "expand", id, cursor });
          if (cursor === undefined) children.replaceChildren();
          for (const child of expanded.items ?? []) children.append(row(child, [...path, id]));
          if (expanded.nextCursor !== undefined && expanded.nextCursor !== null) {
            const more = el("button", { type: "button" }, `More (${grouped(expanded.total ?? 0)} in all)`);
            more.addEventListener("click", () => { more.remove(); open(expanded.nextCursor); });
            children.append(el("li", {}, more));
          }
          state.expanded.add(id);
          button.textContent = "Collapse";
          button.setAttribute("aria-expanded", "true");
        } catch (error) {
          children.replaceChildren(el("li", { class: "vv-error" }, `Could not expand ${id}: ${error.message ?? error}`));
        } finally {
          button.disabled = false;
        }
      };
      button.addEventListener("click", () => {
        if (state.expanded.has(id)) {
          state.expanded.delete(id);
          children.replaceChildren();
          button.textContent = "Expand";
          button.setAttribute("aria-expanded", "false");
        } else {
          open();
        }
      });
      head.append(button);
      li.append(children);
      li.open = open;
      // What the user had open stays open when the view is redrawn.
      if (state.expanded.has(id)) open();
    }
    return li;
  }

  /**
   * The session over time, from the `history` view: the prompt per turn stacked by part
   * against the window and the compaction threshold, each fold marked; then what the provider
   * counted per turn, with the share its cache served. Every bar carries its figures as data
   * attributes (the browser tests compare them with `vilvona context history --json`).
   */
  function drawHistory(turns) {
    const points = historyPoints(turns);
    if (points.length === 0) {
      history.replaceChildren(el("p", { class: "vv-muted" }, "No turn recorded yet: a turn is recorded when it is committed."));
      return;
    }
    const width = 600;
    const height = 160;
    const step = width / points.length;
    const bar = Math.max(step * 0.8, 0.5);
    const top = Math.max(...points.map((p) => Math.max(p.total, p.window ?? 0, p.trigger))) * 1.08 || 1;
    const y = (tokens) => height - (height * tokens) / top;
    const prompt = svg("svg", { class: "vv-chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "data-chart": "prompt",
      "aria-label": `The prompt's tokens over ${points.length} turns against the window and the compaction threshold` });
    points.forEach((p, index) => {
      const x = index * step;
      let base = height;
      const group = svg("g", { "data-turn": p.turn, "data-host": p.host, "data-summaries": p.summaries, "data-messages": p.messages },
        svg("title", {}, `Turn ${p.turn}: ${grouped(p.total)} tokens — the host's ${grouped(p.host)}, summaries ${grouped(p.summaries)}, messages ${grouped(p.messages)}`));
      for (const [kind, tokens] of [["system", p.host], ["summary", p.summaries], ["message", p.messages]]) {
        if (!tokens) continue;
        const h = (height * tokens) / top;
        group.append(svg("rect", { class: `vv-${kind}`, x, y: base - h, width: bar, height: h }));
        base -= h;
      }
      prompt.append(group);
      if (p.folds.length) {
        prompt.append(svg("g", { class: "vv-fold", "data-fold-turn": p.turn, "data-folds": p.folds.join(" ") },
          svg("title", {}, `Turn ${p.turn} folded the context from ${grouped(p.before)} to ${grouped(p.after)} tokens: ${p.folds.join(", ")}`),
          svg("rect", { x, y: 0, width: Math.max(bar, 2), height: 8 })));
      }
    });
    // The limits, as the newest turn saw them.
    const newest = points[points.length - 1];
    const limit = (tokens, name) => svg("line", { class: `vv-limit vv-${name}`, x1: 0, x2: width, y1: y(tokens), y2: y(tokens), "data-limit": name, "data-tokens": tokens, "vector-effect": "non-scaling-stroke" });
    if (newest.window) prompt.append(limit(newest.window, "window"));
    prompt.append(limit(newest.trigger, "trigger"));
    const folds = points.filter((p) => p.folds.length);
    const recalled = points.filter((p) => p.recalled.length);
    const lastRecalled = recalled[recalled.length - 1];
    const parts = [
      el("p", { class: "vv-muted" }, `${count(points.length, "turn", "turns")} from ${points[0].turn} to ${newest.turn}; ${count(folds.length, "turn", "turns")} folded (marked above the bars). ` +
        (newest.window ? `The window: ${grouped(newest.window)} tokens (the solid line); compaction` : "Compaction") + ` runs above ${grouped(newest.trigger)} (the dashed line, the host's prompt included).`),
      prompt,
      el("ul", { class: "vv-legend" }, [["system", "The host's prompt"], ["summary", "Summaries"], ["message", "Messages"], ["fold", "A fold"]].map(([kind, name]) =>
        el("li", {}, el("span", { class: `vv-swatch vv-${kind}` }), name))),
      // What recall at assembly brought into the prompts from the history beyond the context.
      el("p", { class: "vv-muted", "data-recalled-turns": recalled.length },
        lastRecalled
          ? `${count(recalled.length, "turn", "turns")} had excerpts recalled into the prompt from the history beyond the context; the newest, turn ${lastRecalled.turn}: ` +
            lastRecalled.recalled.map((item) => `${item.id} (score ${item.score.toFixed(3)}, ${grouped(item.tokens)} tok)`).join(", ") + "."
          : "Nothing was recalled into a prompt from the history beyond the context."),
    ];
    const reported = points.filter((p) => p.usage);
    if (reported.length) {
      const most = Math.max(...reported.map((p) => p.usage.input + p.usage.cacheRead + p.usage.cacheWrite + p.usage.output)) * 1.08 || 1;
      const provider = svg("svg", { class: "vv-chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "data-chart": "provider",
        "aria-label": `What the provider counted over ${reported.length} turns, with the share read from its cache` });
      points.forEach((p, index) => {
        if (!p.usage) return;
        const { input, cacheRead, cacheWrite, output } = p.usage;
        const share = p.cachedShare === null ? "" : Math.round(1000 * p.cachedShare) / 10;
        const group = svg("g", { "data-turn": p.turn, "data-input": input, "data-cache-read": cacheRead, "data-cache-write": cacheWrite, "data-output": output, "data-cached-share": share, "data-cost": p.cost ?? "" },
          svg("title", {}, `Turn ${p.turn}: ${grouped(cacheRead)} tokens read from the cache${share === "" ? "" : ` (${share} %)`}, ${grouped(cacheWrite)} written to it, ${grouped(input)} read fresh, ${grouped(output)} written out${p.cost === null ? "" : `; cost ${money(p.cost)}`}`));
        let base = height;
        for (const [kind, tokens] of [["cached", cacheRead], ["cache-write", cacheWrite], ["fresh", input], ["output", output]]) {
          if (!tokens) continue;
          const h = (height * tokens) / most;
          group.append(svg("rect", { class: `vv-${kind}`, x: index * step, y: base - h, width: bar, height: h }));
          base -= h;
        }
        provider.append(group);
      });
      const cached = reported.reduce((sum, p) => sum + p.usage.cacheRead, 0);
      const read = reported.reduce((sum, p) => sum + p.usage.input + p.usage.cacheRead + p.usage.cacheWrite, 0);
      const priced = reported.filter((p) => p.cost !== null);
      const spent = priced.reduce((sum, p) => sum + p.cost, 0);
      parts.push(
        el("p", { class: "vv-muted", "data-part": "provider", "data-cost": priced.length ? spent : "" },
          `What the provider counted, ${count(reported.length, "turn", "turns")} reporting: ${grouped(read)} input tokens, ${percent(cached, read)} % of them read from its cache` +
          (priced.length ? `; cost ${money(spent)} in all, ${money(spent / priced.length)} a turn (the model's prices per token kind).` : " (no prices configured: tokens only).")),
        provider,
        el("ul", { class: "vv-legend" }, [["cached", "Read from the cache"], ["cache-write", "Written to the cache"], ["fresh", "Read fresh"], ["output", "Output"]].map(([kind, name]) =>
          el("li", {}, el("span", { class: `vv-swatch vv-${kind}` }), name))),
      );
    } else {
      parts.push(el("p", { class: "vv-muted", "data-part": "provider" }, "The provider reported no usage for these turns."));
    }
    history.replaceChildren(...parts);
  }

  function drawDag(dag) {
    const tops = (dag.summaries ?? []).filter((summary) => summary.inContext);
    const rows = tops.map((summary) => row({ ...summary, id: summary.summaryId, kind: "summary" }, []));
    rows.push(el("li", { class: "vv-message" }, el("div", { class: "vv-row" },
      el("span", { class: "vv-role" }, "fresh"), `${grouped(dag.rawMessages)} messages kept whole, ${grouped(dag.rawMessageTokens)} tok`)));
    dagList.replaceChildren(...rows);
  }

  /**
   * The compactions (the `timeline` view: crates/cli/src/timeline.rs), newest first, with
   * `system` the tokens of the system prompt and tools, which every prompt starts with.
   */
  function drawTimeline(folds, system) {
    if (!folds.folds) {
      timeline.replaceChildren(el("p", { class: "vv-muted" }, "No compaction yet: the context holds every message whole."));
      return;
    }
    timeline.replaceChildren(
      el("p", { class: "vv-muted", "data-compactions": folds.folds },
        `${count(folds.folds, "fold", "folds")}; a model summarizer read ${grouped(folds.modelTokens)} tokens for them` +
        (folds.fallbacks ? `; ${count(folds.fallbacks, "was", "were")} written by a fallback in place of the configured summarizer` : "") +
        (folds.truncations ? `; ${count(folds.truncations, "made", "made")} room by truncation (no summarizer)` : "") + "."),
      el("p", { class: "vv-muted", "data-cache-kept": folds.meanCacheKept },
        `Cache-hit estimate: after a fold, a provider's prompt cache can still serve the system prompt and tools (${grouped(system)} tok) ` +
        `and about ${grouped(folds.meanCacheKept)} tok of older summaries ahead of it; the rest of the next prompt is read anew.`),
      el("ol", { class: "vv-passes" }, folds.rows.map((fold) => el("li", { "data-id": fold.id, "data-before": fold.before, "data-after": fold.after, "data-cache-kept": fold.cacheKept },
        el("div", { class: "vv-row" },
          el("span", { class: "vv-muted" }, minute(fold.at)),
          el("span", { class: "vv-depth", title: `depth ${fold.depth}` }, `D${fold.depth}`),
          (fold.messages ? count(fold.messages, "message", "messages") : "") +
            (fold.messages && fold.foldedSummaries ? " and " : "") +
            (fold.foldedSummaries ? count(fold.foldedSummaries, "summary", "summaries") : "") +
            ` (${grouped(fold.before)} tok) → ${grouped(fold.after)} tok`,
          el("span", { class: "vv-muted", title: "tokens after the system prompt and tools the prompt cache still serves" }, `cache keeps ${grouped(system + fold.cacheKept)} tok`),
          el("span", { class: "vv-muted" }, fold.summarizer),
          fold.fallback ? el("span", { class: "vv-badge vv-warn" }, "fallback") : "",
          fold.truncated ? el("span", { class: "vv-badge vv-warn" }, "truncated") : "")))),
      folds.folds > folds.rows.length ? el("p", { class: "vv-muted" }, `and ${grouped(folds.folds - folds.rows.length)} earlier`) : "",
    );
  }

  function drawHealth(check) {
    // The store check reads every row and index file: asked when the panel opens, after a
    // repair, and when the user asks again, never on the refreshes a turn sets off.
    const again = el("button", { type: "button", "data-part": "recheck" }, "Check again");
    again.addEventListener("click", () => {
      again.disabled = true;
      checkStore(state.generation);
    });
    health.replaceChildren(
      el("p", { class: check.ok ? "vv-ok" : "vv-error", "data-ok": check.ok }, check.ok ? "Healthy: " : "Needs attention: ", check.detail, " ", again),
      check.indexNeedsRebuild ? el("p", {}, "Rebuilding the recall index from the database heals this: `vilvona doctor --fix`.") : "",
      state.repaired ? el("p", { "data-part": "repair-result" }, state.repaired) : "",
    );
    // A repair is offered only to who may make it, and only after a preview.
    if (!options.repair || !(options.canRepair ?? check.canRepair)) return;
    offerRepair(check, "rebuild-index", "Rebuild the recall index…", "Rebuild now",
      (done) => `Rebuilt the recall index: ${grouped(done.rebuilt)} documents.`);
    drawAttention(check);
  }

  /**
   * The summaries in the context a stand-in wrote (the truncation, or a fallback in place of
   * the configured summarizer), each with why; the rewrite by the configured summarizer
   * beside them, for who may repair.
   */
  function drawAttention(check) {
    const flagged = state.standIns ?? [];
    if (flagged.length === 0) {
      attention.replaceChildren(el("p", { class: "vv-ok", "data-flagged": 0 }, "Nothing: the configured summarizer wrote every summary in the context."));
      return;
    }
    attention.replaceChildren(
      el("p", { class: "vv-warn", "data-flagged": flagged.length }, `${count(flagged.length, "summary", "summaries")} in the context ${flagged.length === 1 ? "was" : "were"} written by a stand-in; the configured summarizer can write them again, each in its place.`),
      el("ul", { class: "vv-dag" }, flagged.map((summary) => el("li", { "data-id": summary.summaryId },
        el("div", { class: "vv-row" },
          el("span", { class: "vv-depth" }, `D${summary.depth}`), el("code", {}, summary.summaryId),
          el("span", { class: "vv-badge vv-warn" }, summary.level === "fallback" ? "truncated" : "fallback"),
          el("span", { class: "vv-muted" }, `${grouped(summary.tokens)} tok, ${summary.summarizer}`))))),
    );
    if (!check || !options.repair || !(options.canRepair ?? check.canRepair)) return;
    offerRepair(check, "resummarize", `Rewrite ${count(flagged.length, "summary", "summaries")} with the configured summarizer…`, "Rewrite now",
      (done) => `Re-summarized ${grouped(done.rewritten)} of ${grouped(done.flagged)} with ${done.summarizer}` +
        (done.remaining ? `; ${grouped(done.remaining)} still written by a stand-in.` : "."), attention);
  }

  /** A repair's button: its preview (what it will do, whether it is needed), then a confirmation. */
  function offerRepair(check, repair, label, confirmLabel, result, container = health) {
    const fix = (payload) => options.repair({ session: state.sessionKey, repair, ...payload });
    const box = el("div", { class: "vv-repair", "data-repair": repair });
    const start = el("button", { type: "button", "data-part": "repair" }, label);
    start.addEventListener("click", async () => {
      start.disabled = true;
      try {
        const preview = await fix({});
        const confirm = el("button", { type: "button", "data-part": "confirm-repair" }, confirmLabel);
        const cancel = el("button", { type: "button" }, "Cancel");
        cancel.addEventListener("click", () => drawHealth(check));
        confirm.addEventListener("click", async () => {
          confirm.disabled = cancel.disabled = true;
          try {
            state.repaired = result(await fix({ confirm: true }));
            await refresh({ check: true });
          } catch (error) {
            box.replaceChildren(el("p", { class: "vv-error" }, `The repair failed: ${error.message ?? error}`));
          }
        });
        box.replaceChildren(
          el("p", { "data-part": "repair-preview" }, `This will ${preview.will}. `,
            preview.needed ? "It is needed." : "It is not needed: the store's check finds nothing for it to do."),
          el("div", { class: "vv-row" }, confirm, cancel),
        );
        confirm.focus();
      } catch (error) {
        box.replaceChildren(el("p", { class: "vv-error" }, `No preview: ${error.message ?? error}`));
      }
    });
    box.append(start);
    container.append(box);
  }

  /** Opens the summary a hit lies under, at the top of the DAG, and shows it. */
  async function reveal(hit) {
    const target = hit.coveredBy ?? (hit.kind === "summary" ? hit.id : undefined);
    if (!target) return;
    const top = dagList.querySelector(`li[data-id="${CSS.escape(target)}"]`);
    if (top?.open && !state.expanded.has(target)) await top.open();
    top?.scrollIntoView({ block: "nearest" });
    top?.querySelector("button")?.focus();
  }

  let searchTimer;
  let searchRun = 0;
  async function search() {
    const query = searchInput.value.trim();
    const run = ++searchRun;
    if (!query) { hits.replaceChildren(); return; }
    const started = performance.now();
    try {
      const found = await ask({ view: "grep", query, mode: searchMode.value, limit: 20 });
      if (run !== searchRun) return;
      const results = found.results ?? [];
      hits.replaceChildren(...(results.length ? results.map((hit) => {
        const open = el("button", { type: "button" }, "Show in the DAG");
        open.addEventListener("click", () => reveal(hit));
        return el("li", { "data-id": hit.id },
          el("div", { class: "vv-row" }, el("code", {}, hit.id), el("span", { class: "vv-muted" }, hit.kind, hit.depth !== undefined ? ` D${hit.depth}` : "", hit.time ? ` ${hit.time}` : ""),
            hit.coveredBy ? el("span", { class: "vv-muted" }, `under ${hit.coveredBy}`) : "", hit.coveredBy || hit.kind === "summary" ? open : ""),
          snippet(hit.snippet));
      }) : [el("li", { class: "vv-muted" }, `No matches for “${query}”.`)]));
      root.dataset.searched = query;
      // How long the search took, asked to drawn (the browser tests read it).
      root.dataset.searchMs = String(Math.round(performance.now() - started));
    } catch (error) {
      if (run === searchRun) hits.replaceChildren(el("li", { class: "vv-error" }, `Search failed: ${error.message ?? error}`));
    }
  }
  searchInput.addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(search, SEARCH_PAUSE_MS); });
  searchInput.addEventListener("keydown", (event) => { if (event.key === "Enter") { clearTimeout(searchTimer); search(); } });
  searchMode.addEventListener("change", search);

  /** Asks the store check and draws it (a panel switched to another session meanwhile draws nothing). */
  function checkStore(generation) {
    return ask({ view: "health" })
      .then((check) => {
        if (generation !== state.generation) return;
        state.check = check;
        drawHealth(check);
      })
      .catch((error) => health.replaceChildren(el("p", { class: "vv-error" }, `The store could not be checked: ${error.message ?? error}`)));
  }

  async function refresh({ check = false } = {}) {
    const generation = state.generation;
    const started = performance.now();
    const checking = check || !state.check;
    const [context, stats, dag, folds, turns] = await Promise.all([ask({ view: "context" }), ask({ view: "stats" }),
      ask({ view: "dag", inContext: true }), ask({ view: "timeline", limit: TIMELINE_ROWS }), ask({ view: "history", limit: HISTORY_TURNS })]);
    if (state.disposed || generation !== state.generation) return;
    const prompt = windowParts(context, stats);
    drawWindow(prompt, stats);
    drawHistory(turns);
    about.replaceChildren(`vilvona ${stats.version ?? "?"}; the store: ${mebibytes(stats.databaseBytes)} MiB, ${count(stats.indexDocs ?? 0, "document", "documents")} in the recall index.`);
    drawDag(dag);
    // The system prompt and tools: the first part, which every prompt starts with.
    drawTimeline(folds, prompt.parts[0].tokens);
    state.standIns = dag.summaries.filter((summary) => summary.inContext && standIn(summary));
    drawAttention(state.check);
    // How long the views took, asked to drawn (the browser tests read it).
    root.dataset.painted = String(Math.round(performance.now() - started));
    say(`Session ${state.sessionKey}`);
    // The store check reads every index file: it comes after the paint. A refresh that does
    // not ask it again redraws the last one (the repairs it offers follow the context).
    if (checking) checkStore(generation);
    else drawHealth(state.check);
  }

  /** Redraws when a turn commits or compaction publishes (the `watch` view answers then). */
  async function live() {
    while (!state.disposed) {
      if (document.hidden) {
        await new Promise((resolve) => document.addEventListener("visibilitychange", resolve, { once: true, signal: controller.signal }));
        continue;
      }
      const generation = state.generation;
      try {
        const watched = await ask({ view: "watch", since: state.stamp });
        if (state.disposed || generation !== state.generation) continue;
        const first = state.stamp === undefined;
        state.stamp = watched.stamp;
        if (watched.changed && !first) await refresh();
      } catch (error) {
        if (state.disposed) return;
        say(`Not updating: ${error.message ?? error}`);
        await new Promise((resolve) => setTimeout(resolve, WATCH_RETRY_MS));
      }
    }
  }

  function start() {
    state.generation += 1;
    state.stamp = undefined;
    state.repaired = undefined;
    state.check = undefined;
    hits.replaceChildren();
    say(`Loading ${state.sessionKey} …`);
    refresh().catch((error) => say(`Could not read ${state.sessionKey}: ${error.message ?? error}`));
  }

  function dispose() {
    state.disposed = true;
    controller.abort();
    clearTimeout(searchTimer);
  }

  start();
  live();
  return {
    update(props) {
      if (props?.sessionKey && props.sessionKey !== state.sessionKey) {
        // Another session: nothing of the last one is kept.
        state.sessionKey = props.sessionKey;
        state.expanded.clear();
        searchInput.value = "";
        start();
      }
    },
    dispose,
  };
}

/**
 * What the engine says of turns it took in from the host's history because the host never
 * committed them (OpenClaw on Anthropic's API with its cache-ttl pruning); "" when none.
 */
export function catchUpNote(stats) {
  const caught = stats?.catchUp;
  if (!caught?.turns) return "";
  return `${count(caught.turns, "turn", "turns")} taken in from the host's history at a later turn: the host did not commit ${caught.turns === 1 ? "it" : "them"}` +
    (caught.commitsMissing ? " (its commits are missing now)." : " (its commits came since).");
}

/**
 * The window meter for a session's header: how full the window is and with how many summaries
 * and messages; it follows the session as the panel does (on the `watch` view).
 */
export function mountMeter(container, options) {
  const meter = el("span", { class: "vv-meter", "data-part": "meter", role: "status" }, "vilvona …");
  container.replaceChildren(meter);
  let sessionKey = options.sessionKey;
  let stamp;
  let disposed = false;
  options.signal?.addEventListener("abort", () => { disposed = true; });
  const draw = async () => {
    const [context, stats] = await Promise.all([
      options.request({ session: sessionKey, view: "context" }),
      options.request({ session: sessionKey, view: "stats" }),
    ]);
    const { total, window } = windowParts(context, stats);
    const summaries = Object.values(stats.summariesByDepth ?? {}).reduce((sum, n) => sum + n, 0);
    const caught = stats.catchUp?.turns ? ` · ${grouped(stats.catchUp.turns)} uncommitted turns taken in` : "";
    meter.textContent = `vilvona ${percent(total, window)} % · ${grouped(summaries)} summaries, ${grouped(stats.contextItems - summaries)} messages${caught}`;
    meter.title = [`${grouped(total)} of ${grouped(window)} tokens in the window`, catchUpNote(stats)].filter(Boolean).join("\n");
    meter.dataset.catchUp = String(stats.catchUp?.turns ?? 0);
    meter.dataset.percent = String(percent(total, window));
  };
  (async () => {
    while (!disposed) {
      try {
        const watched = await options.request({ session: sessionKey, view: "watch", since: stamp });
        if (disposed) return;
        if (watched.stamp !== stamp) await draw();
        stamp = watched.stamp;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, WATCH_RETRY_MS));
      }
    }
  })();
  return {
    update(props) {
      if (props?.sessionKey && props.sessionKey !== sessionKey) {
        sessionKey = props.sessionKey;
        stamp = undefined;
      }
    },
    dispose() { disposed = true; },
  };
}

/** What a session action answered, or its error thrown. */
export function unwrap(answer) {
  const reply = answer?.result !== undefined && answer?.ok !== undefined ? answer : { ok: true, result: answer };
  if (!reply.ok) throw new Error(reply.error?.message ?? reply.error ?? "the vilvona action failed");
  // A view too large for OpenClaw's limits on an action's result travels as JSON text in
  // pieces (see `fitForOpenClaw` in the plugin).
  const result = Array.isArray(reply.result?.jsonPieces) ? JSON.parse(reply.result.jsonPieces.join("")) : reply.result;
  if (result?.error) throw new Error(result.error);
  return result;
}

/**
 * A view of OpenClaw's (panel or header accessory) mounted with `mount(container, options)`,
 * its data read through the plugin's `view` session action for the session it is shown with.
 */
function hosted(host, mount) {
  return (container, ctx) => {
    let props = ctx.props ?? {};
    const action = (actionId) => (payload) => host.request("plugins.sessionAction", {
      pluginId: PLUGIN_ID,
      actionId,
      payload,
      sessionKey: props.sessionKey,
      agentId: props.agentId,
    }).then(unwrap);
    const view = mount(container, {
      sessionKey: props.sessionKey,
      signal: ctx.signal,
      request: action("view"),
      // The repair action needs operator.write: a connection that may only read is not offered it.
      repair: action("repair"),
      canRepair: host.connection?.canWrite === true,
    });
    return {
      // OpenClaw hands the whole context again when the session changes.
      update(next) {
        props = next?.props ?? props;
        view.update({ sessionKey: props.sessionKey });
      },
      dispose: view.dispose,
    };
  };
}

export default {
  id: PLUGIN_ID,
  activate(host) {
    host.ui.registerPanel({ id: "context", label: "vilvona context", mount: hosted(host, mountPanel) });
    host.ui.registerAccessory?.({ id: "meter", placement: "session-header", mount: hosted(host, mountMeter) });
  },
};
