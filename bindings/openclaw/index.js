// vilvona for OpenClaw: a context-engine plugin that forwards every lifecycle call to a
// `vilvona serve --stdio` process over JSON-RPC 2.0 (one JSON object per line).
//
// The process starts lazily on first use (register() runs several times per OpenClaw process
// and must stay cheap), is shared by every engine instance of this process, and is restarted
// (and the call sent again) if it dies. Sets become arrays, an AbortSignal becomes `$/cancel`
// and the call rejects with the signal's own reason, a spawn rollback becomes a handle, and
// each call's own `runtimeContext.llm.complete` answers the server's `llm.complete` for it.
// OpenClaw gets one of three answers: a result, an abort, or a failure that means the engine
// cannot work (see DEGRADED, and ARCHITECTURE.md's table).

import { AsyncLocalStorage } from "node:async_hooks";
import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { createRequire } from "node:module";
import { randomUUID } from "node:crypto";
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

// `vilvona serve`'s error codes (crates/runtime/src/serve.rs). Only ENGINE_ERROR says the
// engine cannot work (OpenClaw then rightly quarantines it). A tool's error and "send the
// history" are answers to the call. Every other code (a parse error, invalid params, an
// unknown method, cancelled, not initialized, transient, the host's model failing) is about
// this call alone: transient, never a quarantine.
const ENGINE_ERROR = -32001;
const TOOL_ERROR = -32003;
const ANSWER_CODES = new Set([TOOL_ERROR, HISTORY_NEEDED]);

/** What a server error code is to the plugin: `broken`, an `answer`, or `transient`. */
export function errorKind(code) {
  if (code === ENGINE_ERROR) return "broken";
  return ANSWER_CODES.has(code) ? "answer" : "transient";
}

// How long a call may run unanswered before its process is taken as stuck (stopped, blocked on
// a dead disk, a lock that never frees): the process is killed and every call waiting on it is
// sent again to a new process (a call that had started fails as transient, and is retried; one
// still queued is simply sent again). A call's clock starts when the server starts it
// (`$/started`): one queued behind a long `maintain` of its session (`$/queued`) waits,
// timed only by a looser bound (QUEUED_AT_MOST_MS, or ten of its deadlines, past the
// deadlines of what is ahead). Until the server says either, the clock runs from the send (a
// process stopped before it read the call). While the host's model answers the call's
// `llm.complete`, its clock stops. Work that may wait on a summarizer gets longer.
// `callTimeoutMs` sets them: a number for every method, or per method (`default` for the rest).
const CALL_DEADLINES_MS = { default: 30_000, initialize: 60_000, compact: 600_000, maintain: 600_000, "tools/call": 120_000 };

export function callDeadlineMs(config, method) {
  const setting = config?.callTimeoutMs;
  if (typeof setting === "number") return setting;
  return setting?.[method] ?? setting?.default ?? CALL_DEADLINES_MS[method] ?? CALL_DEADLINES_MS.default;
}

// A call that failed for a passing reason (the process died, the store was busy) is sent
// again at most this many times, after these pauses.
const RETRY_PAUSES_MS = [100, 400];

// How often a call the lost process never began is sent again besides (it failed nothing).
const NOT_BEGUN_RESENDS = 3;

// How long a call may wait in its session's queue before the process is taken for stuck: past
// any long maintain ahead of it, but bounded (what is ahead may be a call nobody times any more,
// in a process wedged on it).
const QUEUED_AT_MOST_MS = 10 * 60_000;

/**
 * An error of one call, not of the engine: the process died under it, the store was busy, the
 * server was shutting down. The plugin retries it, answers without the work, or (for a turn's
 * own messages) fails only the call — OpenClaw must never quarantine the engine for it.
 */
export class TransientError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "VilvonaTransientError";
    this.transient = true;
  }
}

/**
 * What an aborted call rejects with: the signal's own reason, which OpenClaw recognises as the
 * abort it asked for (`isContextEngineAbortRejection`), never as the engine's failure.
 */
function abortReason(signal) {
  if (signal.reason !== undefined) return signal.reason;
  const error = new Error("The operation was aborted");
  error.name = "AbortError";
  return error;
}

