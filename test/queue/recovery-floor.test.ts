/**
 * Restart recovery reads the jobs table from the recovery floor up (no index of active jobs).
 * What a crash leaves is what was committed, so the invariant is checked on the committed rows
 * after every step: no queued or running row lies below the stored floor. And the floor must
 * rise, or recovery would read the whole table.
 */
import t, { type Test } from 'tap';
import { randomBytes } from 'node:crypto';
import { createSecretBox } from '../../src/core/secret-box.js';
import { ManualClock } from '../../src/core/clock.js';
import { JobsRepo } from '../../src/store/index.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const floorOf = (a: TestAgent): number =>
  Number(a.agent.db.prepare("SELECT value FROM settings WHERE key = 'jobs.recovery_floor'").pluck().get());
const lowestActive = (a: TestAgent): number | null =>
  a.agent.db.prepare("SELECT min(rowid) FROM jobs WHERE status IN ('IN_QUEUE', 'IN_PROGRESS')").pluck().get() as number | null;
const rowidOf = (a: TestAgent, id: string): number => a.agent.db.prepare('SELECT rowid FROM jobs WHERE id = ?').pluck().get(id) as number;

async function checkInvariant(t: Test, a: TestAgent, what: string): Promise<void> {
  await a.agent.queue.durable();
  const low = lowestActive(a);
  if (low !== null && low < floorOf(a)) t.fail(`${what}: active row ${low} below the floor ${floorOf(a)}`);
}

async function setup(t: Test, dir = testDataDir(t), clock = new ManualClock()) {
  const a = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000, maxAttempts: 3 }, { clock, dir });
  return { a, dir, clock };
}

t.test('the floor rises past finished jobs, and a restart recovers exactly the active ones in order', async (t) => {
  const { a, dir, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const ids: string[] = [];
  for (let i = 0; i < 10; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id);
  for (let i = 0; i < 6; i++) {
    const job = await w.take();
    t.equal((await w.done(job!.id, { output: i })).status, 200);
  }
  const running = await w.take();
  t.equal(running?.id, ids[6]);
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'after reap');
  t.equal(floorOf(a), rowidOf(a, ids[6] as string), 'the floor is the oldest active row (the running job)');

  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const w2 = w.rebase(a.url, b.url);
  t.equal((await b.req('GET', `/v2/${ep}/status/${ids[6]}`)).json.status, 'IN_PROGRESS', 'the running job is recovered');
  const next = [];
  for (let i = 0; i < 3; i++) next.push((await w2.take())?.input);
  t.same(next, [{ i: 7 }, { i: 8 }, { i: 9 }], 'the queued ones, in order');
  t.equal(await w2.take(), null, 'and nothing else');
});

t.test('a retried old job lowers the floor in its own commit', async (t) => {
  const { a, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const old = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { old: true } } })).json.id as string;
  await w.take();
  await w.done(old, { error: 'boom' });
  for (let i = 0; i < 5; i++) {
    const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).json.id as string;
    await w.take();
    await w.done(id, { output: i });
  }
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'after reap');
  t.ok(floorOf(a) > rowidOf(a, old), 'the floor passed the failed job');
  t.equal((await a.req('POST', `/v2/${ep}/retry/${old}`)).status, 200);
  t.equal(floorOf(a), rowidOf(a, old), 'committed with the retry: the floor is back at the retried row');
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'reap after retry');
  t.equal(floorOf(a), rowidOf(a, old), 'and a raise keeps it there while the job is queued');
  t.same((await w.take())?.input, { old: true });
  await w.done(old, { output: 'second time' });
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'after the retried job finished');
  t.ok(floorOf(a) > rowidOf(a, old), 'once it finished the floor rises again');
});

