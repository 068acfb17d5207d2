/**
 * A job whose lease lapsed is fenced from the worker that lost it (it may still run the old
 * attempt). The fence lived in memory only: after a restart the job came back queued and
 * unfenced, so that worker could take it again and its old run's late result completed the new
 * attempt. A ping that lists a queued job its worker does not hold fences it again, and the
 * fenced worker is kept in the job's row (migration 10), so a job-take before any ping is
 * refused too. A ping listing a job whose result the same worker posted before the restart
 * asks for no stop: its row says who posted it. A worker told to stop an older attempt while
 * the job runs on another (its ping lists the job) is written into the running row as well, so
 * a restart fences the job's next attempt from it before it pings again.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

/**
 * One agent on a data dir with a manual clock (lease 3 s), an endpoint without managed workers,
 * and `restart()`: close and start again on the same dir, the given workers moved to it.
 */
async function scene(t: Test, extra: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const config = { takeHoldMs: 100, leaseMs: 3000, ...extra };
  const s = {
    clock,
    a: (await startAgent(t, config, { clock, dir })) as TestAgent,
    ep: '',
    worker: () => TestWorker.create(s.a, s.ep),
    run: async (input: unknown) => (await s.a.req('POST', `/v2/${s.ep}/run`, { body: { input } })).json.id as string,
    /** Past the lease of every job taken so far: they go back to the queue, fenced from their workers. */
    lapse: () => {
      clock.advance(3001);
      s.a.agent.queue.reap();
    },
    restart: async (...workers: TestWorker[]): Promise<TestWorker[]> => {
      const from = s.a.url;
      await s.a.agent.close();
      s.a = await startAgent(t, config, { clock, dir });
      return workers.map((w) => w.rebase(from, s.a.url));
    },
  };
  s.ep = (await s.a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  return s;
}

t.test("after a restart, a worker still running a requeued job's old attempt is not handed it again", async (t) => {
  const s = await scene(t);
  let w = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w.take())?.id, id);
  s.lapse();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the lease lapsed: requeued');
  t.equal(await w.ping([id]), 200);
  t.equal(await w.take(), null, 'fenced from the worker that still runs it');

  [w] = (await s.restart(w)) as [TestWorker];
  t.equal(await w.ping([id]), 200, 'its heartbeat still lists the job');
  t.equal(await w.take(), null, 'not handed back to it after the restart either');
  t.same(await w.stops(), [id], 'and it is told to stop the old run');
  const late = await w.done(id, { output: 'old run' });
  t.equal(late.status, 409, "the old run's late result is refused");
  const st = (await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json;
  t.equal(st.status, 'IN_QUEUE', 'the job waits for its next attempt');
  t.notOk('output' in st, 'no output recorded from the old run');

  // Once it let go (its result came back refused), the job may go to it again.
  t.equal(await w.ping([]), 200);
  t.equal((await w.take())?.id, id, 'it may take the next attempt once it dropped the old one');
});

t.test("after a restart, the old worker's first job-take (no ping before it) is not handed the job while the fence lasts", async (t) => {
  const s = await scene(t);
  let old = await s.worker();
  let other = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await old.take())?.id, id);
  s.lapse();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the lease lapsed: requeued and fenced from its worker');

  [old, other] = (await s.restart(old, other)) as [TestWorker, TestWorker];
  t.equal(await old.take(), null, "the old worker's first call after the restart, a job-take, does not get the job");
  s.clock.advance(2000);
  t.equal(await old.take(), null, 'nor a little later, while the fence lasts');
  t.equal((await other.take())?.id, id, 'another worker takes it');
  const late = await old.done(id, { output: 'old run' });
  t.equal(late.status, 409, "the old run's late result is refused as stale");
  t.equal((await other.done(id, { output: 'new run' })).status, 200);
  const st = (await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json;
  t.equal(st.status, 'COMPLETED');
  t.equal(st.output, 'new run', "the new attempt's output, not the old run's");
});

t.test('a restored fence ends at once when its worker pings without the job, and lasts a lease from the start without word from it', async (t) => {
  const s = await scene(t);
  let w1 = await s.worker();
  let w2 = await s.worker();
  const r1 = await s.run({ n: 1 });
  const r2 = await s.run({ n: 2 });
  t.equal((await w1.take())?.id, r1);
  t.equal((await w2.take())?.id, r2);
  s.lapse();

  [w1, w2] = (await s.restart(w1, w2)) as [TestWorker, TestWorker];
  // w1 says it let go (a ping without its old job): the fence ends, and the job may go to it.
  t.equal(await w1.ping([]), 200);
  t.equal((await w1.take())?.id, r1, 'a ping without the job ends the restored fence');
  // w2 says nothing: fenced from r2 for a lease from the start, then free to take it.
  t.equal(await w2.take(), null, 'still fenced from its old job');
  s.clock.advance(3001);
  t.equal((await w2.take())?.id, r2, 'after a lease without a ping listing it, it may take the job');
});

