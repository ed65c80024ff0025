// The plugin finds the vilvona executable without configuration: `binary`, VILVONA_BIN, the
// installed platform package, then PATH; and says everything it tried when nothing works.
//   node --test bindings/openclaw/test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { platformPackage, resolveBinary } from "../index.js";

function fakeBinary(dir, name = "vilvona") {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, name);
  writeFileSync(path, "#!/bin/sh\n");
  chmodSync(path, 0o755);
  return path;
}

const notInstalled = () => {
  throw new Error("Cannot find module");
};

test("the order is binary, VILVONA_BIN, the platform package, PATH", () => {
  const root = mkdtempSync(join(tmpdir(), "vilvona-resolve-"));
  const configured = fakeBinary(join(root, "configured"));
  const fromEnv = fakeBinary(join(root, "env"));
  const packageDir = join(root, "node_modules", platformPackage());
  const packaged = fakeBinary(join(packageDir, "bin"));
  writeFileSync(join(packageDir, "package.json"), "{}");
  const onPath = fakeBinary(join(root, "path"));
  const resolvePackage = (specifier) => {
    assert.equal(specifier, `${platformPackage()}/package.json`);
    return join(packageDir, "package.json");
  };
  const env = { VILVONA_BIN: fromEnv, PATH: join(root, "path") };
  assert.equal(resolveBinary({ binary: configured }, env, resolvePackage), configured);
  assert.equal(resolveBinary({}, env, resolvePackage), fromEnv);
  assert.equal(resolveBinary({}, { PATH: env.PATH }, resolvePackage), packaged);
  assert.equal(resolveBinary({}, { PATH: env.PATH }, notInstalled), onPath);
});

test("nothing found: one error naming every place tried", () => {
  const root = mkdtempSync(join(tmpdir(), "vilvona-resolve-"));
  const notExecutable = join(root, "vilvona");
  writeFileSync(notExecutable, "");
  assert.throws(
    () => resolveBinary({ binary: notExecutable }, { VILVONA_BIN: join(root, "missing"), PATH: root }, notInstalled),
    (error) => {
      const text = error.message;
      assert.match(text, /the plugin's `binary` setting: .*not executable/);
      assert.match(text, /VILVONA_BIN: .*missing/);
      assert.match(text, new RegExp(`the platform package ${platformPackage()}: not installed`));
      assert.match(text, /vilvona on PATH: not found/);
      return true;
    },
  );
});
