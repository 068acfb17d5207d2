/**
 * The one place native addons are loaded. In a development checkout they come from
 * node_modules; in the single binary (SEA) they are extracted from its assets next to it
 * by `build/sea.mjs` and found through FLASHD_NATIVE_DIR.
 */
import { createRequire } from 'node:module';
import { join } from 'node:path';

const require = createRequire(import.meta.url);

function nativeDir(): string | undefined {
  return process.env['FLASHD_NATIVE_DIR'];
}

/** uWebSockets.js, always the native binary: the package's JS fallback is refused. */
export function loadUws(): typeof import('uWebSockets.js') {
  // Must be set before the addon initialises; header blocks above it get a 431.
  process.env['UWS_HTTP_MAX_HEADERS_SIZE'] ??= '16384';
  const file = `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;
  const dir = nativeDir();
  if (dir) return require(join(dir, file)) as typeof import('uWebSockets.js');
  const pkg = require.resolve('uWebSockets.js/package.json');
  return require(join(pkg, '..', 'binaries', file)) as typeof import('uWebSockets.js');
}