t.test('after a restart, a ping listing a job whose result this same worker posted brings no stop', async (t) => {
  const s = await scene(t);
  let w = await s.worker();
  const ok = await s.run({ n: 1 });
  const bad = await s.run({ n: 2 });
  t.equal((await w.take())?.id, ok);
  t.equal((await w.take())?.id, bad);
  t.equal((await w.done(ok, { output: 'done' })).status, 200);
  t.equal((await w.done(bad, { error: 'handler raised' })).status, 200);

  [w] = (await s.restart(w)) as [TestWorker];
  // A heartbeat made before the posts (runpod-python drops a job from its pings only after
  // posting it), answered after the restart: the finished jobs are no longer in memory.
  t.equal(await w.ping([ok, bad]), 200);
  t.same(await w.stops(), [], 'no stop for jobs it finished itself');
  const health = (await s.a.req('GET', `/v2/${s.ep}/health`)).json;
  t.equal(health.workers.running, 0, 'not shown running');
  t.equal(health.workers.idle, 1, 'idle');
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${ok}`)).json.output, 'done', 'its result stands');
});

t.test('after a restart, a ping listing a job flashd ended while the worker held it still brings a stop', async (t) => {
  const s = await scene(t);
  let w = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w.take())?.id, id);
  t.equal((await s.a.req('POST', `/v2/${s.ep}/cancel/${id}`)).json.status, 'CANCELLED');

  [w] = (await s.restart(w)) as [TestWorker];
  t.equal(await w.ping([id]), 200);
  t.same(await w.stops(), [id], 'it still runs a cancelled job: told to stop it');
});

t.test('a job requeued twice keeps its fences from both workers that may still run an old attempt across a restart', async (t) => {
  const s = await scene(t);
  let w1 = await s.worker();
  let w2 = await s.worker();
  let w3 = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w1.take())?.id, id);
  s.lapse();
  t.equal((await w2.take())?.id, id, 'the second attempt goes to w2');
  // w1 still runs the first attempt: its heartbeat lists the job while w2 runs it.
  t.equal(await w1.ping([id]), 200);
  s.clock.advance(2000);
  t.equal(await w1.ping([id]), 200);
  s.clock.advance(1001);
  s.a.agent.queue.reap();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'requeued again: w2 lost its lease');

  [w1, w2, w3] = (await s.restart(w1, w2, w3)) as [TestWorker, TestWorker, TestWorker];
  t.equal(await w1.take(), null, 'w1, still running the first attempt, is not handed it after the restart');
  t.equal(await w2.take(), null, 'nor w2, which may still run the second');
  t.equal((await w3.take())?.id, id, 'another worker takes it');
  t.equal((await w3.done(id, { output: 'new run' })).status, 200);
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.output, 'new run');
});

t.test('a job fenced from two workers keeps both fences, and each stop, across a restart, and each fence ends on its own', async (t) => {
  const s = await scene(t);
  let w1 = await s.worker();
  let w2 = await s.worker();
  let w3 = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w1.take())?.id, id);
  s.lapse();
  t.equal((await w2.take())?.id, id, 'the second attempt goes to w2');
  t.equal(await w1.ping([id]), 200, 'w1 still runs the first attempt');
  s.clock.advance(2000);
  t.equal(await w1.ping([id]), 200);
  s.clock.advance(1001);
  s.a.agent.queue.reap();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'requeued again: fenced from w1 and w2');

  [w1, w2, w3] = (await s.restart(w1, w2, w3)) as [TestWorker, TestWorker, TestWorker];
  // Both heartbeats still list the job after the restart: each is told to stop its old run again
  // (stops live in memory; a ping that lists a queued job it does not hold brings one back).
  t.equal(await w1.ping([id]), 200);
  t.equal(await w2.ping([id]), 200);
  t.same(await w1.stops(), [id], 'w1 is told to stop the first attempt after the restart');
  t.same(await w2.stops(), [id], 'w2 is told to stop the second');
  // Their pings keep both fences past the lease the restart gave them.
  for (let i = 0; i < 3; i++) {
    s.clock.advance(2000);
    s.a.agent.queue.reap();
    t.equal(await w1.ping([id]), 200);
    t.equal(await w2.ping([id]), 200);
  }
  t.equal(await w1.take(), null, 'w1 is still fenced while its pings list the job');
  t.equal(await w2.take(), null, 'so is w2');
  // w2 lets go: its fence ends, w1's stays.
  t.equal(await w2.ping([]), 200);
  t.equal(await w1.take(), null, "w1's fence does not end with w2's");
  t.equal((await w2.take())?.id, id, 'w2, which let go, may take the next attempt');
  t.equal((await w1.done(id, { output: 'first run' })).status, 409, "w1's late result does not complete w2's new attempt");
  t.equal((await w2.done(id, { output: 'third run' })).status, 200);
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.output, 'third run');
  t.equal(await w3.take(), null, 'nothing left for w3');
});

t.test("a worker still running an older attempt of a job that was running at the restart is fenced from the job's next attempt, though it did not call since", async (t) => {
  const s = await scene(t);
  let w1 = await s.worker();
  let w2 = await s.worker();
  let w3 = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w1.take())?.id, id);
  s.lapse();
  t.equal((await w2.take())?.id, id, 'the second attempt goes to w2');
  // w1 still runs the first attempt: its stop is pending, and the row names it (fenced_from).
  t.equal(await w1.ping([id]), 200);
  t.same(await w1.stops(), [id]);

  [w1, w2, w3] = (await s.restart(w1, w2, w3)) as [TestWorker, TestWorker, TestWorker];
  const health = (await s.a.req('GET', `/v2/${s.ep}/health`)).json;
  t.equal(health.workers.running + health.workers.idle, 1, 'only the worker holding the job has a record (w1 gets none at the start)');
  // Neither w1 nor w2 calls for a lease: w2's lease lapses and the job is requeued.
  s.lapse();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'requeued: w2 lost its lease');
  t.equal(await w1.take(), null, 'w1, which may still run the first attempt, is not handed the new one');
  t.equal(await w2.take(), null, 'nor w2, which may still run the second');
  t.equal((await w3.take())?.id, id, 'another worker takes it');
  t.equal((await w1.done(id, { output: 'first run' })).status, 409, "w1's late result is refused");
  t.equal((await w3.done(id, { output: 'third run' })).status, 200);
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.output, 'third run');
});

t.test('a worker whose first ping after the restart leaves out a job running on another is not fenced from its next attempt', async (t) => {
  const s = await scene(t);
  let w1 = await s.worker();
  let w2 = await s.worker();
  const id = await s.run({ n: 1 });
  t.equal((await w1.take())?.id, id);
  s.lapse();
  t.equal((await w2.take())?.id, id);
  t.equal(await w1.ping([id]), 200);

  [w1, w2] = (await s.restart(w1, w2)) as [TestWorker, TestWorker];
  t.equal(await w1.ping([]), 200, 'w1 let go of the first attempt');
  s.clock.advance(3001);
  s.a.agent.queue.reap();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'requeued: w2 lost its lease');
  t.equal((await w1.take())?.id, id, 'w1 may take the next attempt');
});

t.test("a stop that begins while the job runs on another worker (a ping of a worker it was presumed gone from) is kept across a restart: the job's next attempt is fenced from it", async (t) => {
  const s = await scene(t, { maxAttempts: 5 });
  let w1 = await s.worker();
  let w2 = await s.worker();
  let w3 = await s.worker();
  let w4 = await s.worker();
  const id = await s.run({ n: 1 });
  const row = () => s.a.agent.db.prepare('SELECT status, worker_id AS workerId, fenced_from AS fencedFrom FROM jobs WHERE id = ?').get(id);
  t.equal((await w1.take())?.id, id, 'w1 runs the first attempt');
  // w1 goes silent (a partition) while it still runs it: its lease lapses, and two leases on
  // the registry presumes it gone and forgets it, its stop with it.
  s.lapse();
  s.clock.advance(6001);
  s.a.agent.queue.reap();
  t.equal((await w2.take())?.id, id, 'the second attempt goes to w2 (the fence on w1 ran out)');
  // w2 loses its lease too: the requeue's fence names w2, not w1 (nothing said it still runs).
  s.lapse();
  t.equal((await w3.take())?.id, id, 'the third attempt goes to w3');
  s.clock.advance(200);
  await new Promise((resolve) => setTimeout(resolve, 250)); // its claim is written (CLAIM_SAVE_DELAY_MS)
  // w1 comes back: its heartbeat still lists the job of its first attempt, which w3 now runs.
  t.equal(await w1.ping([id]), 200);
  t.same(await w1.stops(), [id], 'w1 is told to stop its old run');
  await s.a.agent.queue.durable();
  t.match(row(), { status: 'IN_PROGRESS', workerId: w3.workerId }, 'the job runs on w3');
  t.ok(String((row() as { fencedFrom: string | null }).fencedFrom).includes(w1.workerId), "and its row names w1, whose stop began while it ran (so a restart keeps it)");

  [w1, w2, w3, w4] = (await s.restart(w1, w2, w3, w4)) as [TestWorker, TestWorker, TestWorker, TestWorker];
  // w3 goes silent: its lease lapses after the restart, before w1 has pinged again.
  s.lapse();
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.status, 'IN_QUEUE', 'requeued: w3 lost its lease');
  t.equal(await w1.take(), null, 'w1, which still runs the first attempt, is not handed the fourth (its first call since the restart)');
  t.equal((await w4.take())?.id, id, 'another worker takes it');
  t.equal((await w1.done(id, { output: 'first run' })).status, 409, "w1's late result of the first attempt is refused");
  t.equal((await w4.done(id, { output: 'fourth run' })).status, 200);
  t.equal((await s.a.req('GET', `/v2/${s.ep}/status/${id}`)).json.output, 'fourth run', "the job's output is the fourth attempt's, not the first's");
});
