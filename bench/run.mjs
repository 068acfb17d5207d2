#!/usr/bin/env node
/**
 * `npm run bench`: flashd against BullMQ + Redis on the same workloads, same box, same pinning
 * (servers on CPU1, this process with every client and simulated worker on CPU0).
 *
 *   BENCH_QUICK=1      about one minute instead of about ten
 *   BENCH_ONLY=flashd|bullmq   one side only
 *   BENCH_RUNS, BENCH_SECONDS, BENCH_S4_JOBS, BENCH_S4_RUNS   override run count, run length, drain size and count
 *
 * Prints a table and writes bench/results/latest.json and latest.md.
 */
import { execSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { bullmqSuite } from './bullmq.mjs';
import { flashdSuite } from './flashd.mjs';
import { canPin, pinSelf } from './lib/procs.mjs';
import { renderTable } from './lib/report.mjs';

const quick = process.env.BENCH_QUICK === '1';
const only = process.env.BENCH_ONLY ?? '';
const num = (name, def) => (process.env[name] ? Number(process.env[name]) : def);

const cfg = {
  quick,
  runs: num('BENCH_RUNS', quick ? 1 : 3),
  seconds: num('BENCH_SECONDS', quick ? 1 : 3),
  warm: quick ? 0.5 : 1.5,
  s1Clients: [1, 16, 64],
  s2Workers: [1, 8, 64],
  s3Samples: quick ? 200 : 2000,
  s4Jobs: num('BENCH_S4_JOBS', quick ? 5_000 : 50_000),
  s4Runs: num('BENCH_S4_RUNS', 1),
  s7Prequeue: quick ? 3_000 : 50_000,
  pollers: 32,
  pollRate: 10_000,
};

const log = (s) => process.stdout.write(s + '\n');
const started = Date.now();

function machine() {
  const sh = (c) => {
    try {
      return execSync(c, { encoding: 'utf8' }).trim();
    } catch {
      return null;
    }
  };
  const model = /Model name:\s*(.+)/.exec(sh('lscpu') ?? '')?.[1] ?? os.cpus()[0]?.model;
  return {
    nproc: Number(sh('nproc') ?? os.cpus().length), cpu: model, memGiB: Math.round(os.totalmem() / 2 ** 30), kernel: os.release(),
    node: process.version, redis: sh('redis-server --version')?.replace(/^Redis server /, '') ?? null,
    bullmq: (() => {
      try {
        return JSON.parse(readFileSync(fileURLToPath(new URL('../node_modules/bullmq/package.json', import.meta.url)), 'utf8')).version;
      } catch {
        return null;
      }
    })(),
    pinned: canPin(),
    date: new Date().toISOString(),
  };
}

const m = machine();
const pinnedSelf = pinSelf(0);
log(`flashd bench${quick ? ' (quick)' : ''}: ${m.nproc} CPUs (${m.cpu}), ${m.memGiB} GiB, kernel ${m.kernel}, node ${m.node}`);
log(pinnedSelf ? 'pinning: servers on CPU1, load generator and simulated workers on CPU0' : 'pinning: taskset unavailable or 1 CPU; nothing pinned');
log(`load average at start: ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
log(`runs: ${cfg.runs} x ${cfg.seconds} s after ${cfg.warm} s warm-up; S3 ${cfg.s3Samples} samples; S4 ${cfg.s4Jobs} jobs x ${cfg.s4Runs}; S7 backlog ${cfg.s7Prequeue}\n`);

const results = { machine: m, cfg, systems: [] };
let failures = 0;

async function section(name, fn) {
  log(`== ${name}`);
  const t0 = Date.now();
  try {
    const r = await fn();
    if (r) {
      results.systems.push(r);
      log(`   (${((Date.now() - t0) / 1000).toFixed(0)} s)\n`);
    }
  } catch (err) {
    failures++;
    log(`   FAILED: ${err.stack ?? err}\n`);
    results.systems.push({ system: name, error: String(err.message ?? err) });
  }
}

if (only === '' || only === 'flashd') {
  await section('flashd, synchronous=FULL (default)', () => flashdSuite({ sync: 'full', cfg, log, storm: true }));
  await section('flashd, synchronous=NORMAL', () => flashdSuite({ sync: 'normal', cfg, log, storm: false }));
}
if (only === '' || only === 'bullmq') {
  await section('BullMQ + Redis, no persistence', () => bullmqSuite({ aof: false, cfg, log }));
  await section('BullMQ + Redis, appendonly yes, appendfsync always', () => bullmqSuite({ aof: true, cfg, log }));
}

// Report ------------------------------------------------------------------------------------------

const table = renderTable(results);

const checks = [];
for (const s of results.systems) {
  if (s.error) continue;
  const add = (name, ok) => checks.push({ name: `${s.system} ${name}`, ok });
  for (const c of cfg.s1Clients) add(`S1 c=${c}`, s.s1?.[c]?.check);
  for (const W of cfg.s2Workers) add(`S2 W=${W}`, s.s2?.[W]?.check);
  add('S3', s.s3?.check);
  add('S4', s.s4?.check);
  if (s.s5) add('S5', s.s5.check);
  if (s.s7) add('S7', s.s7.check);
}
const bad = checks.filter((c) => !c.ok);
log(table);
log(`\nexact-delivery checks: ${checks.length - bad.length} passed, ${bad.length} failed${bad.length ? ': ' + bad.map((c) => c.name).join(', ') : ''}`);
log(`total ${((Date.now() - started) / 1000).toFixed(0)} s`);

const outDir = fileURLToPath(new URL('./results/', import.meta.url));
mkdirSync(outDir, { recursive: true });
results.table = table;
results.checks = checks;
results.totalSeconds = (Date.now() - started) / 1000;
writeFileSync(`${outDir}${quick ? 'latest-quick' : 'latest'}.json`, JSON.stringify(results, null, 1) + '\n');
writeFileSync(`${outDir}${quick ? 'latest-quick' : 'latest'}.md`, `${m.date}\n\n${table}\n`);
process.exitCode = failures || bad.length ? 1 : 0;
