// Builds dist/flashd, one executable made with Node's Single Executable Applications:
//   1. a CommonJS bundle of src/main.ts (a SEA main script must be one CommonJS file),
//   2. the native addons (better-sqlite3 and uWebSockets.js for this platform and Node ABI)
//      as SEA assets, with a manifest of their sha256 (src/core/native.ts extracts them to
//      <cache>/flashd/native-<hash>/ on start and loads them from there),
//   3. `node --experimental-sea-config` writes the blob, and postject injects it into a copy
//      of the node binary running this script.
// Usage: npm run build:binary   (about 100 MB of output; the build takes a few seconds)
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { bundle, root } from './bundle.mjs';

const require = createRequire(import.meta.url);
const started = Date.now();
const say = (line) => process.stderr.write(`sea: ${line}\n`);

const [major = 0, minor = 0] = process.versions.node.split('.').map(Number);
if (major < 20 || (major === 20 && minor < 12)) {
  throw new Error(`SEA assets need Node >= 20.12 (this is ${process.versions.node})`);
}

const work = join(root, 'dist/sea');
rmSync(work, { recursive: true, force: true });
mkdirSync(work, { recursive: true });

const main = await bundle({ format: 'cjs', outfile: join(work, 'flashd.cjs') });

// native/addons.json lists the addons; their file names must match src/core/native.ts.
const fill = (t) => t.replace('{platform}', process.platform).replace('{arch}', process.arch).replace('{abi}', process.versions.modules);
const listed = JSON.parse(readFileSync(join(root, 'native/addons.json'), 'utf8')).addons;
const addons = listed.map((a) => ({
  name: fill(a.name),
  path: join(dirname(require.resolve(`${a.package}/package.json`)), fill(a.path)),
}));
const whole = createHash('sha256');
const files = addons.map((a) => {
  const bytes = readFileSync(a.path);
  whole.update(a.name).update(bytes);
  say(`asset ${a.name} from ${relative(root, a.path)} (${bytes.length} bytes)`);
  return { name: a.name, sha256: createHash('sha256').update(bytes).digest('hex'), bytes: bytes.length };
});
const manifestPath = join(work, 'native-manifest.json');
writeFileSync(manifestPath, JSON.stringify({ hash: whole.digest('hex'), files }, null, 2) + '\n');

const blob = join(work, 'flashd.blob');
const seaConfig = join(work, 'sea-config.json');
writeFileSync(seaConfig, JSON.stringify({
  main,
  output: blob,
  disableExperimentalSEAWarning: true,
  useSnapshot: false,
  useCodeCache: false,
  assets: {
    'native-manifest.json': manifestPath,
    ...Object.fromEntries(addons.map((a) => [a.name, a.path])),
  },
}, null, 2) + '\n');
execFileSync(process.execPath, ['--experimental-sea-config', seaConfig], { stdio: ['ignore', 'inherit', 'inherit'] });

// Inject into a copy, then rename: a failed build never leaves a broken dist/flashd behind.
const out = join(root, 'dist/flashd');
const partial = `${out}.partial`;
copyFileSync(process.execPath, partial);
chmodSync(partial, 0o755);
const { inject } = require('postject');
await inject(partial, 'NODE_SEA_BLOB', readFileSync(blob), {
  sentinelFuse: 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2',
});
renameSync(partial, out);

const version = execFileSync(out, ['--version'], { encoding: 'utf8', env: { ...process.env, FLASHD_NATIVE_DIR: '' } }).trim();
say(`built ${relative(root, out)} (${Math.round(statSync(out).size / 1e6)} MB, "${version}") in ${Date.now() - started} ms`);
