// Bundles src/main.ts into one ESM file, dist/flashd.mjs. Native addons (better-sqlite3,
// uWebSockets.js) stay external and load from node_modules (or, in the single binary, from
// FLASHD_NATIVE_DIR; see src/core/native.ts).
import { build } from 'esbuild';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const started = Date.now();
await build({
  entryPoints: [join(root, 'src/main.ts')],
  outfile: join(root, 'dist/flashd.mjs'),
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  sourcemap: 'linked',
  external: ['better-sqlite3', 'uWebSockets.js'],
  banner: { js: "import { createRequire as __flashdCreateRequire } from 'node:module'; const require = __flashdCreateRequire(import.meta.url);" },
  logLevel: 'warning',
});
process.stderr.write(`built dist/flashd.mjs in ${Date.now() - started} ms\n`);