t.test('a reused rowid below the floor lowers it', async (t) => {
  const { a, dir, clock } = await setup(t);
  const mk = async () => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const kept = await mk();
  const gone = await mk();
  const w = await TestWorker.create(a, kept);
  const first = (await a.req('POST', `/v2/${kept}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  await w.done(first, { output: 1 });
  for (let i = 0; i < 3; i++) await a.req('POST', `/v2/${gone}/run`, { body: { input: { i } } });
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'before delete');
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  clock.advance(10);
  a.agent.queue.reap();
  await checkInvariant(t, a, 'after delete');
  const floorBefore = floorOf(a);
  t.ok(floorBefore > rowidOf(a, first) + 1, 'the floor is past the deleted rows');
  // A restart in between: the server no longer knows the deleted rows' rowids at all.
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200 }, { clock, dir });
  const reused = (await b.req('POST', `/v2/${kept}/run`, { body: { input: { reused: true } } })).json.id as string;
  t.ok(rowidOf(b, reused) < floorBefore, 'SQLite gave the new row a rowid below the floor (the newest rows were deleted)');
  await checkInvariant(t, b, 'after the insert');
  await b.agent.close();
  const c = await startAgent(t, { takeHoldMs: 200 }, { clock, dir });
  const w2 = w.rebase(a.url, c.url);
  t.same((await w2.take())?.id, reused, 'recovered after a restart');
});

for (const seedStart of [7, 11, 23]) t.test(`random operations keep every active row at or above the floor, and the floor rises (seed ${seedStart})`, async (t) => {
  const { a, dir, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const workers = [await TestWorker.create(a, ep), await TestWorker.create(a, ep)];
  let seed = seedStart;
  const rand = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return Math.floor(seed / 65536) % n;
  };
  const held: { w: TestWorker; id: string }[] = [];
  const finished: string[] = [];
  let maxFloor = 0;
  const syncCalls: Promise<unknown>[] = [];
  for (let step = 0; step < 160; step++) {
    const op = rand(9);
    if (op <= 1) {
      await a.req('POST', `/v2/${ep}/run`, { body: { input: { step } } });
    } else if (op === 2) {
      const w = workers[rand(2)] as TestWorker;
      const job = await w.take();
      if (job) held.push({ w, id: job.id });
    } else if (op === 3 && held.length) {
      const [h] = held.splice(rand(held.length), 1);
      const r = await h!.w.done(h!.id, rand(3) === 0 ? { error: 'e' } : { output: step });
      if (r.status === 200) finished.push(h!.id);
    } else if (op === 4 && finished.length) {
      await a.req('POST', `/v2/${ep}/retry/${finished[rand(finished.length)]}`);
    } else if (op === 5 && held.length) {
      // A lost lease: time passes without pings; the job goes back to the retry deque.
      clock.advance(3001);
      a.agent.queue.reap();
      held.length = 0;
    } else if (op === 6) {
      const list = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { cancel: step } } })).json.id as string;
      await a.req('POST', `/v2/${ep}/cancel/${list}`);
    } else if (op === 7) {
      // /runsync: written only at its final state, or once it is due (deferred insert).
      syncCalls.push(a.req('POST', `/v2/${ep}/runsync?wait=1000`, { body: { input: { sync: step } } }).catch(() => undefined));
      await new Promise((r) => setImmediate(r));
    } else {
      clock.advance(rand(2) === 0 ? 10 : 150);
      a.agent.queue.reap();
    }
    await checkInvariant(t, a, `step ${step} (op ${op})`);
    maxFloor = Math.max(maxFloor, floorOf(a));
  }
  t.ok(maxFloor > 1, `the floor rose (to ${maxFloor})`);
  await Promise.all(syncCalls);
  await checkInvariant(t, a, 'after the /runsync calls ended');
  const active = a.agent.db.prepare("SELECT id FROM jobs WHERE status IN ('IN_QUEUE', 'IN_PROGRESS') ORDER BY rowid").pluck().all() as string[];
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200 }, { clock, dir });
  const snapshot = await Promise.all(active.map(async (id) => (await b.req('GET', `/v2/${ep}/status/${id}`)).json.status as string));
  t.ok(snapshot.every((s) => s === 'IN_QUEUE' || s === 'IN_PROGRESS'), 'every active row is active after the restart');
  t.equal((await b.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue + (await b.req('GET', `/v2/${ep}/health`)).json.jobs.inProgress, active.length,
    'and the queue holds exactly those');
});

t.test('a retried job keeps its new run across a restart: its claim is written and its TTL counts from the retry', async (t) => {
  const { a, dir, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { r: 1 }, policy: { ttl: 10_000 } } })).json.id as string;
  await w.take();
  t.equal((await w.done(id, { error: 'boom' })).status, 200);
  clock.advance(11_000); // past the first run's TTL
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).json.status, 'IN_QUEUE');
  clock.advance(400);
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.delayTime, 400, 'delayTime counts from the retry');
  t.same(await w.take(), { id, input: { r: 1 } });
  clock.advance(200); // past the claim-save delay
  a.agent.queue.reap();
  await a.agent.close(); // a clean stop writes every claim

  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const w2 = w.rebase(a.url, b.url);
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_PROGRESS', 'the retried run is still with its worker after the restart');
  t.equal(s.workerId, w.workerId);
  t.equal(await w2.take(), null, 'nobody else gets it');
  t.equal((await w2.done(id, { output: 'second run' })).status, 200, "its worker's result is accepted");
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'COMPLETED');

  // A retried job still queued at a restart gets the TTL of its new run, not of its first submit.
  const id2 = (await b.req('POST', `/v2/${ep}/run`, { body: { input: { r: 2 }, policy: { ttl: 10_000 } } })).json.id as string;
  await w2.take();
  t.equal((await w2.done(id2, { error: 'boom' })).status, 200);
  clock.advance(11_000);
  t.equal((await b.req('POST', `/v2/${ep}/retry/${id2}`)).json.status, 'IN_QUEUE');
  await b.agent.close();
  const c = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const w3 = w.rebase(a.url, c.url);
  c.agent.queue.reap();
  t.equal((await c.req('GET', `/v2/${ep}/status/${id2}`)).json.status, 'IN_QUEUE', 'not timed out by the restart');
  t.same(await w3.take(), { id: id2, input: { r: 2 } }, 'and a worker gets it');
});

t.test('a restart keeps the queue order: a /retry stays behind the jobs queued before it, a lost-lease requeue stays in front', async (t) => {
  const { a, dir, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const run = async (n: string) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n } } })).json.id as string;
  const j = await run('J');
  t.equal((await w.take())?.id, j);
  t.equal((await w.done(j, { error: 'boom' })).status, 200);
  const lost = await run('L');
  t.equal((await w.take())?.id, lost);
  clock.advance(200); // its claim is written
  a.agent.queue.reap();
  for (const n of ['K0', 'K1']) await run(n);
  clock.advance(10);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${j}`)).json.status, 'IN_QUEUE');
  clock.advance(10);
  await run('K2');
  clock.advance(3100); // L's lease lapses: requeued, to the front
  a.agent.queue.reap();
  const order = async (take: () => Promise<{ input: unknown } | null>) => {
    const seen = [];
    for (let job = await take(); job; job = await take()) seen.push((job.input as { n: string }).n);
    return seen;
  };
  // Before the stop this server would hand out L (requeued), K0, K1, J, K2.
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const w2 = await TestWorker.create(b, ep);
  t.same(await order(() => w2.take()), ['L', 'K0', 'K1', 'J', 'K2'], 'requeued first, then in the order they were queued');
});

