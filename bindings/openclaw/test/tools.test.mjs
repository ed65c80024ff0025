// The plugin registers the tools the engine itself lists (`tools/list` before `initialize`),
// not a copy of its own, and listing them opens no storage.
//   VILVONA_BIN=target/debug/vilvona node --test bindings/openclaw/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { declaredTools } from "../index.js";

const binary = process.env.VILVONA_BIN;

test("the tools come from the binary, once, and match the manifest's contracts", () => {
  assert.ok(binary, "set VILVONA_BIN to a built vilvona binary (.ci/run does)");
  const stateDir = mkdtempSync(join(tmpdir(), "vilvona-tools-"));
  const proc = { config: { binary, stateDir } };
  const tools = declaredTools(proc);
  const names = tools.map((tool) => tool.name).sort();
  assert.deepEqual(names, ["vilvona_describe", "vilvona_expand", "vilvona_expand_query", "vilvona_grep"]);
  for (const tool of tools) {
    assert.equal(tool.parameters.type, "object", tool.name);
    assert.ok(tool.description.length > 20, tool.name);
  }
  const grep = tools.find((tool) => tool.name === "vilvona_grep");
  assert.deepEqual(grep.parameters.required, ["query"]);
  // Listing opened no storage.
  assert.ok(!existsSync(join(stateDir, "agents")), readdirSync(stateDir).join(", "));
  // Asked once: the second call does not run anything.
  assert.equal(declaredTools(proc, () => assert.fail("ran the binary twice")), tools);
  // Every tool is declared in the manifest, as OpenClaw requires of registered tools.
  const here = dirname(fileURLToPath(import.meta.url));
  const manifest = JSON.parse(readFileSync(join(here, "..", "openclaw.plugin.json"), "utf8"));
  assert.deepEqual([...manifest.contracts.tools].sort(), names);
});

test("a binary that cannot list says why", () => {
  const proc = { config: { binary: "/bin/false", stateDir: tmpdir() } };
  assert.throws(() => declaredTools(proc), /could not list the engine's tools \(exit status 1\)/);
});
