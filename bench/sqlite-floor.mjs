#!/usr/bin/env node
/**
 * `npm run bench:sqlite`: what storing a `/run` job costs SQLite alone, with no HTTP and no
 * queue. It uses flashd's own store (src/store: openDb with its pragmas and migrations, the
 * group commit, JobsRepo.insertMany as the queue uses it) and writes 1 KB jobs, N per commit, for a
 * few seconds on CPU1, printing CPU µs per job (user and kernel); then the same with one INSERT
 * statement per job (JobsRepo.insert, what flashd did before session 10). S1 at c=64 commits about 40 jobs at a time; 1 is a
 * lone client. This is the floor under S1: a /run can cost no less than this plus the HTTP
 * round trip (BENCHMARKS.md, "Where S1's time goes").
 *
 *   node bench/sqlite-floor.mjs [seconds=4] [batch sizes=1,40,64]
 */
import { build } from 'esbuild';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { REPO_ROOT, canPin, pinSelf } from './lib/procs.mjs';

const seconds = Number(process.argv[2] ?? 4);
const sizes = (process.argv[3] ?? '1,40,64').split(',').map(Number);

// The store is TypeScript: bundle the few modules used here (better-sqlite3 stays external).
const outDir = path.join(REPO_ROOT, 'bench/.tmp');
mkdirSync(outDir, { recursive: true });
const outfile = path.join(outDir, 'store.mjs');
await build({
  stdin: {
    contents: `export { openDb, JobsRepo, WriteBatch } from './src/store/index.ts';
      export { newJobId } from './src/core/ids.ts';
      export { createLogger } from './src/core/logger.ts';
      export { createSecretBox } from './src/core/secret-box.ts';`,
    resolveDir: REPO_ROOT,
    loader: 'ts',
  },
  outfile, bundle: true, platform: 'node', target: 'node20', format: 'esm', external: ['better-sqlite3'], logLevel: 'warning',
  banner: { js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
});
const { openDb, JobsRepo, WriteBatch, newJobId, createLogger, createSecretBox } = await import(outfile);

if (canPin()) pinSelf(1);
const input = JSON.stringify({ input: { prompt: 'x'.repeat(990) } }).slice(0, 1024);
const log = createLogger({ level: 'error', sink: { write: () => undefined } });

console.log(`SQLite alone, 1 KB jobs, synchronous=NORMAL (flashd's store), ${seconds} s each${canPin() ? ', pinned to CPU1' : ''}`);
for (const [how, perCommit] of sizes.flatMap((n) => [['multi-row (insertMany)', n], ['one statement per job', n]])) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'flashd-sqlite-floor-'));
  const db = openDb({ dataDir: dir, synchronous: 'normal', log });
  const repo = new JobsRepo(db, createSecretBox(randomBytes(32)));
  const batch = new WriteBatch(db, { durability: 'none', onError: (e) => { throw e; } });
  const job = (id) => ({ id, endpointId: 'floorbench00001', extra: null, webhook: null, lowPriority: false, executionTimeoutMs: 600_000, ttlMs: 86_400_000, retentionMs: 1_800_000, createdAt: Date.now() });
  const runFor = (ms) => {
    const end = performance.now() + ms;
    let jobs = 0;
    while (performance.now() < end) {
      if (how === 'one statement per job') {
        for (let i = 0; i < perCommit; i++) {
          const j = job(newJobId());
          batch.write(() => repo.insert(j, input));
        }
      } else {
        const jobs = [];
        const inputs = [];
        for (let i = 0; i < perCommit; i++) {
          jobs.push(job(newJobId()));
          inputs.push(input);
        }
        batch.write(() => repo.insertMany(jobs, inputs));
      }
      batch.flush();
      jobs += perCommit;
    }
    return jobs;
  };
  runFor(1000); // warm-up
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const jobs = runFor(seconds * 1000);
  const wall = (performance.now() - t0) / 1000;
  const c = process.cpuUsage(c0);
  console.log(`  ${String(perCommit).padStart(3)} jobs per commit, ${how.padEnd(24)}: ${Math.round(jobs / wall)} jobs/s, CPU ${((c.user + c.system) / jobs).toFixed(1)} µs/job (kernel ${(c.system / jobs).toFixed(1)})`);
  batch.close();
  db.close();
  rmSync(dir, { recursive: true, force: true });
}
