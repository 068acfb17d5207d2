/**
 * A log follower that stops reading (a paused `curl | less`) while workers keep printing: flashd
 * must not buffer every new line for it in memory. Runs flashd as its own process so its memory
 * is its own; the worker is a shell that prints 40 MB of lines once told to.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { ADMIN_KEY, cpuBody } from '../helpers/agent.js';
import { cleanEnv, REPO_ROOT, startFlashd } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

const LINES = 200_000;
const LINE = 'L'.repeat(400);

const rssBytes = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) * 1024;

t.test('a follower that stops reading does not make flashd buffer the log for it', { skip: !existsSync('/proc/self/status') && 'needs /proc' }, async (t) => {
  const dir = testDataDir(t);
  const warm = join(dir, 'warm');
  const go = join(dir, 'go');
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--worker-stop-grace-ms', '1000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  // The same lines twice: first with no follower, so flashd's heap and SQLite's cache have grown
  // to what storing them takes (29 to 39 MB of RSS from run to run, which alone came near the
  // bound below); then with the follower that reads nothing, measured from there.
  const printOnce = (file: string) => `while [ ! -e '${file}' ]; do sleep 0.05; done; yes '${LINE}' | head -n ${LINES}`;
  const script = `${printOnce(warm)}; ${printOnce(go)}; exec sleep 600`;
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: JSON.stringify({ entrypoint: ['sh', '-c', script], cmd: [] }), workers: { min: 1, max: 1 } }))).id as string;
  await until('the worker to start', async () => ((await call('GET', `/v2/serverless/${ep}/logs?limit=10`)) as unknown[]).length > 0, 20_000);
  const lastSeq = async (): Promise<number> => ((await call('GET', `/v2/serverless/${ep}/logs?limit=1`)) as { seq: number }[])[0]?.seq ?? 0;
  const first = await lastSeq();
  writeFileSync(warm, '');
  await until('the first lines to be stored', async () => (await lastSeq()) >= first + LINES, 60_000);

  // The follower reads the reply's head, then nothing more.
  const { port } = new URL(flashd.url);
  const sock = connect(Number(port), '127.0.0.1');
  t.teardown(() => sock.destroy());
  await new Promise<void>((resolve) => {
    sock.once('data', () => {
      sock.pause();
      resolve();
    });
    sock.write(`GET /v2/serverless/${ep}/logs?follow=true&limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n\r\n`);
  });
  const pid = flashd.child.pid as number;
  const start = await lastSeq();
  const before = rssBytes(pid);
  writeFileSync(go, '');
  await until('every line to be stored', async () => (await lastSeq()) >= start + LINES, 60_000);
  await new Promise((r) => setTimeout(r, 1000));
  const grown = rssBytes(pid) - before;
  const printed = LINES * (LINE.length + 1);
  t.ok(grown < printed / 2, `flashd grew ${(grown / 1048576).toFixed(1)} MB while ${(printed / 1048576).toFixed(1)} MB of log went to a follower that reads nothing`);
});

t.test('followers that read none of the last lines they asked for do not make flashd buffer them', { skip: !existsSync('/proc/self/status') && 'needs /proc' }, async (t) => {
  // 4,000 lines of 16,000 characters: 64 MB of log that each follower asks for with limit=4000.
  const LONG = 'M'.repeat(16_000);
  const N = 4_000;
  const FOLLOWERS = 6;
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--worker-stop-grace-ms', '1000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const script = `yes '${LONG}' | head -n ${N}; exec sleep 600`;
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: JSON.stringify({ entrypoint: ['sh', '-c', script], cmd: [] }), workers: { min: 1, max: 1 } }))).id as string;
  const lastSeq = async (): Promise<number> => ((await call('GET', `/v2/serverless/${ep}/logs?limit=1`)) as { seq: number }[])[0]?.seq ?? 0;
  await until('every line to be stored', async () => (await lastSeq()) >= N, 60_000);
  await new Promise((r) => setTimeout(r, 1000));

  const pid = flashd.child.pid as number;
  const before = rssBytes(pid);
  const { port } = new URL(flashd.url);
  for (let i = 0; i < FOLLOWERS; i++) {
    const sock = connect(Number(port), '127.0.0.1');
    t.teardown(() => sock.destroy());
    await new Promise<void>((resolve) => {
      sock.once('data', () => {
        sock.pause();
        resolve();
      });
      sock.write(`GET /v2/serverless/${ep}/logs?follow=true&limit=${N} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n\r\n`);
    });
  }
  await new Promise((r) => setTimeout(r, 1000));
  const grown = rssBytes(pid) - before;
  const asked = FOLLOWERS * N * (LONG.length + 1);
  t.ok(grown < asked / 3, `flashd grew ${(grown / 1048576).toFixed(1)} MB for ${FOLLOWERS} followers that read none of the ${(asked / 1048576).toFixed(0)} MB of lines they asked for`);
});

t.test('a follower that picks up far behind the newest line reads the log from SQLite a page at a time', { skip: !existsSync('/proc/self/clear_refs') && 'needs /proc' }, async (t) => {
  // 4,000 lines of 16,000 characters (64 MB). A follower that starts at the first one (since=0,
  // limit=1) and reads nothing is caught up from SQLite: flashd's peak memory must not hold them all.
  const LONG = 'C'.repeat(16_000);
  const N = 4_000;
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--worker-stop-grace-ms', '1000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const script = `yes '${LONG}' | head -n ${N}; exec sleep 600`;
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: JSON.stringify({ entrypoint: ['sh', '-c', script], cmd: [] }), workers: { min: 1, max: 1 } }))).id as string;
  const lastSeq = async (): Promise<number> => ((await call('GET', `/v2/serverless/${ep}/logs?limit=1`)) as { seq: number }[])[0]?.seq ?? 0;
  await until('every line to be stored', async () => (await lastSeq()) >= N, 60_000);
  await new Promise((r) => setTimeout(r, 1000));

  const pid = flashd.child.pid as number;
  const hwm = (): number => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) * 1024;
  writeFileSync(`/proc/${pid}/clear_refs`, '5'); // the peak starts again from the current RSS
  const before = hwm();
  const { port } = new URL(flashd.url);
  const sock = connect(Number(port), '127.0.0.1');
  t.teardown(() => sock.destroy());
  await new Promise<void>((resolve) => {
    sock.once('data', () => {
      sock.pause();
      resolve();
    });
    sock.write(`GET /v2/serverless/${ep}/logs?follow=true&since=0&limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n\r\n`);
  });
  await new Promise((r) => setTimeout(r, 1000));
  const peak = hwm() - before;
  const log = N * (LONG.length + 1);
  t.ok(peak < log / 4, `flashd's peak memory rose ${(peak / 1048576).toFixed(1)} MB to catch up a follower that reads nothing on ${(log / 1048576).toFixed(0)} MB of log`);
});

t.test('a read of the log returns at most 16 MiB of lines: the newest that fit, or the oldest after since', async (t) => {
  // 1,300 lines of 16,000 characters (21 MB). A reply with all 10,000 lines of the longest kind
  // was 160 MB, held in memory until its client read it (for good when it read nothing).
  const N = 1_300;
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--worker-stop-grace-ms', '1000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  // Each line says its number, padded to 16,000 characters.
  const script = `i=0; while [ $i -lt ${N} ]; do printf '%05d%015995d\\n' $i 0; i=$((i+1)); done; exec sleep 600`;
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: JSON.stringify({ entrypoint: ['sh', '-c', script], cmd: [] }), workers: { min: 1, max: 1 } }))).id as string;
  type Line = { seq: number; line: string };
  const numbered = (l: Line[]) => l.filter((x) => x.line.length === 16_000);
  await until('every line to be stored', async () => numbered(await call('GET', `/v2/serverless/${ep}/logs?limit=1`) as Line[])[0]?.line.startsWith(String(N - 1).padStart(5, '0')) ?? false, 60_000);

  const chars = (l: Line[]) => l.reduce((n, x) => n + x.line.length, 0);
  const tail = numbered(await call('GET', `/v2/serverless/${ep}/logs?limit=10000`) as Line[]);
  t.ok(chars(tail) <= 16 * 1024 * 1024, `the last lines: ${tail.length} of them, ${(chars(tail) / 1048576).toFixed(1)} MB`);
  t.ok(tail.length > 1000 && tail.length < N, 'not all of them');
  t.equal(tail.at(-1)?.line.slice(0, 5), String(N - 1).padStart(5, '0'), 'ending with the newest');
  t.same(tail.map((l) => Number(l.line.slice(0, 5))), Array.from({ length: tail.length }, (_, i) => N - tail.length + i), 'in order, none skipped');

  // Paging with since from the start gets every line, each once.
  const all: number[] = [];
  for (let since = 0, pages = 0; pages < 10; pages++) {
    const page = await call('GET', `/v2/serverless/${ep}/logs?since=${since}&limit=10000`) as Line[];
    if (page.length === 0) break;
    t.ok(chars(page) <= 16 * 1024 * 1024, `page ${pages}: ${(chars(page) / 1048576).toFixed(1)} MB`);
    all.push(...numbered(page).map((l) => Number(l.line.slice(0, 5))));
    since = (page.at(-1) as Line).seq;
  }
  t.same(all, Array.from({ length: N }, (_, i) => i), 'paging with since reads them all');
});
