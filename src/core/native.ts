/**
 * The one place native addons are loaded. In a development checkout they come from
 * node_modules. In the single binary (`build/sea.mjs`) they travel as SEA assets: on first use
 * they are extracted to `<cache>/flashd/native-<hash>/` (the hash of the assets, so a new build
 * never reuses an old file; `<tmpdir>/flashd-<uid>/native-<hash>/` when the cache cannot be
 * written, see cacheRoots) and loaded from there. FLASHD_NATIVE_DIR names a directory that
 * holds them already and wins over both.
 */
import { createHash } from 'node:crypto';
import { accessSync, chmodSync, closeSync, constants, existsSync, lstatSync, mkdirSync, openSync, readFileSync, readSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { mkdirs } from './data-dir.js';

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

/**
 * Where flashd may keep its cache, in order: `$XDG_CACHE_HOME/flashd` (else `~/.cache/flashd`),
 * then `<tmpdir>/flashd-<uid>` for a user without a writable home (nobody, `useradd -r`,
 * systemd `ProtectHome=`/`DynamicUser=`). The second is `perUid`: made 0700 and used only if
 * that uid owns it, since any local user can create names in the temp dir.
 */
function cacheRoots(): { dir: string; perUid: boolean }[] {
  const roots: { dir: string; perUid: boolean }[] = [];
  const xdg = process.env['XDG_CACHE_HOME'];
  if (xdg) roots.push({ dir: join(xdg, 'flashd'), perUid: false });
  else {
    try {
      roots.push({ dir: join(homedir(), '.cache', 'flashd'), perUid: false });
    } catch {
      // No home directory at all: only the temp dir is left.
    }
  }
  roots.push({ dir: join(tmpdir(), `flashd-${process.getuid?.() ?? 'user'}`), perUid: true });
  return roots;
}

/**
 * Makes `dir` (0700) if missing and checks it is a directory (not a link) of flashd's user that
 * no one else may write: another user could otherwise swap an addon between its check and its
 * load. One of flashd's own with a looser mode is made 0700.
 */
function ownDir(dir: string): void {
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const st = lstatSync(dir);
  if (!st.isDirectory()) throw new Error('not a directory');
  const me = process.getuid?.();
  if (me === undefined) return;
  if (st.uid !== me) throw new Error(`owned by uid ${st.uid}, not by flashd's user (uid ${me})`);
  if ((st.mode & 0o077) !== 0) chmodSync(dir, 0o700);
}

/**
 * `fill(dir)` with `dir` = `<root>/<name>` in the first cache root where it succeeds (see
 * cacheRoots). Throws naming each place tried and why (`/x/native-… (EACCES)`), in one line.
 */
function inCache<T>(name: string, fill: (dir: string) => T): T {
  const tried: string[] = [];
  for (const root of cacheRoots()) {
    const dir = join(root.dir, name);
    try {
      if (root.perUid) ownDir(root.dir);
      else mkdirs(root.dir, 0o700);
      ownDir(dir);
      accessSync(dir, constants.W_OK | constants.X_OK);
      return fill(dir);
    } catch (err) {
      tried.push(`${dir} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
    }
  }
  throw new Error(tried.join(' or '));
}

function sha256File(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}

/**
 * Writes each addon of the binary once per build; later starts find them in place, and use a
 * file there only if its sha256 is the manifest's (the size alone would load a damaged or
 * planted file).
 */
function extractSeaAddons(sea: SeaModule): string {
  const manifest = JSON.parse(Buffer.from(sea.getAsset(NATIVE_MANIFEST)).toString('utf8')) as NativeManifest;
  try {
    return inCache(`native-${manifest.hash.slice(0, 16)}`, (dir) => {
      for (const f of manifest.files) {
        const target = join(dir, f.name);
        if (existsSync(target) && statSync(target).size === f.bytes && sha256File(target) === f.sha256) continue;
        const bytes = Buffer.from(sea.getAsset(f.name));
        if (createHash('sha256').update(bytes).digest('hex') !== f.sha256) throw new Error(`native asset ${f.name} is corrupt`);
        // Write then rename, so a concurrent start never loads a half-written file.
        const partial = `${target}.${process.pid}.partial`;
        writeFileSync(partial, bytes, { mode: 0o700 });
        renameSync(partial, target);
      }
      return dir;
    });
  } catch (err) {
    throw new Error(`cannot unpack native addons to ${(err as Error).message}; set XDG_CACHE_HOME or FLASHD_NATIVE_DIR to a writable directory`);
  }
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

/**
 * The bundled uWS v20.30 keeps at most 4 KB of a request's header block between two reads
 * (HttpParser's MAX_FALLBACK_SIZE): a request line plus headers over 4 KB that arrives in more
 * than one TCP read gets its connection closed with no reply. runpod-python's ping lists every
 * job in progress in its query: a flashd job id is 39 characters and `requests` encodes the
 * comma as %2C, so 42 bytes a job, and a worker with ~90 jobs or more sends such requests,
 * which a real network splits into segments. That binary reads no environment variable for the
 * limit (it has no UWS_HTTP_MAX_HEADERS_SIZE; later uWS builds do, and they need glibc 2.38).
 * The limit is a per-connection member that one instruction in each of the two socket-open
 * handlers (plain and TLS) sets: `movq $0x1000, disp32(%rdi)`. Raising that immediate is all
 * the later env-var builds do too. 128 KiB holds a ping listing ~3,100 jobs (16 KB held ~380:
 * worker-vllm's default concurrency is 300 and users raise it), and runpod-python's largest:
 * 1.10.1+ keeps the ids for its ping process in a 64 KB buffer, 1,638 flashd ids, a ~69 KB
 * header block. The buffer is a std::string, so a connection only uses what its split header
 * block needs, but: it grows by doubling (a block that arrives in small pieces can reserve up
 * to ~2× the limit, 256 KiB), it is cleared but not freed after the request (a keep-alive
 * connection keeps it), and each read re-parses it from the start. A client that sends an
 * incomplete block slowly is still closed 60–64 s after the connection opened or last got a
 * reply (more bytes do not extend it; see UWS_IDLE_TICKS), so one pins at most ~256 KiB for
 * ~64 s. Only a binary whose size, sha256 and bytes at those sites are exactly the known ones
 * is patched; anything else loads as it is.
 */
export const UWS_SPLIT_HEADER_LIMIT = 128 * 1024;
/**
 * The same binary closes a keep-alive connection 8–12 s after its last response (its
 * HTTP_IDLE_TIMEOUT_S and HTTP_TIMEOUT_S, both 10 s). aiohttp, and so runpod-python, keeps an
 * idle connection for 15 s: a sync handler that runs 10–15 s blocks the worker's event loop, so
 * the SDK never sees the close and posts its result on the dead connection ("Broken pipe"; the
 * SDK drops the result and the job runs again). uSockets keeps timeouts in 4 s ticks, as
 * `(seconds + 3) >> 2` ticks past the loop's timestamp byte, mod 240; with the constant 10 the
 * compiler folded that into an `add $3` before and after a division by 240 (`imul $0x8889` …
 * `imul $0xf0` … `neg`, `add`), at each of the 20 places that set an HTTP socket's timeout
 * (plain and TLS: socket open, request data, body data, writable, res.write/cork/resume).
 * Raising both immediates to UWS_IDLE_TICKS makes every one of them 60–64 s: the idle wait
 * after a response, the wait for a first request, and the stalled-body and stalled-write
 * limits (nginx waits 60–75 s for these).
 */
export const UWS_IDLE_TICKS = 16;
/** What UWS_IDLE_TICKS means in seconds (at least; at most 4 more). */
export const UWS_IDLE_TIMEOUT_S = (UWS_IDLE_TICKS - 1) * 4;
interface UwsPatch {
  bytes: number;
  sha256: string;
  /** File offsets of the `movq $0x1000, disp32(%rdi)` instructions (48 c7 87 disp32 imm32). */
  sites: number[];
  /**
   * File offsets of the folded timeout sequences: `add $3,r` (83 c0+r 03), `imul $0x8889`,
   * `shr $0x17`, `imul $0xf0`, `neg`, `add r,r`, `add $3,r` (the second imm8 at +24).
   */
  idleSites: number[];
}
const UWS_PATCHES: Record<string, UwsPatch> = {
  // @trufflesuite/uws-js-unofficial 20.30.0-unofficial.0, binaries/uws_linux_x64_115.node:
  // HttpContext<true>::init() and HttpContext<false>::init() on-open lambdas.
  'uws_linux_x64_115.node': {
    bytes: 6845264,
    sha256: 'f158fb441f7e2e37b3ab9a56782fe37f4c0d33b5cd32e96ee5c0120ce7db7ced',
    sites: [0xe98d7, 0xf90e4],
    idleSites: [
      0xe51ec, 0xe549b, 0xe9882, 0xe9ca3, 0xea086, 0xea33e, 0xea411, 0xf678c, 0xf6a3b, 0xf9092,
      0xf9489, 0xf9815, 0xf9a78, 0xf9b41, 0x102765, 0x103bf6, 0x10486d, 0x105e35, 0x1072c6, 0x107f2d,
    ],
  },
};

/** The limit in force for a header block split across reads (4096 unless the patch applied). */
export let uwsSplitHeaderLimit = 4096;
/** How long an idle HTTP connection is kept, at least (8 unless the patch applied). */
export let uwsIdleTimeoutS = 8;
/** Why the patch did not apply (null when it did). */
export let uwsPatchSkipped: string | null = null;

/** Whether `b` holds the folded 10 s timeout sequence at `at` (see UWS_IDLE_TICKS), with `ticks` in it. */
function idleSequence(b: Buffer, at: number, ticks: number): boolean {
  const reg = (x: number | undefined, base: number) => x !== undefined && x >= base && x < base + 8;
  return b[at] === 0x83 && reg(b[at + 1], 0xc0) && b[at + 2] === ticks && b[at + 3] === 0x69 && b.readUInt32LE(at + 5) === 0x8889 &&
    b[at + 9] === 0xc1 && b[at + 11] === 0x17 && b[at + 12] === 0x69 && b.readUInt32LE(at + 14) === 0xf0 && b[at + 18] === 0xf7 &&
    b[at + 20] === 0x01 && b[at + 22] === 0x83 && reg(b[at + 23], 0xc0) && b[at + 24] === ticks;
}

/**
 * `original` with the split-header limit raised to UWS_SPLIT_HEADER_LIMIT and the HTTP
 * timeouts to UWS_IDLE_TICKS, or null if it is not the known binary.
 */
export function patchUwsAddon(name: string, original: Buffer): Buffer | null {
  const p = UWS_PATCHES[name];
  if (!p || original.length !== p.bytes) return null;
  if (createHash('sha256').update(original).digest('hex') !== p.sha256) return null;
  const out = Buffer.from(original);
  for (const at of p.sites) {
    if (out[at] !== 0x48 || out[at + 1] !== 0xc7 || out[at + 2] !== 0x87 || out.readUInt32LE(at + 7) !== 4096) return null;
    out.writeUInt32LE(UWS_SPLIT_HEADER_LIMIT, at + 7);
  }
  for (const at of p.idleSites) {
    if (!idleSequence(out, at, 3)) return null;
    out[at + 2] = UWS_IDLE_TICKS;
    out[at + 24] = UWS_IDLE_TICKS;
  }
  return out;
}

/** Bytes at the patch sites of a file, without reading all of it. */
function sitesPatched(file: string, p: UwsPatch): boolean {
  const fd = openSync(file, 'r');
  try {
    const b = Buffer.alloc(25);
    return p.sites.every((at) => readSync(fd, b, 0, 4, at + 7) === 4 && b.readUInt32LE(0) === UWS_SPLIT_HEADER_LIMIT) &&
      p.idleSites.every((at) => readSync(fd, b, 0, 25, at) === 25 && idleSequence(b, 0, UWS_IDLE_TICKS));
  } finally {
    closeSync(fd);
  }
}

/**
 * The patched copy of `file` (written once to `<cache>/flashd/uws-p3-<hash>/`), or `file`
 * itself when it is not a known binary or the copy cannot be written. The directory is named
 * anew whenever the patched bytes change (p2: 16 KB), so flashd versions sharing a cache never
 * rewrite each other's copy.
 */
function patchedUws(file: string): string {
  const p = UWS_PATCHES[UWS_ADDON];
  if (!p) {
    uwsPatchSkipped = `no patch known for ${UWS_ADDON}`;
    return file;
  }
  try {
    if (statSync(file).size !== p.bytes) {
      uwsPatchSkipped = `${file} is not the known build`;
      return file;
    }
    const target = inCache(`uws-p3-${p.sha256.slice(0, 16)}`, (dir) => {
      const copy = join(dir, UWS_ADDON);
      if (existsSync(copy) && statSync(copy).size === p.bytes && sitesPatched(copy, p)) return copy;
      const patched = patchUwsAddon(UWS_ADDON, readFileSync(file));
      if (!patched) return null;
      const partial = `${copy}.${process.pid}.partial`;
      writeFileSync(partial, patched, { mode: 0o700 });
      renameSync(partial, copy);
      return copy;
    });
    if (target === null) {
      uwsPatchSkipped = `${file} is not the known build`;
      return file;
    }
    uwsSplitHeaderLimit = UWS_SPLIT_HEADER_LIMIT;
    uwsIdleTimeoutS = UWS_IDLE_TIMEOUT_S;
    uwsPatchSkipped = null;
    return target;
  } catch (err) {
    uwsPatchSkipped = `cannot write the patched copy to ${(err as Error).message}`;
    return file;
  }
}

/** uWebSockets.js, always the native binary: the package's JS fallback is refused. */
export function loadUws(): typeof import('uWebSockets.js') {
  // Read by later uWS builds (not by the bundled v20.30, patched below instead), before the addon initialises.
  process.env['UWS_HTTP_MAX_HEADERS_SIZE'] ??= String(UWS_SPLIT_HEADER_LIMIT);
  const dir = nativeDir();
  const file = dir ? join(dir, UWS_ADDON) : join(require.resolve('uWebSockets.js/package.json'), '..', 'binaries', UWS_ADDON);
  if (process.env['FLASHD_UWS_UNPATCHED'] === '1') {
    uwsPatchSkipped = 'FLASHD_UWS_UNPATCHED=1';
    return loadAddon(file) as typeof import('uWebSockets.js');
  }
  return loadAddon(patchedUws(file)) as typeof import('uWebSockets.js');
}

/**
 * better-sqlite3's addon for its `nativeBinding` option, or undefined in a checkout, where
 * better-sqlite3 finds its own build under node_modules.
 */
export function sqliteNativeBinding(): object | undefined {
  const dir = nativeDir();
  return dir ? (loadAddon(join(dir, SQLITE_ADDON)) as object) : undefined;
}

