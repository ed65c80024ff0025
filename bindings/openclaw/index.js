// vilvona for OpenClaw: a context-engine plugin that forwards every lifecycle call to a
// `vilvona serve --stdio` process over JSON-RPC 2.0 (one JSON object per line).
//
// The process starts lazily on first use (register() runs several times per OpenClaw process
// and must stay cheap), is shared by every engine instance of this process, and restarts if it
// dies. Sets become arrays, an AbortSignal becomes `$/cancel`, a spawn rollback becomes a
// handle, and the host's `runtimeContext.llm.complete` answers the server's `llm.complete`.

import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import { homedir } from "node:os";
import { delimiter, dirname, join } from "node:path";

const ENGINE_ID = "vilvona";
const BINARY_NAME = process.platform === "win32" ? "vilvona.exe" : "vilvona";

/** The platform package that carries the executable for this platform and architecture. */
export function platformPackage(platform = process.platform, arch = process.arch) {
  return `@vilvona/cli-${platform}-${arch}`;
}

function executable(path) {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * Finds the vilvona executable: the `binary` setting, then `VILVONA_BIN`, then the installed
 * platform package, then `vilvona` on PATH. Throws one error that lists everything it tried.
 */
export function resolveBinary(config = {}, env = process.env, resolvePackage = createRequire(import.meta.url).resolve) {
  const tried = [];
  const candidate = (source, path) => {
    if (path && executable(path)) return path;
    tried.push(`${source}: ${path ? `${path} (${path && statSyncSafe(path) ? "not executable" : "missing"})` : "not set"}`);
    return null;
  };
  const fromConfig = candidate("the plugin's `binary` setting", config.binary);
  if (fromConfig) return fromConfig;
  const fromEnv = candidate("VILVONA_BIN", env.VILVONA_BIN);
  if (fromEnv) return fromEnv;
  const name = platformPackage();
  let packaged = null;
  try {
    packaged = join(dirname(resolvePackage(`${name}/package.json`)), "bin", BINARY_NAME);
  } catch {
    tried.push(`the platform package ${name}: not installed`);
  }
  if (packaged) {
    const found = candidate(`the platform package ${name}`, packaged);
    if (found) return found;
  }
  for (const dir of (env.PATH ?? "").split(delimiter).filter(Boolean)) {
    const path = join(dir, BINARY_NAME);
    if (executable(path)) return path;
  }
  tried.push(`${BINARY_NAME} on PATH: not found`);
  throw new Error(`vilvona: cannot find the vilvona executable; tried ${tried.join("; ")}. Install ${name}, set VILVONA_BIN, or set the plugin's \`binary\` setting.`);
}

function statSyncSafe(path) {
  try {
    statSync(path);
    return true;
  } catch {
    return false;
  }
}
const SHARED = Symbol.for("vilvona.openclaw.process");

const SEMANTICS = {
  currentTurnFence: "before-current-turn-entry-v1",
  turnAdvancementIdempotency: "atomic-idempotent-v1",
};

// What the lossless engine needs from a host (the engine's own `hostRequirements`): OpenClaw
// fails such a run closed, with this message, instead of running it without assembly.
const HOST_REQUIREMENTS = {
  "agent-run": {
    requiredCapabilities: ["assemble-before-prompt"],
    unsupportedMessage:
      "The lossless engine builds the model's context in assemble(); this host never calls it before the prompt. Use the embedded host, or select the legacy engine for this backend.",
  },
};

const MAINTAIN_REASONS = new Set(["bootstrap", "turn", "compaction"]);

// `vilvona serve`'s answer when an assemble left out a history the engine needs after all.
const HISTORY_NEEDED = -32005;

// How many sessions' last assembled context the plugin keeps, to rebuild replies that carry
// only what changed.
const ASSEMBLED_SESSIONS = 64;

// The part of runtimeSettings the engine reads: the run's prompt budget.
function limits(params) {
  const found = params?.runtimeSettings?.limits;
  return found ? { limits: { promptTokenBudget: found.promptTokenBudget, maxOutputTokens: found.maxOutputTokens } } : undefined;
}

/** vilvona's state directory: the `stateDir` setting, else ~/.vilvona. */
function stateDirOf(config) {
  return config.stateDir ?? join(homedir(), ".vilvona");
}

/**
 * The tools the engine offers, as `vilvona serve` lists them: `tools/list` before `initialize`
 * answers from what the engine declares, opening no storage. Asked once per process (register()
 * runs several times); the engine's own definitions are the only copy.
 */
export function declaredTools(proc, run = spawnSync) {
  if (proc.tools) return proc.tools;
  const request = { jsonrpc: "2.0", id: 1, method: "tools/list", params: { engineId: "lossless" } };
  const listed = run(resolveBinary(proc.config), ["--state-dir", stateDirOf(proc.config), "serve", "--stdio"], {
    input: JSON.stringify(request) + "\n",
    encoding: "utf8",
    timeout: 10_000,
    stdio: ["pipe", "pipe", "ignore"],
  });
  const reply = String(listed.stdout ?? "")
    .split("\n")
    .map((line) => {
      try {
        return JSON.parse(line);
      } catch {
        return null;
      }
    })
    .find((message) => message?.id === 1);
  if (!Array.isArray(reply?.result?.tools)) {
    // A binary that exits before reading its input makes the write fail (EPIPE): its exit
    // status says why, not the pipe.
    const failed = listed.error?.code === "EPIPE" && listed.status !== null ? null : listed.error;
    const why = failed?.message ?? reply?.error?.message ?? `exit status ${listed.status}`;
    throw new Error(`vilvona: could not list the engine's tools (${why})`);
  }
  proc.tools = reply.result.tools;
  return proc.tools;
}

class VilvonaProcess {
  constructor(config) {
    this.config = config ?? {};
    this.child = null;
    this.nextId = 1;
    this.pending = new Map();
    this.ready = null;
    // The host's model, per call in flight: OpenClaw scopes `runtimeContext.llm.complete` to
    // one run, so a summary requested during a call is answered by that call's model (the
    // newest in flight), never by one kept from an earlier run.
    this.llms = [];
    this.lastSession = null;
    // The engine's tool definitions (declaredTools), once listed.
    this.tools = null;
    this.toolsRegistered = false;
    // Per session, the last assembled context as the engine numbered it (`revision`), and
    // whether the engine holds the session's history (then assemble leaves it out).
    this.assembled = new Map();
  }

  /**
   * `assemble` without re-sending what the engine already has: the host's history is left out
   * once the engine said it holds the session (and sent again if the engine needs it after
   * all), and the reply carries only the messages this process does not already hold.
   */
  async assemble(params) {
    const sessionId = params.sessionId;
    const base = this.assembled.get(sessionId);
    const request = { ...params, assembledRevision: base?.revision };
    let result;
    if (base?.holdsHistory) {
      try {
        result = await this.request("assemble", { ...request, messages: [], historyElided: true });
      } catch (error) {
        if (error.code !== HISTORY_NEEDED) throw error;
      }
    }
    result ??= await this.request("assemble", request);
    const { revision, held, holdsHistory, ...rest } = result;
    const messages = held ? rebuild(base.messages, held, rest.messages) : rest.messages;
    this.assembled.delete(sessionId);
    if (this.assembled.size >= ASSEMBLED_SESSIONS) this.assembled.delete(this.assembled.keys().next().value);
    if (revision !== undefined) this.assembled.set(sessionId, { revision, messages, holdsHistory: !!holdsHistory });
    return { ...rest, messages: messages.slice() };
  }

  start() {
    const binary = resolveBinary(this.config);
    const stateDir = stateDirOf(this.config);
    const env = { ...process.env };
    if (this.config.log) env.RUST_LOG = this.config.log;
    const child = spawn(binary, ["--state-dir", stateDir, "serve", "--stdio"], {
      stdio: ["pipe", "pipe", "inherit"],
      env,
    });
    this.child = child;
    child.on("exit", () => {
      if (this.child !== child) return;
      this.child = null;
      this.ready = null;
      for (const { reject } of this.pending.values()) reject(new Error("vilvona process exited"));
      this.pending.clear();
    });
    child.on("error", (error) => {
      for (const { reject } of this.pending.values()) reject(error);
      this.pending.clear();
    });
    createInterface({ input: child.stdout }).on("line", (line) => this.receive(line));
    this.ready = this.send("initialize", {
      stateDir,
      engineId: "lossless",
      config: this.config.engine ?? null,
    });
    return this.ready;
  }

  receive(line) {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return;
    }
    if (message.method === "llm.complete" && message.id !== undefined) {
      this.answerLlm(message);
      return;
    }
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    if (message.error) {
      const error = new Error(`vilvona: ${message.error.message}`);
      error.code = message.error.code;
      waiter.reject(error);
    } else {
      waiter.resolve(message.result);
    }
  }

  /** Runs `call` with the host model of `params.runtimeContext` in scope while it is in flight. */
  async withHostModel(params, call) {
    const llm = params?.runtimeContext?.llm;
    if (typeof llm?.complete !== "function") return call();
    const scope = { complete: llm.complete.bind(llm) };
    this.llms.push(scope);
    try {
      return await call();
    } finally {
      this.llms.splice(this.llms.indexOf(scope), 1);
    }
  }

  async answerLlm(message) {
    const reply = (payload) => this.child?.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: message.id, ...payload }) + "\n");
    const scope = this.llms[this.llms.length - 1];
    if (!scope) {
      reply({ error: { code: -32004, message: "no host model in scope: OpenClaw offers llm.complete only during the call it passes it to" } });
      return;
    }
    try {
      const result = await scope.complete(message.params);
      const text =
        typeof result === "string"
          ? result
          : result?.text ?? (Array.isArray(result?.content) ? result.content.map((block) => block.text ?? "").join("\n") : "");
      reply({ result: { text } });
    } catch (error) {
      reply({ error: { code: -32004, message: String(error?.message ?? error) } });
    }
  }

  send(method, params, signal) {
    if (!this.child) throw new Error("vilvona process is not running");
    const id = this.nextId++;
    const promise = new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
    });
    this.child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }, jsonReplacer) + "\n");
    if (signal) {
      const cancel = () => this.child?.stdin.write(JSON.stringify({ jsonrpc: "2.0", method: "$/cancel", params: { id } }) + "\n");
      if (signal.aborted) cancel();
      else signal.addEventListener("abort", cancel, { once: true });
    }
    return promise;
  }

  async request(method, params, signal) {
    if (!this.child) this.start();
    await this.ready;
    return this.send(method, params, signal);
  }
}

