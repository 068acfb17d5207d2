/**
 * The one place native addons are loaded. In a development checkout they come from
 * node_modules. In the single binary (`build/sea.mjs`) they travel as SEA assets: on first use
 * they are extracted to `<cache>/flashd/native-<hash>/` (the hash of the assets, so a new build
 * never reuses an old file) and loaded from there. FLASHD_NATIVE_DIR names a directory that
 * holds them already and wins over both.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';

// In the CommonJS bundle of the binary, build/sea.mjs defines import.meta.url from __filename.
const require = createRequire(import.meta.url);

/** Addon files by name, as `build/sea.mjs` stores them in the binary. */
export const UWS_ADDON = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;
export const SQLITE_ADDON = 'better_sqlite3.node';
/** The SEA asset listing the addons and the hash of their contents. */
export const NATIVE_MANIFEST = 'native-manifest.json';

export interface NativeManifest {
  /** sha256 over every addon, hex; names the extraction directory. */
  hash: string;
  files: { name: string; sha256: string; bytes: number }[];
}

interface SeaModule {
  isSea(): boolean;
  getAsset(key: string): ArrayBuffer;
}

function seaModule(): SeaModule | undefined {
  try {
    // node:sea exists from Node 20.12; a plain checkout runs without it.
    const sea = require('node:sea') as SeaModule;
    return sea.isSea() ? sea : undefined;
  } catch {
    return undefined;
  }
}

function cacheRoot(): string {
  const xdg = process.env['XDG_CACHE_HOME'];
  if (xdg) return join(xdg, 'flashd');
  try {
    return join(homedir(), '.cache', 'flashd');
  } catch {
    return join(tmpdir(), 'flashd-cache');
  }
}

/** Writes each addon of the binary once per build; later starts find them in place. */
function extractSeaAddons(sea: SeaModule): string {
  const manifest = JSON.parse(Buffer.from(sea.getAsset(NATIVE_MANIFEST)).toString('utf8')) as NativeManifest;
  const dir = join(cacheRoot(), `native-${manifest.hash.slice(0, 16)}`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (const f of manifest.files) {
    const target = join(dir, f.name);
    if (existsSync(target) && statSync(target).size === f.bytes) continue;
    const bytes = Buffer.from(sea.getAsset(f.name));
    if (createHash('sha256').update(bytes).digest('hex') !== f.sha256) throw new Error(`native asset ${f.name} is corrupt`);
    // Write then rename, so a concurrent start never loads a half-written file.
    const partial = `${target}.${process.pid}.partial`;
    writeFileSync(partial, bytes, { mode: 0o700 });
    renameSync(partial, target);
  }
  return dir;
}

function loadAddon(file: string): unknown {
  try {
    return require(file);
  } catch (err) {
    throw new Error(`cannot load native addon ${file}: ${(err as Error).message}`, { cause: err });
  }
}

let resolvedDir: string | null | undefined;

/** Where addons come from: FLASHD_NATIVE_DIR, else the binary's extracted assets, else null (node_modules). */
export function nativeDir(): string | null {
  if (resolvedDir !== undefined) return resolvedDir;
  const fromEnv = process.env['FLASHD_NATIVE_DIR'];
  const sea = fromEnv ? undefined : seaModule();
  resolvedDir = fromEnv || (sea ? extractSeaAddons(sea) : null);
  return resolvedDir;
}

/** uWebSockets.js, always the native binary: the package's JS fallback is refused. */
export function loadUws(): typeof import('uWebSockets.js') {
  // Read by uWS builds that support it, before the addon initialises. The bundled v20.30 binary
  // does not: a header block over 4 KB split across reads closes the connection (README "Errors").
  process.env['UWS_HTTP_MAX_HEADERS_SIZE'] ??= '16384';
  const dir = nativeDir();
  if (dir) return loadAddon(join(dir, UWS_ADDON)) as typeof import('uWebSockets.js');
  const pkg = require.resolve('uWebSockets.js/package.json');
  return loadAddon(join(pkg, '..', 'binaries', UWS_ADDON)) as typeof import('uWebSockets.js');
}

/**
 * better-sqlite3's addon for its `nativeBinding` option, or undefined in a checkout, where
 * better-sqlite3 finds its own build under node_modules.
 */
export function sqliteNativeBinding(): object | undefined {
  const dir = nativeDir();
  return dir ? (loadAddon(join(dir, SQLITE_ADDON)) as object) : undefined;
}

