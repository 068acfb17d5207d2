/**
 * Finished jobs stay in memory for /status, up to a count (2,000). Results may be 64 MiB each,
 * so a count alone let flashd hold every large output of the last 2,000 jobs (40 jobs of 8 MB
 * kept 440 MB resident). They are also bounded by bytes now: older large results are read from
 * SQLite. Runs flashd as its own process so its memory is its own.
 */
import { existsSync, readFileSync } from 'node:fs';
import t from 'tap';
import { ADMIN_KEY, cpuBody } from '../helpers/agent.js';
import { cleanEnv, startFlashd } from '../helpers/spawn-flashd.js';
import type { WorkerEnv } from '../helpers/worker.js';

const JOBS = 60;
const OUTPUT_CHARS = 6 * 1024 * 1024;

const rssBytes = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) * 1024;

t.test('large results of finished jobs do not stay in memory by the thousand', { skip: !existsSync('/proc/self/status') && 'needs /proc' }, async (t) => {
  const dir = t.testdir();
  const flashd = await startFlashd(t, process.execPath, ['dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown, key = `Bearer ${ADMIN_KEY}`) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: key, 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
    });
    const text = await r.text();
    return { status: r.status, text, json: text ? (JSON.parse(text) as any) : undefined };
  };
  const ep = (await call('POST', '/v2/serverless', cpuBody({ workers: { min: 0, max: 0 } }))).json.id as string;
  const w = (await call('GET', `/v2/serverless/${ep}/worker-env`)).json as WorkerEnv;
  const key = w.env['RUNPOD_AI_API_KEY'] as string;
  const takePath = `/v2/${ep}/job-take/${w.workerId}?job_in_progress=0`;
  const donePath = (id: string) => `/v2/${ep}/job-done/${w.workerId}/${id}?isStream=false`;

  const pid = flashd.child.pid as number;
  const before = rssBytes(pid);
  const ids: string[] = [];
  for (let i = 0; i < JOBS; i++) {
    const id = (await call('POST', `/v2/${ep}/run`, { input: { i } })).json.id as string;
    t.equal((await call('GET', takePath, undefined, key)).json?.id, id);
    // A different output per job, so no two can share memory.
    const posted = await call('POST', donePath(id), `{"output":"${String(i % 10).repeat(OUTPUT_CHARS)}"}`, key);
    t.equal(posted.status, 200);
    ids.push(id);
  }
  const last = await call('GET', `/v2/${ep}/status/${ids[JOBS - 1]}`);
  t.equal(last.json.output.length, OUTPUT_CHARS, 'the newest result is served');
  // flashd is idle now: V8's memory reducer collects within seconds what nothing holds.
  const held = JOBS * OUTPUT_CHARS;
  let grown = Infinity;
  for (const deadline = Date.now() + 20_000; Date.now() < deadline && grown >= held / 4;) {
    await new Promise((r) => setTimeout(r, 500));
    grown = rssBytes(pid) - before;
  }
  t.ok(grown < held / 4, `flashd grew ${(grown / 1048576).toFixed(0)} MB after ${JOBS} jobs whose results total ${(held / 1048576).toFixed(0)} MB`);

  const first = await call('GET', `/v2/${ep}/status/${ids[0]}`);
  t.equal(first.json.status, 'COMPLETED', 'an old result is still there');
  t.equal(first.json.output, '0'.repeat(OUTPUT_CHARS), 'read back whole from SQLite');
});