t.test('a /status?ttl= given while the job is queued survives a restart', async (t) => {
  const { a, dir, clock } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=10000`)).json.status, 'IN_QUEUE');
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000 }, { clock, dir });
  const w = await TestWorker.create(b, ep);
  await w.take();
  t.equal((await w.done(id, { output: 1 })).status, 200);
  clock.advance(9000);
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'COMPLETED', 'kept within its ttl');
  clock.advance(1001);
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).status, 404, 'gone after 10 s, not the default 30 minutes');
});

t.test('polling /status with the same ?ttl= on a queued job writes it once', async (t) => {
  const { a } = await setup(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const changes = () => (a.agent.db.prepare('SELECT total_changes() AS n').get() as { n: number }).n;
  const settle = () => new Promise((r) => setTimeout(r, 20));
  await settle();
  const before = changes();
  for (let i = 0; i < 5; i++) t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=10000`)).json.status, 'IN_QUEUE');
  await settle();
  t.equal(changes() - before, 1, 'five polls, one UPDATE');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}?ttl=20000`)).status, 200);
  await settle();
  t.equal(changes() - before, 2, 'a different ttl is written');
});

t.test('recovery reads the backlog a slice at a time: every row comes back, in order, with its text intact', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000, jobRateLimitPercent: 0 }, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const tricky = 'quote " backslash \\ newline \n tab \t control \u0001 line-sep \u2028 emoji 🚀 é';
  const run = async (body: Record<string, unknown>) => (await a.req('POST', `/v2/${ep}/run`, { body })).json.id as string;
  const failed = await run({ input: { n: 'R' } });
  t.equal((await w.take())?.id, failed);
  t.equal((await w.done(failed, { error: 'boom' })).status, 200);
  const held = await run({ input: { n: 'P' } });
  t.equal((await w.take())?.id, held);
  t.equal((await w.done(held, { status: 'IN_PROGRESS', output: tricky })).status, 200, 'a progress update');
  const total = 300;
  for (let i = 0; i < total; i += 50) await Promise.all(Array.from({ length: 50 }, (_, k) => run({ input: { i: i + k } })));
  const lastNew = await run({ input: { n: 'Q' }, s3Config: { note: tricky } });
  clock.advance(10);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${failed}`)).json.status, 'IN_QUEUE', 'an old row queued again last');
  await a.agent.queue.durable();
  const active = a.agent.db.prepare("SELECT rowid FROM jobs WHERE status IN ('IN_QUEUE', 'IN_PROGRESS') ORDER BY rowid").pluck().all() as number[];
  // The store's read in slices of 7 rows (recovery's are 8192), every boundary crossed.
  t.same([...new JobsRepo(a.agent.db, createSecretBox(randomBytes(32))).active(0, 7)].map((r) => r.rowid), active, 'every active row once, in rowid order');
  const expected = a.agent.db.prepare("SELECT id FROM jobs WHERE status = 'IN_QUEUE' AND id <> ? ORDER BY rowid").pluck().all(failed) as string[];
  expected.push(failed);

  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 200, leaseMs: 3000, jobRateLimitPercent: 0 }, { clock, dir });
  t.equal((await b.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, total + 2, 'every queued row is back');
  const status = (await b.req('GET', `/v2/${ep}/status/${held}`)).json;
  t.same([status.status, status.output], ['IN_PROGRESS', tricky], 'the running job and its progress, byte for byte');
  const w2 = await TestWorker.create(b, ep);
  const seen: { id: string; [k: string]: unknown }[] = [];
  for (let r = await w2.takeBatch(256); r.jobs.length > 0; r = await w2.takeBatch(256)) seen.push(...(r.jobs as { id: string }[]));
  t.same(seen.map((j) => j.id), expected, 'in the order they were queued, the retried one last');
  t.same(seen.find((j) => j.id === lastNew)?.s3Config, { note: tricky }, 'extra keys intact');
});
