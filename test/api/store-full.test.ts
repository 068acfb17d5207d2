/**
 * Writes SQLite refuses for a full disk are answered 503 UNAVAILABLE with Retry-After and a
 * detail naming the disk, on every route that writes (/run, /runsync, a management write, a
 * worker's result), not a generic 500 that RunPod's clients take as final; nothing of them is
 * kept, and the log gets one line for the streak, not two per request. SQLite's own limit makes
 * the disk full: `PRAGMA max_page_count` at the database's size fails any write that needs a
 * new page with SQLITE_FULL, as a full filesystem does (test/e2e/disk-full.test.ts fills a real
 * tmpfs, as root).
 */
import t, { type Test } from 'tap';
import { startAgent, cpuBody, type Reply, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const big = (n: number) => ({ pad: String(n).repeat(200_000) });
const diskFull = (a: TestAgent) => a.agent.db.pragma(`max_page_count = ${a.agent.db.pragma('page_count', { simple: true }) as number}`);
const diskFreed = (a: TestAgent) => a.agent.db.pragma('max_page_count = 1073741823');

function assertUnavailable(t: Test, r: Reply, what: string): void {
  t.equal(r.status, 503, `${what}: 503, not 500 (${r.text.slice(0, 300)})`);
  t.match(r.headers.get('content-type') ?? '', /^application\/problem\+json/, `${what}: problem+json`);
  t.equal(r.headers.get('retry-after'), '10', `${what}: Retry-After`);
  t.match(r.json, {
    status: 503, code: 'UNAVAILABLE', type: 'https://flashd.dev/problems/unavailable',
    detail: 'flashd could not write its database: the disk holding its data directory is full (SQLITE_FULL). Nothing was stored; send the request again later.',
  }, `${what}: the detail names the full disk`);
}

t.test('a full disk: /run, /runsync, management writes and worker results get 503 with Retry-After; nothing is kept; the log is not flooded', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 100 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const running = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.equal((await w.take())?.id, running);
  await sleep(200); // its claim is written (CLAIM_SAVE_DELAY_MS)
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json.jobs;
  t.match(await health(), { inQueue: 1, inProgress: 1 });

  diskFull(a);
  assertUnavailable(t, await a.req('POST', `/v2/${ep}/run`, { body: { input: big(1) } }), '/run');
  // Its insert is deferred (100 ms) and fails in a later commit: persist answers from that commit's error.
  assertUnavailable(t, await a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: big(2) } }), '/runsync');
  assertUnavailable(t, await a.req('POST', '/v2/serverless', { body: cpuBody({ name: 'big', env: { A: 'a'.repeat(32768), B: 'b'.repeat(32768), C: 'c'.repeat(32768) } }) }), 'endpoint create');
  const done = await w.done(running, { output: big(3) });
  t.equal(done.status, 503, `a worker's result: 503, which the SDKs retry (${JSON.stringify(done.json)})`);
  for (let i = 0; i < 5; i++) t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: big(4) } })).status, 503, `a client retrying: ${i + 1}`);

  t.match(await health(), { inQueue: 1, inProgress: 1 }, '/health: nothing refused is counted');
  t.equal((await a.req('GET', `/v2/${ep}/status/${running}`)).json.status, 'IN_PROGRESS', 'the refused result is not shown');
  t.equal((await a.req('GET', '/v2/serverless')).json.length, 1, 'no endpoint was made');
  const failed = a.logs.filter((l) => l.includes('store write failed'));
  t.equal(failed.length, 1, 'one line for the streak of refused writes');
  t.match(failed[0], /error\s+\[store\] store write failed .*database or disk is full.*SQLITE_FULL.*"stack":/, 'the first in full');
  t.notOk(a.logs.some((l) => /request failed|store commit failed/.test(l)), 'no line per refused request');

  diskFreed(a);
  const again = await a.req('POST', `/v2/${ep}/run`, { body: { input: big(1) } });
  t.equal(again.status, 200, 'the same /run is stored once there is room');
  t.equal((await w.done(running, { output: big(3) })).status, 200, "the worker's retry is stored");
  t.match(await health(), { inQueue: 2, inProgress: 0, completed: 1 });
  t.equal((await a.req('GET', `/v2/${ep}/status/${queued}`)).json.status, 'IN_QUEUE');
  t.ok(a.logs.some((l) => /info\s+\[store\] store writes work again failures=\d+/.test(l)), 'the recovery is logged');
});

t.test('a write that fails for another reason (a constraint, a bug) is still a 500, logged per request', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  a.agent.db.exec(`CREATE TEMP TRIGGER insert_fails BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
  const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  t.equal(r.status, 500);
  t.match(r.json, { code: 'INTERNAL' });
  t.notOk(r.headers.get('retry-after'), 'no Retry-After: sending it again will not help');
  t.ok(a.logs.some((l) => /error\s+\[api\] request failed .*simulated write failure/.test(l)));
});