/** `promise`, or the signal's reason as soon as it aborts. */
function abortable(promise, signal) {
  if (!signal) return promise;
  if (signal.aborted) return Promise.reject(abortReason(signal));
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortReason(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class VilvonaProcess {
  constructor(config) {
    this.config = config ?? {};
    this.child = null;
    this.nextId = 1;
    this.pending = new Map();
    this.ready = null;
    // The host's model of each request in flight, by request id: OpenClaw scopes
    // `runtimeContext.llm.complete` to the call it passes it to, and the server names the
    // request whose work asks for a summary (`scope`), so each summary is written by its own
    // call's model — never another session's, never one kept from an earlier run.
    this.llms = new Map();
    // The engine's tool definitions (declaredTools), once listed.
    this.tools = null;
    this.toolsRegistered = false;
    // Per session, the last assembled context as the engine numbered it (`revision`), and
    // whether the engine holds the session's history (then assemble leaves it out). Belongs
    // to one process: forgotten when it exits.
    this.assembled = new Map();
  }

  /**
   * `assemble` without re-sending what the engine already has: the host's history is left out
   * once the engine said it holds the session (and sent again if the engine needs it after
   * all), and the reply carries only the messages this process does not already hold.
   */
  async assemble(params, options) {
    const sessionId = params.sessionId;
    // Revisions are unique across server processes: after a restart the new one knows none
    // of them and answers whole.
    const base = this.assembled.get(sessionId);
    const request = { ...params, assembledRevision: base?.revision };
    let result;
    if (base?.holdsHistory) {
      try {
        result = await this.call("assemble", { ...request, messages: [], historyElided: true }, options);
      } catch (error) {
        if (error?.code !== HISTORY_NEEDED) throw error;
      }
    }
    result ??= await this.call("assemble", request, options);
    const { revision, held, holdsHistory, ...rest } = result;
    const messages = held ? rebuild(base.messages, held, rest.messages) : rest.messages;
    this.assembled.delete(sessionId);
    if (this.assembled.size >= ASSEMBLED_SESSIONS) this.assembled.delete(this.assembled.keys().next().value);
    if (revision !== undefined) this.assembled.set(sessionId, { revision, messages, holdsHistory: !!holdsHistory });
    return { ...rest, messages: messages.slice() };
  }

  /** Starts `vilvona serve --stdio`; a missing binary throws (the engine cannot work). */
  spawnChild() {
    const binary = resolveBinary(this.config);
    const env = { ...process.env };
    if (this.config.log) env.RUST_LOG = this.config.log;
    const child = spawn(binary, ["--state-dir", stateDirOf(this.config), "serve", "--stdio"], {
      stdio: ["pipe", "pipe", "inherit"],
      env,
    });
    this.child = child;
    // A write after the child died fails with EPIPE on its stdin: without a listener that is
    // an uncaught error that takes the whole gateway down. The exit handler settles the calls.
    child.stdin.on("error", () => {});
    // A child that exits by itself before it answered `initialize` cannot start (it said why
    // on stderr): that is a broken engine. Killed by a signal, or lost once it served, it is
    // a passing failure of the calls in flight.
    child.on("exit", (code, signal) => {
      const broken = signal === null && code !== 0 && !child.initialized;
      this.lost(child, `the vilvona process exited (${signal ?? `status ${code}`})${broken ? " before it started; see the gateway's log for its reason" : ""}`, !broken);
    });
    child.on("error", (error) => this.lost(child, `the vilvona process failed: ${error.message}`, false));
    createInterface({ input: child.stdout }).on("line", (line) => this.receive(child, line));
    return child;
  }

  /** The child is gone: every call waiting on it fails as transient, and what it held is forgotten. */
  lost(child, why, transient = true) {
    if (this.child !== child) return;
    this.child = null;
    this.ready = null;
    this.assembled.clear();
    // Each waiter's reject takes itself out of `pending` (and its model out of `llms`).
    for (const { reject } of [...this.pending.values()]) reject(transient ? new TransientError(`vilvona: ${why}`) : new Error(`vilvona: ${why}`));
  }

  /** `child` left a call unanswered past its deadline: it is killed, and every call waiting on it fails as transient. */
  stuck(child, why) {
    if (this.child !== child) return;
    try {
      child.kill("SIGKILL");
    } catch {
      // Gone already: its exit handler settles the calls.
    }
    const said = `${why}; the vilvona process was killed and is started again`;
    this.logger?.warn?.(`vilvona: ${said}`);
    this.lost(child, said);
  }

  /** A running, initialized child: started (again) when there is none, initialized (again) when the last try failed. */
  ensureReady() {
    if (!this.child) this.spawnChild();
    if (!this.ready) {
      const ready = this.send("initialize", {
        stateDir: stateDirOf(this.config),
        engineId: "lossless",
        config: this.config.engine ?? null,
      });
      const child = this.child;
      // A failed start is tried again on the next call, not remembered.
      ready.then(
        () => (child.initialized = true),
        () => {
          if (this.ready === ready) this.ready = null;
        },
      );
      this.ready = ready;
    }
    return this.ready;
  }

  receive(child, line) {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return;
    }
    if (message.method === "llm.complete" && message.id !== undefined) {
      this.answerLlm(child, message);
      return;
    }
    if (message.method === "$/queued" || message.method === "$/started") {
      const waiter = this.pending.get(message.params?.id);
      if (message.method === "$/queued") waiter?.queued();
      else waiter?.started();
      return;
    }
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    if (message.error) {
      const text = `vilvona: ${message.error.message}`;
      const error = errorKind(message.error.code) === "transient" ? new TransientError(text) : new Error(text);
      error.code = message.error.code;
      waiter.reject(error);
    } else {
      waiter.resolve(message.result);
    }
  }

  /** Answers the server's `llm.complete` with the model of the call it serves (`params.scope`). */
  async answerLlm(child, message) {
    const reply = (payload) => this.write(child, { jsonrpc: "2.0", id: message.id, ...payload });
    // The call is waiting on the host's model, not stuck: its clock stops until the answer is
    // sent, then starts again.
    const caller = this.pending.get(message.params?.scope);
    caller?.pause();
    const waiting = () => caller?.alive();
    const scope = this.llms.get(message.params?.scope);
    if (!scope) {
      waiting();
      reply({ error: { code: -32004, message: "no host model in scope: OpenClaw offers llm.complete only during the call it passes it to" } });
      return;
    }
    try {
      const { scope: _served, ...request } = message.params ?? {};
      const result = await scope.complete(request);
      const text =
        typeof result === "string"
          ? result
          : result?.text ?? (Array.isArray(result?.content) ? result.content.map((block) => block.text ?? "").join("\n") : "");
      waiting();
      reply({ result: { text } });
    } catch (error) {
      waiting();
      reply({ error: { code: -32004, message: String(error?.message ?? error) } });
    }
  }

  /** Writes one message to `child`; a child that is gone is its exit handler's business. */
  write(child, message) {
    if (!child || child.stdin.destroyed || !child.stdin.writable) return;
    try {
      child.stdin.write(JSON.stringify(message, jsonReplacer) + "\n");
    } catch {
      // The exit handler settles every call waiting on this child.
    }
  }

  /**
   * One request to the running child. With `signal`, an abort cancels it on the server and
   * rejects at once with the signal's reason; with `llm`, the server's `llm.complete` for
   * this request is answered by that model.
   */
  send(method, params, { signal, llm } = {}) {
    const child = this.child;
    if (!child) return Promise.reject(new TransientError("vilvona: the vilvona process is not running"));
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      let onAbort = null;
      let timer = null;
      const deadline = callDeadlineMs(this.config, method);
      // The clock: from the send until the server says the call waits or started; from the
      // start; stopped while the host's model answers it.
      const alive = () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.stuck(child, `no answer to ${method} within ${deadline} ms of its start`), deadline);
        timer.unref?.();
      };
      const pause = () => clearTimeout(timer);
      const entry = {
        begun: false,
        alive,
        pause,
        queued: () => {
          if (entry.begun) return;
          clearTimeout(timer);
          const waited = Math.max(QUEUED_AT_MOST_MS, 10 * deadline);
          timer = setTimeout(() => this.stuck(child, `${method} waited ${waited} ms in its session's queue without starting`), waited);
          timer.unref?.();
        },
        started: () => {
          entry.begun = true;
          alive();
        },
      };
      const settle = (finish) => (value) => {
        if (!this.pending.has(id)) return;
        this.pending.delete(id);
        this.llms.delete(id);
        clearTimeout(timer);
        if (onAbort) signal.removeEventListener("abort", onAbort);
        finish(value);
      };
      entry.resolve = settle(resolve);
      entry.reject = (error) => {
        // A call the stuck process never began fails only to be sent again.
        if (error?.transient && !entry.begun) error.notBegun = true;
        settle(reject)(error);
      };
      this.pending.set(id, entry);
      alive();
      if (llm) this.llms.set(id, llm);
      if (signal) {
        onAbort = () => {
          this.write(child, { jsonrpc: "2.0", method: "$/cancel", params: { id } });
          settle(reject)(abortReason(signal));
        };
        signal.addEventListener("abort", onAbort, { once: true });
      }
      // Whether this call brought the host's model: without it the server does not ask, and
      // a routine fold waits for a call that brings one.
      this.write(child, { jsonrpc: "2.0", id, method, params, hostModel: Boolean(llm) });
    });
  }

  /**
   * A call as the engine's methods make it: the child started (again) if needed, a transient
   * failure sent again after a pause (a bounded number of times), an abort rejected with the
   * signal's own reason whenever it comes.
   */
  async call(method, params, { signal, llm } = {}) {
    // A call the lost process never began (queued there) is sent again without counting as a
    // failed attempt, a few times at most.
    let resent = 0;
    for (let attempt = 0; ; attempt++) {
      try {
        await abortable(this.ensureReady(), signal);
        return await this.send(method, params, { signal, llm });
      } catch (error) {
        if (signal?.aborted) throw abortReason(signal);
        if (error?.notBegun && resent < NOT_BEGUN_RESENDS) {
          resent += 1;
          attempt -= 1;
          continue;
        }
        if (!error?.transient || attempt >= RETRY_PAUSES_MS.length) throw error;
        await abortable(pause(RETRY_PAUSES_MS[attempt]), signal);
      }
    }
  }

  /** A call from outside the engine's methods (tests, tools). */
  async request(method, params, signal) {
    return this.call(method, params, { signal });
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

/**
 * `vilvona ui` beside the engine, for the Control UI panel: started on the first request, its
 * URL and token read from its first line, started again if it exits. It reads the store
 * read-only, so it never competes with `serve` for the writer's lock.
 */
export class UiServer {
  constructor(config) {
    this.config = config;
    this.started = null;
  }

  /** The running server; a start that failed is tried again on the next call, not remembered. */
  start() {
    if (this.started) return this.started;
    const started = new Promise((resolve, reject) => {
      // Repairs allowed: the gateway lets only operator.write connections ask for one. Its
      // stdin is this process's: when the gateway ends, however it ends, the server does too.
      const child = spawn(resolveBinary(this.config), ["--state-dir", stateDirOf(this.config), "ui", "--port", "0", "--allow-repair", "--exit-with-stdin"], {
        stdio: ["pipe", "pipe", "inherit"],
      });
      child.stdin.on("error", () => {});
      const lines = createInterface({ input: child.stdout });
      lines.once("line", (line) => {
        const url = new URL(line.replace(/^vilvona ui: /, ""));
        // Once it serves, the panel's server never keeps the gateway from ending.
        child.unref();
        child.stdout.unref?.();
        child.stdin.unref?.();
        resolve({ child, origin: url.origin, token: new URLSearchParams(url.hash.slice(1)).get("token") });
      });
      child.once("error", reject);
      child.once("exit", (code, signal) => {
        if (this.started === started) this.started = null;
        reject(new Error(`vilvona ui exited (${signal ?? `status ${code}`}) before it served`));
      });
    });
    this.started = started;
    started.catch(() => {
      if (this.started === started) this.started = null;
    });
    return started;
  }

  /** One view (crates/cli/src/views.rs), as `vilvona ui` answers it. */
  view(payload) {
    return this.post("/api/view", payload);
  }

  /** A repair's preview, or the repair when `confirm` is true. */
  repair(payload) {
    return this.post("/api/repair", payload);
  }

  async post(path, payload) {
    const { origin, token } = await this.start();
    const response = await fetch(`${origin}${path}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
      body: JSON.stringify(payload),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer?.error ?? `vilvona ui answered HTTP ${response.status}`);
    return answer;
  }
}

/**
 * What OpenClaw 2026.9.6 accepts as a session action's result (`isPluginJsonValue`): at most
 * 4,096 JSON values, objects of at most 512 keys, 32 levels, strings of at most 65,536
 * characters, 256 KiB serialized. A long session's DAG has more values than that; an expanded
 * tool output, a longer string.
 */
const OPENCLAW_RESULT = { values: 4096, keys: 512, depth: 32, stringChars: 65536, bytes: 262144 };

/** Whether OpenClaw will carry `value` as a session action's result (the limits above). */
export function withinOpenClaw(value) {
  let values = 0;
  const fits = (next, depth) => {
    values += 1;
    if (values > OPENCLAW_RESULT.values || depth > OPENCLAW_RESULT.depth) return false;
    if (typeof next === "string") return next.length <= OPENCLAW_RESULT.stringChars;
    if (typeof next === "number") return Number.isFinite(next);
    if (next === null || typeof next !== "object") return typeof next === "boolean" || next === null;
    const entries = Object.entries(next);
    return (Array.isArray(next) || entries.length <= OPENCLAW_RESULT.keys)
      && entries.every(([key, entry]) => key.length <= OPENCLAW_RESULT.stringChars && fits(entry, depth + 1));
  };
  return fits(value, 0) && Buffer.byteLength(JSON.stringify(value), "utf8") <= OPENCLAW_RESULT.bytes;
}

/**
 * A view as OpenClaw will carry it: as it is when it fits, else as its JSON text in pieces
 * the panel joins (a few values, up to ~256 KiB of text). A view larger than that is refused
 * with its size named, not by OpenClaw's "must be JSON-compatible".
 */
export function fitForOpenClaw(view) {
  if (withinOpenClaw({ ok: true, result: view })) return view;
  const text = JSON.stringify(view);
  // Half the string limit: escaping the text's quotes and backslashes may double it.
  const piece = OPENCLAW_RESULT.stringChars / 2;
  const jsonPieces = [];
  for (let at = 0; at < text.length; at += piece) jsonPieces.push(text.slice(at, at + piece));
  const carried = { jsonPieces };
  if (!withinOpenClaw({ ok: true, result: carried })) {
    const kib = Math.ceil(Buffer.byteLength(JSON.stringify(carried), "utf8") / 1024);
    throw new Error(`this view is ${kib} KiB of JSON; OpenClaw carries at most ${OPENCLAW_RESULT.bytes / 1024} KiB from a plugin's action`);
  }
  return carried;
}

/** The views the panel may ask of its own session (never another session's, never the list). */
const PANEL_VIEWS = new Set(["context", "stats", "dag", "timeline", "history", "grep", "expand", "describe", "health", "watch"]);

/**
 * The Control UI panel's backend, answered by `vilvona ui`: `view` (operator.read) reads the
 * session the panel is open on; `repair` (operator.write) previews, then on confirmation runs,
 * a rebuild of the recall index or a re-summarizing of the session's truncated summaries.
 */
export function registerPanelAction(api, ui) {
  const controls = api.session?.controls ?? api;
  if (typeof controls.registerSessionAction !== "function") return false;
  controls.registerSessionAction({
    id: "view",
    description: "What vilvona holds of this session: the context against the window, the summary DAG, search, the store's health.",
    schema: { type: "object", properties: { view: { type: "string" } }, required: ["view"], additionalProperties: true },
    requiredScopes: ["operator.read"],
    async handler(action) {
      const payload = action?.payload ?? {};
      if (!PANEL_VIEWS.has(payload.view)) return { ok: false, error: `vilvona: unknown view "${payload.view}"` };
      if (!action?.sessionKey) return { ok: false, error: "vilvona: the panel names no session" };
      try {
        return { ok: true, result: fitForOpenClaw(await ui.view({ ...payload, session: action.sessionKey })) };
      } catch (error) {
        return { ok: false, error: String(error?.message ?? error) };
      }
    },
  });
  controls.registerSessionAction({
    id: "repair",
    description: "Repair vilvona's store: rebuild the recall index from the database, or re-summarize this session's truncated summaries; a preview first, then the repair when confirmed.",
    schema: {
      type: "object",
      properties: { repair: { enum: ["rebuild-index", "resummarize"] }, confirm: { type: "boolean" }, session: { type: "string" } },
      required: ["repair"],
      additionalProperties: false,
    },
    requiredScopes: ["operator.write"],
    async handler(action) {
      if (!action?.sessionKey) return { ok: false, error: "vilvona: the panel names no session" };
      try {
        // The panel's own session, whatever the payload names.
        return { ok: true, result: await ui.repair({ ...(action?.payload ?? {}), session: action.sessionKey }) };
      } catch (error) {
        return { ok: false, error: String(error?.message ?? error) };
      }
    },
  });
  return true;
}

function shared(config) {
  globalThis[SHARED] ??= new VilvonaProcess(config);
  return globalThis[SHARED];
}

function session(params) {
  return { sessionId: params.sessionId, sessionKey: params.sessionKey };
}

/**
 * The host's model a call brings (`runtimeContext.llm`), bound to it and to the call's async
 * context; none when it brings none. OpenClaw tracks a call's async work in its async context
 * and closes it when the call settles: a completion started from elsewhere (the child's output
 * handler runs in the context of whichever call started the child) fails with "Async work scope
 * is closed", so the model is asked from inside the context of the call it belongs to.
 */
function hostModel(params) {
  const llm = params?.runtimeContext?.llm;
  if (typeof llm?.complete !== "function") return undefined;
  const inCallContext = AsyncLocalStorage.snapshot();
  return { complete: (request) => inCallContext(() => llm.complete(request)) };
}

/** What a call sends along besides its parameters: its abort signal and its own host model. */
function options(params) {
  return { signal: params?.abortSignal, llm: hostModel(params) };
}

/** A rough count of a message list's tokens (characters / 4), for an answer made without the engine. */
function roughTokens(messages) {
  return Math.ceil(JSON.stringify(messages ?? [], jsonReplacer).length / 4);
}

/**
 * How each method answers OpenClaw when its call failed for a passing reason
 * (`TransientError`, after the retries): without the work, saying why — never a rejection
 * that OpenClaw would count as the engine's failure and quarantine it for. `null`: the call
 * rejects (a turn's messages must not be acknowledged unless stored; OpenClaw keeps the turn
 * queued and delivers it again).
 */
const DEGRADED = {
  bootstrap: (why) => ({ bootstrapped: false, reason: why }),
  assemble: (why, params) => ({ messages: params.messages ?? [], estimatedTokens: roughTokens(params.messages) }),
  afterTurn: () => undefined,
  compact: (why) => ({ ok: true, compacted: false, reason: why }),
  maintain: (why) => ({ changed: false, bytesFreed: 0, rewrittenEntries: 0, reason: why }),
  prepareSubagentSpawn: () => undefined,
  onSubagentEnded: () => undefined,
  commitTurn: null,
  ingest: null,
  ingestBatch: null,
};

function createEngine(proc, logger) {
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
      return proc.call("bootstrap", { ...session(params), sessionFile: typeof params.sessionFile === "string" ? params.sessionFile : undefined }, options(params));
    },
    // A call sent again after its process died stores nothing twice: a message the host gives
    // no entry id gets one for this call, the same on every retry of it.
    async ingest(params) {
      const entryId = params.entryId ?? `call:${randomUUID()}`;
      return proc.call("ingest", { ...session(params), message: params.message, entryId, isHeartbeat: !!params.isHeartbeat }, options(params));
    },
    async ingestBatch(params) {
      const call = randomUUID();
      const entryIds = params.messages.map((_, index) => params.entryIds?.[index] ?? `call:${call}:${index}`);
      return proc.call("ingestBatch", { ...session(params), messages: params.messages, entryIds, isHeartbeat: !!params.isHeartbeat }, options(params));
    },
    async afterTurn(params) {
      await proc.call(
        "afterTurn",
        {
          ...session(params),
          messages: params.messages,
          prePromptMessageCount: params.prePromptMessageCount ?? 0,
          tokenBudget: params.tokenBudget,
          isHeartbeat: !!params.isHeartbeat,
          runtimeSettings: limits(params),
        },
        options(params),
      );
    },
    async assemble(params) {
      const model = typeof params.model === "string" ? params.model : params.model?.id;
      return proc.assemble(
        {
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
        },
        options(params),
      );
    },
    async commitTurn(params) {
      return proc.call(
        "commitTurn",
        {
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
        },
        options(params),
      );
    },
    async compact(params) {
      return proc.call(
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
        options(params),
      );
    },
    async maintain(params) {
      return proc.call(
        "maintain",
        { ...session(params), reason: MAINTAIN_REASONS.has(params.reason) ? params.reason : undefined, tokenBudget: params.tokenBudget, runtimeSettings: limits(params) },
        options(params),
      );
    },
    async prepareSubagentSpawn(params) {
      const result = await proc.call(
        "prepareSubagentSpawn",
        {
          parentSessionKey: params.parentSessionKey,
          childSessionKey: params.childSessionKey,
          contextMode: params.contextMode,
          parentSessionId: params.parentSessionId,
          parentSessionFile: typeof params.parentSessionFile === "string" ? params.parentSessionFile : undefined,
          childSessionId: params.childSessionId,
          childSessionFile: typeof params.childSessionFile === "string" ? params.childSessionFile : undefined,
          ttlMs: params.ttlMs,
        },
        options(params),
      );
      if (!result?.rollbackHandle) return undefined;
      // The handle lives in the process's memory: a process started since rolls back by the
      // child's key.
      return { rollback: () => proc.call("rollback", { handle: result.rollbackHandle, childSessionKey: params.childSessionKey }) };
    },
    async onSubagentEnded(params) {
      await proc.call("onSubagentEnded", { childSessionKey: params.childSessionKey, reason: params.reason }, options(params));
    },
    async dispose() {
      // Engines are per logical turn in OpenClaw; the shared process outlives them.
    },
  };
  // The three answers OpenClaw may get: a result, an abort (the signal's own reason), or a
  // failure that means the engine cannot work. A passing failure becomes a result that says
  // why (DEGRADED), or, for a turn's messages, a rejection of that call alone.
  for (const [name, method] of Object.entries(engine)) {
    const degraded = DEGRADED[name];
    if (typeof method !== "function" || !degraded) continue;
    engine[name] = async (params) => {
      try {
        return await method(params);
      } catch (error) {
        if (!error?.transient || params?.abortSignal?.aborted) throw error;
        const why = `${error.message} (answered without the engine's work; the next call tries again)`;
        logger?.warn?.(`vilvona: ${name}: ${why}`);
        return degraded(why, params);
      }
    };
  }
  return engine;
}

