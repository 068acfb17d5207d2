/**
 * A requeue after a lost lease whose commit fails (a full disk, an I/O error): before, memory
 * had the job queued while its row still said running on the worker that lost it. Another
 * worker took it, but its claim (written only on a queued row) never reached the row, so a
 * restart gave the job back to the lost worker, told the one running it to stop, and refused
 * its result as stale. Now the job goes back to the lost worker in memory with its lease
 * lapsed, and the next reap pass requeues it again and writes it. The failure is made with a
 * temporary SQLite trigger, as in failed-commit.test.ts.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const rowOf = (a: TestAgent, id: string) => a.agent.db.prepare('SELECT status, worker_id AS workerId, retries FROM jobs WHERE id = ?').get(id);
const failRequeue = (a: TestAgent) =>
  a.agent.db.exec(`CREATE TEMP TRIGGER requeue_fails BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'IN_QUEUE'
    BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END`);
const allowRequeue = (a: TestAgent) => a.agent.db.exec('DROP TRIGGER requeue_fails');

async function scene(t: Test) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const settings = { takeHoldMs: 100, leaseMs: 3000 };
  let a = await startAgent(t, settings, { clock, dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const lost = await TestWorker.create(a, ep);
  const other = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await lost.take())?.id, id);
  clock.advance(200);
  await sleep(250); // its claim is written (CLAIM_SAVE_DELAY_MS)
  t.match(rowOf(a, id), { status: 'IN_PROGRESS', workerId: lost.workerId });
  return {
    clock, ep, id, lost, other,
    get a() { return a; },
    reap: async () => {
      a.agent.queue.reap();
      await a.agent.queue.durable().catch(() => undefined);
    },
    /** The claim of whoever took the job is written. */
    claimed: async () => {
      clock.advance(200);
      await sleep(250);
    },
    restart: async () => {
      const from = a.url;
      await a.agent.close();
      a = await startAgent(t, settings, { clock, dir });
      return from;
    },
  };
}

t.test('a requeue whose commit failed leaves the job with its lost worker until the next pass stores the requeue', async (t) => {
  const s = await scene(t);
  s.clock.advance(3000); // no ping: the lease lapses
  failRequeue(s.a);
  await s.reap();
  allowRequeue(s.a);
  // Read at once: the interval reaper may requeue it again any time.
  t.match(rowOf(s.a, s.id), { status: 'IN_PROGRESS', workerId: s.lost.workerId, retries: 0 }, 'the requeue is not in the row');
  const between = s.a.agent.queue.find(s.ep, s.id);
  t.match(between, { status: 'IN_PROGRESS', workerId: s.lost.workerId, retries: 0 }, `memory holds what SQLite has (got ${between?.status})`);
  t.match(s.a.agent.queue.health(s.ep).jobs, { inQueue: 0, inProgress: 1 }, 'not queued for another worker');

  await s.reap();
  t.match(rowOf(s.a, s.id), { status: 'IN_QUEUE', retries: 1 }, 'the next pass stores the requeue');
  t.equal((await s.other.take())?.id, s.id, 'another worker takes it');
  await s.claimed();
  t.match(rowOf(s.a, s.id), { status: 'IN_PROGRESS', workerId: s.other.workerId }, 'and its claim is in the row');

  const from = await s.restart();
  const other = s.other.rebase(from, s.a.url);
  t.equal(await other.ping([s.id]), 200);
  t.same(await other.stops(), [], 'after a restart the worker running it keeps it');
  t.equal((await other.done(s.id, { output: 'ok' })).status, 200);
  t.match((await s.a.req('GET', `/v2/${s.ep}/status/${s.id}`)).json, { status: 'COMPLETED', output: 'ok' });
});

t.test('a requeue whose commit failed after a parked worker took the job: that worker lets it go, and the next pass requeues it', async (t) => {
  const s = await scene(t);
  const parked = s.other.take(); // handed the job in the requeue's own turn, before its commit
  await sleep(50);
  s.clock.advance(3000);
  failRequeue(s.a);
  await s.reap();
  t.equal((await parked)?.id, s.id, 'the parked worker got it before the commit');
  t.match(rowOf(s.a, s.id), { status: 'IN_PROGRESS', workerId: s.lost.workerId });
  t.equal(await s.other.ping([s.id]), 200);
  t.same(await s.other.stops(), [s.id], 'the worker that took it is told to stop it');
  t.equal(s.a.agent.queue.health(s.ep).jobs.inProgress, 1, 'running once');
  allowRequeue(s.a);

  await s.reap();
  t.match(rowOf(s.a, s.id), { status: 'IN_QUEUE', retries: 1 }, 'the next pass stores the requeue');
  t.equal((await s.a.req('GET', `/v2/${s.ep}/health`)).json.jobs.inQueue, 1);
});
