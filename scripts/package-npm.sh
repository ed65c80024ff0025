#!/usr/bin/env bash
# Packs vilvona for npm: the OpenClaw plugin and the platform package that carries the binary
# for this machine, both at the workspace's version, into target/npm/.
#
#   scripts/package-npm.sh                      # builds the shipped binary (cargo profile dist)
#   VILVONA_PACKAGE_BINARY=path scripts/package-npm.sh   # packs that binary instead
#
# bindings/npm/platforms.json lists every platform package; the plugin names each one marked
# "built" as an optional dependency at the same version (npm installs the one whose `os` and
# `cpu` match). Nothing downloads anything at install time.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/target/npm"
VERSION=$(cargo metadata --no-deps --format-version 1 --manifest-path "$ROOT/Cargo.toml" \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).packages.find(p=>p.name==="vilvona").version))')
UNAME="$(uname -s) $(uname -m)"
PLATFORM=$(node -e '
  const platforms = require(process.argv[1]);
  const found = platforms.find((p) => p.uname === process.argv[2]);
  if (!found) { console.error(`no platform package for ${process.argv[2]}`); process.exit(1); }
  console.log(JSON.stringify(found));' "$ROOT/bindings/npm/platforms.json" "$UNAME")
PACKAGE=$(node -e 'console.log(JSON.parse(process.argv[1]).package)' "$PLATFORM")

BINARY="${VILVONA_PACKAGE_BINARY:-}"
if [ -z "$BINARY" ]; then
  echo "package-npm: building the shipped binary (profile dist)" >&2
  cargo build --profile dist -p vilvona --manifest-path "$ROOT/Cargo.toml"
  BINARY="$ROOT/target/dist/vilvona"
fi
[ -x "$BINARY" ] || { echo "package-npm: $BINARY is not an executable" >&2; exit 1; }
"$BINARY" --version >/dev/null || { echo "package-npm: $BINARY does not run" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/stage/plugin" "$OUT/stage/cli/bin"

# The platform package: the executable, declared for its os and cpu.
cp "$BINARY" "$OUT/stage/cli/bin/vilvona"
chmod 755 "$OUT/stage/cli/bin/vilvona"
node -e '
  const [platform, version, out] = [JSON.parse(process.argv[1]), process.argv[2], process.argv[3]];
  const manifest = {
    name: platform.package,
    version,
    description: `The vilvona executable for ${platform.os}-${platform.cpu} (used by @vilvona/openclaw-plugin).`,
    license: "MIT OR Apache-2.0",
    os: [platform.os],
    cpu: [platform.cpu],
    files: ["bin/"],
    preferUnplugged: true,
  };
  require("fs").writeFileSync(`${out}/package.json`, JSON.stringify(manifest, null, 2) + "\n");
' "$PLATFORM" "$VERSION" "$OUT/stage/cli"

# The plugin: its files, the version, and the platform packages as optional dependencies.
cp "$ROOT/bindings/openclaw/index.js" "$ROOT/bindings/openclaw/openclaw.plugin.json" "$OUT/stage/plugin/"
mkdir -p "$OUT/stage/plugin/dist" && cp -r "$ROOT/bindings/openclaw/dist/control-ui" "$OUT/stage/plugin/dist/"
node -e '
  const fs = require("fs");
  const [source, platformsFile, version, out] = process.argv.slice(1);
  const manifest = JSON.parse(fs.readFileSync(source, "utf8"));
  manifest.version = version;
  manifest.optionalDependencies = Object.fromEntries(
    JSON.parse(fs.readFileSync(platformsFile, "utf8"))
      .filter((p) => p.built)
      .map((p) => [p.package, version]),
  );
  fs.writeFileSync(`${out}/package.json`, JSON.stringify(manifest, null, 2) + "\n");
' "$ROOT/bindings/openclaw/package.json" "$ROOT/bindings/npm/platforms.json" "$VERSION" "$OUT/stage/plugin"

# The platform package is the binary, compressed (~20 s for a debug build): one packed from the
# same files (the binary's bytes and the manifest, by their SHA-256) is taken from the last run
# instead of packed again — the soak matrix packs the same binary for every cell.
CACHE_DIR="$ROOT/target/npm-packed"
KEY=$(cd "$OUT/stage/cli" && sha256sum bin/vilvona package.json | sha256sum | cut -d' ' -f1)
(cd "$OUT/stage/plugin" && npm pack --silent --pack-destination "$OUT" >/dev/null)
if [ -f "$CACHE_DIR/$KEY.tgz" ]; then
  cp "$CACHE_DIR/$KEY.tgz" "$OUT/$(cat "$CACHE_DIR/$KEY.name")"
else
  NAME=$(cd "$OUT/stage/cli" && npm pack --silent --pack-destination "$OUT")
  rm -rf "$CACHE_DIR" && mkdir -p "$CACHE_DIR"
  cp "$OUT/$NAME" "$CACHE_DIR/$KEY.tgz" && echo "$NAME" >"$CACHE_DIR/$KEY.name"
fi
ls "$OUT"/*.tgz
echo "package-npm: $PACKAGE and the plugin at $VERSION ($(du -h "$OUT/stage/cli/bin/vilvona" | cut -f1) binary)" >&2