/**
 * An assembled context from the one held before: `held` runs `[at, from, count]` place the
 * held messages `from..from+count` at `at..at+count`; `fresh` fills the other places in order.
 */
export function rebuild(before, held, fresh) {
  const out = [];
  let next = 0;
  for (const [at, from, count] of held) {
    while (out.length < at) out.push(fresh[next++]);
    for (let index = from; index < from + count; index++) out.push(before[index]);
  }
  while (next < fresh.length) out.push(fresh[next++]);
  return out;
}

// Sets become arrays; functions and AbortSignals are not data.
function jsonReplacer(_key, value) {
  if (value instanceof Set) return Array.from(value);
  if (typeof value === "function") return undefined;
  if (typeof AbortSignal !== "undefined" && value instanceof AbortSignal) return undefined;
  return value;
}

function shared(config) {
  globalThis[SHARED] ??= new VilvonaProcess(config);
  return globalThis[SHARED];
}

function session(params) {
  return { sessionId: params.sessionId, sessionKey: params.sessionKey };
}

function remember(proc, params) {
  if (params?.sessionId) proc.lastSession = session(params);
}

function createEngine(proc) {
  const engine = {
    info: {
      id: ENGINE_ID,
      name: "vilvona lossless",
      version: "0.1.0",
      ownsCompaction: true,
      acceptedHostParams: ["sessionKey", "prompt", "runtimeSettings", "sessionTarget", "runtimeContext", "abortSignal"],
      transcriptSemantics: SEMANTICS,
      hostRequirements: HOST_REQUIREMENTS,
    },
    async bootstrap(params) {
      remember(proc, params);
      return proc.request("bootstrap", { ...session(params), sessionFile: typeof params.sessionFile === "string" ? params.sessionFile : undefined });
    },
    async ingest(params) {
      remember(proc, params);
      return proc.request("ingest", { ...session(params), message: params.message, isHeartbeat: !!params.isHeartbeat });
    },
    async ingestBatch(params) {
      remember(proc, params);
      return proc.request("ingestBatch", { ...session(params), messages: params.messages, isHeartbeat: !!params.isHeartbeat });
    },
    async afterTurn(params) {
      remember(proc, params);
      await proc.request("afterTurn", {
        ...session(params),
        messages: params.messages,
        prePromptMessageCount: params.prePromptMessageCount ?? 0,
        tokenBudget: params.tokenBudget,
        isHeartbeat: !!params.isHeartbeat,
        runtimeSettings: limits(params),
      });
    },
    async assemble(params) {
      remember(proc, params);
      const model = typeof params.model === "string" ? params.model : params.model?.id;
      return proc.assemble({
        ...session(params),
        messages: params.messages ?? [],
        tokenBudget: params.tokenBudget,
        // The recall tools are this plugin's own; tool search may defer their schemas, but they
        // are callable, so the engine's recall guidance applies.
        availableTools: [
          ...Array.from(params.availableTools ?? []),
          ...(proc.toolsRegistered ? proc.tools.map((tool) => tool.name) : []),
        ],
        citationsMode: typeof params.citationsMode === "string" ? params.citationsMode : undefined,
        model,
        prompt: typeof params.prompt === "string" ? params.prompt : undefined,
        runtimeSettings: limits(params),
      });
    },
    async commitTurn(params) {
      remember(proc, params);
      return proc.request("commitTurn", {
        ...session(params),
        advancementKey: params.advancementKey,
        messages: params.messages ?? [],
        prePromptMessageCount: params.prePromptMessageCount ?? 0,
        // OpenClaw 2026.9 sends messages without entry ids: the advancement key and each
        // message's index identify them; the anchors travel along as the host sent them.
        admission: params.admission,
        terminal: params.terminal,
        isHeartbeat: !!params.isHeartbeat,
        tokenBudget: params.tokenBudget,
        runtimeSettings: limits(params),
      });
    },
    async compact(params) {
      remember(proc, params);
      return proc.request(
        "compact",
        {
          ...session(params),
          tokenBudget: params.tokenBudget,
          force: !!params.force,
          currentTokenCount: params.currentTokenCount,
          compactionTarget: params.compactionTarget,
          customInstructions: params.customInstructions,
          runtimeSettings: limits(params),
        },
        params.abortSignal,
      );
    },
    async maintain(params) {
      remember(proc, params);
      return proc.request(
        "maintain",
        { ...session(params), reason: MAINTAIN_REASONS.has(params.reason) ? params.reason : undefined, tokenBudget: params.tokenBudget, runtimeSettings: limits(params) },
        params.abortSignal,
      );
    },
    async prepareSubagentSpawn(params) {
      const result = await proc.request("prepareSubagentSpawn", {
        parentSessionKey: params.parentSessionKey,
        childSessionKey: params.childSessionKey,
        contextMode: params.contextMode,
        parentSessionId: params.parentSessionId,
        parentSessionFile: typeof params.parentSessionFile === "string" ? params.parentSessionFile : undefined,
        childSessionId: params.childSessionId,
        childSessionFile: typeof params.childSessionFile === "string" ? params.childSessionFile : undefined,
        ttlMs: params.ttlMs,
      });
      if (!result?.rollbackHandle) return undefined;
      return { rollback: () => proc.request("rollback", { handle: result.rollbackHandle }) };
    },
    async onSubagentEnded(params) {
      await proc.request("onSubagentEnded", { childSessionKey: params.childSessionKey, reason: params.reason });
    },
    async dispose() {
      // Engines are per logical turn in OpenClaw; the shared process outlives them.
    },
  };
  // Each call's own host model answers the summaries it asks for.
  for (const [name, method] of Object.entries(engine)) {
    if (typeof method === "function") engine[name] = (params) => proc.withHostModel(params, () => method(params));
  }
  return engine;
}

export default function register(api) {
  const proc = shared(api.pluginConfig);
  api.registerContextEngine(ENGINE_ID, () => createEngine(proc));
  if (typeof api.registerTool === "function") {
    let tools = [];
    try {
      tools = declaredTools(proc);
    } catch (error) {
      // The engine itself reports a missing binary on its first call; the recall tools wait.
      api.logger?.warn?.(String(error?.message ?? error));
    }
    proc.toolsRegistered = tools.length > 0;
    for (const tool of tools) {
      api.registerTool(
        (toolContext) => ({
          ...tool,
          async execute(_toolCallId, args) {
            // The tool reads the calling session's history (and what its grants allow).
            const scope = toolContext?.sessionId
              ? { sessionId: toolContext.sessionId, sessionKey: toolContext.sessionKey }
              : proc.lastSession ?? {};
            const result = await proc.request("tools/call", { name: tool.name, arguments: args ?? {}, ...scope });
            return { content: [{ type: "text", text: JSON.stringify(result) }], details: result };
          },
        }),
        { name: tool.name },
      );
    }
  }
}