/** Whether OpenClaw's config selects this engine (a host that shows no config: assumed so). */
function selectsVilvona(config) {
  return config === undefined || config?.plugins?.slots?.contextEngine === ENGINE_ID;
}

export default function register(api) {
  const proc = shared(api.pluginConfig);
  proc.logger ??= api.logger;
  api.registerContextEngine(ENGINE_ID, () => createEngine(proc, api.logger));
  proc.ui ??= new UiServer(proc.config);
  try {
    registerPanelAction(api, proc.ui);
  } catch (error) {
    // The panel is an extra: a host whose plugin UI API differs still gets the engine.
    api.logger?.warn?.(`vilvona: the Control UI panel's action could not be registered: ${error?.message ?? error}`);
  }
  // OpenClaw's `/new` and `/reset` keep the session id and start a new window of its
  // transcript: the engine sets the session's earlier history aside, so the next assembly
  // holds nothing of it (the hook is observed, not awaited: a failure is logged).
  if (typeof api.on === "function" && selectsVilvona(api.config)) {
    api.on("before_reset", async (event, context) => {
      if (typeof context?.sessionId !== "string") return;
      proc.assembled.delete(context.sessionId);
      try {
        await proc.call("onSessionReset", { sessionId: context.sessionId, sessionKey: context.sessionKey, reason: event?.reason });
      } catch (error) {
        api.logger?.warn?.(`vilvona: the session ${context.sessionId} was reset, and its earlier history could not be set aside: ${error?.message ?? error}`);
      }
    });
  }
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
          async execute(_toolCallId, args, signal) {
            // The tool reads the calling session's history (and what its grants allow); a
            // call that names no session reads nothing rather than another session's.
            if (!toolContext?.sessionId) {
              throw new Error(`vilvona: ${tool.name} was called without a session; OpenClaw names the session of every agent run`);
            }
            const scope = { sessionId: toolContext.sessionId, sessionKey: toolContext.sessionKey };
            const result = await proc.call("tools/call", { name: tool.name, arguments: args ?? {}, ...scope }, { signal: signal instanceof AbortSignal ? signal : undefined });
            return { content: [{ type: "text", text: JSON.stringify(result) }], details: result };
          },
        }),
        { name: tool.name },
      );
    }
  }
}
