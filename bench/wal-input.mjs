#!/usr/bin/env node
/**
 * `node bench/wal-input.mjs [progress updates=10] [input sizes in KB=1,2,3,4,8,64,1024,9216]`:
 * how many WAL pages one job's life writes through flashd's store (src/store: openDb with its
 * pragmas and migrations, JobsRepo), by input size: insert, claim, N progress updates, finish,
 * each its own commit as when the job is alone (progress texts of changing length). A count, not a time: automatic checkpoints are
 * off, so the -wal file only grows, by one frame (page + 24 bytes) per page a commit writes.
 * A checkpoint later copies each page written once more into flashd.db.
 */
import { build } from 'esbuild';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT } from './lib/procs.mjs';

const updates = Number(process.argv[2] ?? 10);
const sizesKb = (process.argv[3] ?? '1,2,3,4,8,64,1024,9216').split(',').map(Number);

const outDir = path.join(REPO_ROOT, 'bench/.tmp');
mkdirSync(outDir, { recursive: true });
const outfile = path.join(outDir, 'store-wal.mjs');
await build({
  stdin: {
    contents: `export { openDb, JobsRepo } from './src/store/index.ts';
      export { createLogger } from './src/core/logger.ts';
      export { createSecretBox } from './src/core/secret-box.ts';`,
    resolveDir: REPO_ROOT,
    loader: 'ts',
  },
  outfile, bundle: true, platform: 'node', target: 'node20', format: 'esm', external: ['better-sqlite3'], logLevel: 'warning',
  banner: { js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
});
const { openDb, JobsRepo, createLogger, createSecretBox } = await import(outfile);
const log = createLogger({ level: 'error', sink: { write: () => undefined } });

const mb = (pages) => (pages * 4096 / 1048576).toFixed(2);
console.log(`WAL pages (4 KB) written per job life, ${updates} progress updates, one commit per step`);
console.log('input KB   insert    claim  progress   finish    total    total MB');
for (const kb of sizesKb) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'flashd-wal-input-'));
  const db = openDb({ dataDir: dir, synchronous: 'normal', log });
  db.pragma('wal_autocheckpoint = 0');
  const repo = new JobsRepo(db, createSecretBox(randomBytes(32)));
  const wal = path.join(dir, 'flashd.db-wal');
  // A few jobs before it, so the table is not empty and its pages are those of a live one.
  const job = (id) => ({ id, endpointId: 'walbench0000001', extra: null, webhook: null, lowPriority: false, executionTimeoutMs: 600_000, ttlMs: 86_400_000, retentionMs: 1_800_000, createdAt: Date.now() });
  db.transaction(() => { for (let i = 0; i < 20; i++) repo.insert(job(`pre-${i}`), '{"input":{}}'); })();
  db.pragma('wal_checkpoint(TRUNCATE)');
  const frames = () => { try { return Math.max(0, (statSync(wal).size - 32) / (4096 + 24)); } catch { return 0; } };
  const input = JSON.stringify({ input: { image: 'A'.repeat(kb * 1024 - 22) } });
  const steps = [];
  let at = frames();
  const step = (fn) => { db.transaction(fn)(); const now = frames(); steps.push(now - at); at = now; };
  step(() => repo.insert(job('big'), input));
  step(() => repo.claim('big', 1, 'worker1', Date.now()));
  const p0 = at;
  // A progress text whose length changes each time ("step 9 of 10", then "step 10 of 10 …"):
  // SQLite rewrites a record in place, changed pages only, only while its size stays the same.
  for (let i = 0; i < updates; i++) db.transaction(() => repo.setProgress('big', JSON.stringify({ status: `step ${i}`, pad: '.'.repeat(i % 2) })))();
  steps.push(frames() - p0);
  at = frames();
  step(() => repo.finish('big', 'COMPLETED', '{"ok":true}', null, Date.now(), Date.now() + 60_000, 'worker1', 1, Date.now(), true));
  if (repo.inputOf('big') !== input) throw new Error('input read back differs');
  const total = steps.reduce((a, b) => a + b, 0);
  console.log(`${String(kb).padStart(8)} ${steps.map((s) => String(s).padStart(8)).join(' ')} ${String(total).padStart(8)} ${mb(total).padStart(11)}`);
  db.close();
  rmSync(dir, { recursive: true, force: true });
}
