#!/usr/bin/env node
/**
 * `npm run bench`: builds dist/flashd.mjs, then runs bench/run.mjs (flashd against BullMQ +
 * Redis) and bench/cold-start.mjs (S9, container cold start). One entry file so that the
 * arguments after `npm run bench --` reach a script that reads them (npm appends them to the
 * last command of a chain only): `--help` prints the usage below and starts nothing.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { handleArgs } from './lib/args.mjs';

handleArgs(
  'bench',
  `npm run bench: flashd against BullMQ + Redis on the same workloads and box (bench/run.mjs:
scenarios S1-S5 and S7, jobs/s and p50/p99, about 7 minutes; needs Debian's redis-server for the
BullMQ peer), then the container cold start S9 (bench/cold-start.mjs; skipped, saying why, without
a container engine). Results: bench/results/latest.md and .json, bench/results/<date>-cold-start.json.
Method and numbers: BENCHMARKS.md.

Settings are environment variables (the script takes no arguments):
  BENCH_QUICK=1                 about one minute: 1 run of 1 s per point, small S3/S4/S7
  BENCH_ONLY=flashd|bullmq      one side only
  BENCH_RUNS, BENCH_SECONDS     runs per point and seconds per run
  BENCH_S4_JOBS, BENCH_S4_RUNS  the S4 drain's size and count
  COLD_START_RUNS (20), COLD_START_WARMUP (2)   the cold-start runs per FlashBoot mode
  FLASHD_BENCH_CONTAINER_SOCKET, FLASHD_BENCH_WORKER_IMAGE   reuse an engine and image for S9

e.g. BENCH_QUICK=1 BENCH_ONLY=flashd npm run bench
`,
);

const root = fileURLToPath(new URL('..', import.meta.url));
for (const script of ['build/bundle.mjs', 'bench/run.mjs', 'bench/cold-start.mjs']) {
  const r = spawnSync(process.execPath, [script], { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) process.exit(r.status ?? 1);
}
