// Bundles src/main.ts into one file.
//   node build/bundle.mjs   -> dist/flashd.mjs, ESM. Native addons (better-sqlite3,
//                              uWebSockets.js) stay external and load from node_modules.
// build/sea.mjs imports `bundle` for the CommonJS flavour the single binary needs; there
// better-sqlite3's JS is bundled too and the addons come from the binary (src/core/native.ts).
import { build } from 'esbuild';
import { fileURLToPath } from 'node:url';
import { dirname, join, relative } from 'node:path';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** @param {{ format?: 'esm' | 'cjs', outfile?: string }} [options] */
export async function bundle(options = {}) {
  const format = options.format ?? 'esm';
  const outfile = options.outfile ?? join(root, 'dist/flashd.mjs');
  const started = Date.now();
  await build({
    entryPoints: [join(root, 'src/main.ts')],
    outfile,
    bundle: true,
    platform: 'node',
    target: 'node20',
    format,
    sourcemap: format === 'esm' ? 'linked' : false,
    logLevel: 'warning',
    ...(format === 'esm'
      ? {
          external: ['better-sqlite3', 'uWebSockets.js'],
          banner: { js: "import { createRequire as __flashdCreateRequire } from 'node:module'; const require = __flashdCreateRequire(import.meta.url);" },
        }
      : {
          // A SEA main script is CommonJS without import.meta: give it the file's own URL.
          define: { 'import.meta.url': '__flashdImportMetaUrl' },
          banner: { js: "var __flashdImportMetaUrl = require('node:url').pathToFileURL(__filename).href;" },
        }),
  });
  process.stderr.write(`built ${relative(root, outfile)} (${format}) in ${Date.now() - started} ms\n`);
  return outfile;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  await bundle();
}
