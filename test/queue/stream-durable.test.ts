/**
 * /stream chunks and progress updates live in SQLite (job_chunks, the row's output), not in the
 * heap: a chunk or progress update whose post got a 200 survives a clean restart and a crash,
 * a /stream poll hands each chunk out once, in order, and a chunk nobody reads leaves with its
 * job (result expiry, /retry, endpoint deletion). A crash is simulated by starting a second
 * agent on a copy of the data directory taken while the first still runs: what it finds is what
 * was committed, as after `kill -9` (the WAL is copied; the -shm index is rebuilt from it).
 */
import t, { type Test } from 'tap';
import v8 from 'node:v8';
import vm from 'node:vm';
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, assertProblem, cpuBody, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { testDataDir } from '../helpers/data-dir.js';

async function endpoint(a: TestAgent): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
}

const run = async (a: TestAgent, ep: string): Promise<string> => (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
const poll = async (a: TestAgent, ep: string, id: string) => (await a.req('GET', `/v2/${ep}/stream/${id}`)).json as { status: string; stream: { output: unknown }[] };
const outputs = async (a: TestAgent, ep: string, id: string) => (await poll(a, ep, id)).stream.map((c) => c.output);
const chunkRows = (a: TestAgent, id: string): number => a.agent.db.prepare('SELECT count(*) FROM job_chunks WHERE job_id = ?').pluck().get(id) as number;

/** An agent on `dir`, an endpoint, a worker and a job that worker is running. */
async function runningJob(t: Test, dir: string) {
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  t.equal((await w.take())?.id, id);
  return { a, ep, w, id };
}

/** A copy of a running agent's data directory: what a `kill -9` at this moment leaves on disk. */
function crashCopy(t: Test, dir: string): string {
  const copy = mkdtempSync(join(tmpdir(), 'flashd-crash-'));
  t.teardown(() => rmSync(copy, { recursive: true, force: true }));
  cpSync(dir, copy, { recursive: true, filter: (src) => !src.endsWith('-shm') });
  return copy;
}

t.test('acknowledged chunks and progress survive a clean restart; each chunk is handed out once, in order', async (t) => {
  const dir = testDataDir(t);
  const { a, ep, w, id } = await runningJob(t, dir);
  t.equal(await w.stream(id, 'a'), 200);
  t.equal(await w.stream(id, 'b'), 200);
  t.same(await outputs(a, ep, id), ['a', 'b'], 'read before the restart');
  t.equal(await w.stream(id, { token: 'c' }), 200);
  const big = 'é'.repeat(700_000); // split: 1.4 MB of UTF-8
  t.equal(await w.stream(id, big), 200);
  t.equal((await w.done(id, { status: 'IN_PROGRESS', output: { pct: 40 } })).status, 200);
  await a.agent.close();

  const b = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const w2 = w.rebase(a.url, b.url);
  const status = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.match(status, { status: 'IN_PROGRESS', output: { pct: 40 } }, 'the last progress update shows after the restart');
  const after = await outputs(b, ep, id);
  t.same(after[0], { token: 'c' }, 'the unread chunks, not the ones read before the restart');
  t.ok(after.length >= 3, 'the large one split in pieces');
  t.equal(after.slice(1).join(''), big, 'which join back to the output');
  t.same(await outputs(b, ep, id), [], 'each handed out once');
  t.equal(await w2.stream(id, 'd'), 200, 'the worker that outlived the restart streams on');
  t.equal(await w2.stream(id, 'e'), 200);
  t.same(await outputs(b, ep, id), ['d', 'e'], 'after the recovered ones, in order');
  t.equal((await w2.done(id, { output: 'final' })).status, 200);
  t.match((await b.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: 'final' }, 'the final result overwrites the progress');
  await b.agent.close();
  const c = await startAgent(t, { takeHoldMs: 300 }, { dir });
  t.match((await c.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'COMPLETED', output: 'final' }, 'also in SQLite');
  t.same(await poll(c, ep, id), { status: 'COMPLETED', stream: [] }, 'nothing handed out twice after another restart');
});

t.test('acknowledged chunks and progress survive a crash (a copy of the data taken while flashd runs)', async (t) => {
  const dir = testDataDir(t);
  const { a, ep, w, id } = await runningJob(t, dir);
  t.equal(await w.stream(id, 'a'), 200);
  t.same(await outputs(a, ep, id), ['a'], 'read before the crash');
  await a.agent.queue.durable(); // the read chunk's delete is on disk
  for (const s of ['b', 'c', 'd']) t.equal(await w.stream(id, s), 200);
  t.equal((await w.done(id, { status: 'IN_PROGRESS', output: { pct: 70 } })).status, 200);
  // A generator job without return_aggregate_stream: its whole result is the stream.
  const other = await run(a, ep);
  t.equal((await w.take())?.id, other);
  for (const s of ['x', 'y']) t.equal(await w.stream(other, s), 200);
  t.equal((await w.done(other, { output: [] }, true)).status, 200);

  const copy = crashCopy(t, dir);
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir: copy });
  t.match((await b.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_PROGRESS', output: { pct: 70 } }, 'the progress update survived');
  t.same(await outputs(b, ep, id), ['b', 'c', 'd'], 'every acknowledged chunk not read before, in order');
  t.same(await outputs(b, ep, id), [], 'once');
  t.same(await poll(b, ep, other), { status: 'COMPLETED', stream: [{ output: 'x' }, { output: 'y' }] }, 'the finished job keeps its stream too');
});

t.test('a chunk posted right after the take writes the claim: after a crash the job is still running on its worker', async (t) => {
  const dir = testDataDir(t);
  const { a, ep, w, id } = await runningJob(t, dir);
  // Before CLAIM_SAVE_DELAY_MS has passed: only the chunk's commit can have written the claim.
  t.equal(await w.stream(id, 'a'), 200);
  const copy = crashCopy(t, dir);
  const b = await startAgent(t, { takeHoldMs: 300 }, { dir: copy });
  t.match((await b.req('GET', `/v2/${ep}/status/${id}`)).json, { status: 'IN_PROGRESS', workerId: w.workerId }, 'not queued again');
  const w2 = w.rebase(a.url, b.url);
  t.equal(await w2.stream(id, 'b'), 200, 'the worker goes on streaming');
  t.same(await outputs(b, ep, id), ['a', 'b']);
});

t.test('chunks are not held in memory: 20 MB streamed and never polled, read after completion', async (t) => {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const heap = async (): Promise<number> => {
    for (let i = 0; i < 4; i++) {
      gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    return process.memoryUsage().heapUsed;
  };
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  t.equal((await w.take())?.id, id);
  // Warm the paths once, so the baseline holds what they allocate for good.
  const warm = await run(a, ep);
  await w.take();
  await w.stream(warm, 'w'.repeat(1_000_000));
  await w.done(warm, { output: 1 });
  await poll(a, ep, warm);
  const before = await heap();
  const MB = 1_000_000; // one chunk each: under the 1 MB limit with its quotes
  for (let i = 0; i < 20; i++) t.equal(await w.stream(id, String(i).padStart(2, '0') + 'x'.repeat(MB - 2)), 200);
  t.equal((await w.done(id, { output: [] }, true)).status, 200);
  const grown = (await heap()) - before;
  t.ok(grown < 8 * MB, `the heap did not keep the 20 MB of chunks (grew ${(grown / MB).toFixed(1)} MB)`);
  const job = a.agent.queue.live(id) as unknown as Record<string, unknown>;
  t.notOk('chunks' in job, 'the job record has no chunk list');
  const big = Object.values(job).filter((v) => (typeof v === 'string' && v.length > 100_000) || (Array.isArray(v) && v.some((x) => JSON.stringify(x).length > 100_000)));
  t.same(big, [], 'and references no chunk');
  t.equal(chunkRows(a, id), 20, 'in SQLite');
  // A poll hands out at most 16 MB of chunk text (STREAM_POLL_BYTES): the rest come with the next.
  const read = await poll(a, ep, id);
  t.equal(read.status, 'IN_PROGRESS', 'a poll that leaves chunks for the next says IN_PROGRESS, so a client that stops at COMPLETED polls again');
  for (let more = await poll(a, ep, id); more.stream.length; more = await poll(a, ep, id)) read.stream.push(...more.stream);
  t.same(read.stream.map((c) => (c.output as string).slice(0, 2)), Array.from({ length: 20 }, (_, i) => String(i).padStart(2, '0')), 'all 20, in order');
  t.ok(read.stream.every((c) => (c.output as string).length === MB), 'whole');
  await a.agent.queue.durable();
  t.equal(chunkRows(a, id), 0, 'and deleted once read');
  t.same(await poll(a, ep, id), { status: 'COMPLETED', stream: [] });
});

t.test('a finished job leaves memory at the cap while its chunks wait in SQLite; they go when its result expires', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock });
  a.agent.queue.settings.finishedInMemory = 2;
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  await w.take();
  for (const s of ['a', 'b']) t.equal(await w.stream(id, s), 200);
  t.equal((await w.done(id, { output: 'done' })).status, 200);
  for (let i = 0; i < 4; i++) {
    const other = await run(a, ep);
    await w.take();
    await w.done(other, { output: i });
  }
  t.notOk(a.agent.queue.live(id), 'out of memory past the cap, unread chunks or not');
  t.same(await poll(a, ep, id), { status: 'COMPLETED', stream: [{ output: 'a' }, { output: 'b' }] }, 'its chunks are still read, from SQLite');

  const unread = await run(a, ep);
  await w.take();
  for (const s of ['x', 'y']) t.equal(await w.stream(unread, s), 200);
  t.equal((await w.done(unread, { output: 'done' })).status, 200);
  t.equal(chunkRows(a, unread), 2);
  clock.advance(31 * 60_000); // /run results are kept 30 minutes
  a.agent.queue.reap();
  a.agent.queue.expire();
  await a.agent.queue.durable();
  await new Promise((r) => setImmediate(r));
  await a.agent.queue.durable();
  t.equal(chunkRows(a, unread), 0, 'unread chunks go with the expired result');
  assertProblem(t, await a.req('GET', `/v2/${ep}/stream/${unread}`), 404);
});

t.test('a /retry drops the old run\'s chunks; deleting the endpoint drops its jobs\' chunks', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  await w.take();
  for (const s of ['a', 'b']) t.equal(await w.stream(id, s), 200);
  t.equal((await w.done(id, { error: 'boom' })).status, 200);
  t.equal(chunkRows(a, id), 2);
  t.equal((await a.req('POST', `/v2/${ep}/retry/${id}`)).json.status, 'IN_QUEUE');
  t.equal(chunkRows(a, id), 0, 'gone with the retry');
  t.same(await poll(a, ep, id), { status: 'IN_QUEUE', stream: [] }, 'not handed out');
  t.equal((await w.take())?.id, id);
  t.equal(await w.stream(id, 'new'), 200);
  t.same(await outputs(a, ep, id), ['new'], 'the new run streams as usual');
  t.equal(await w.stream(id, 'kept'), 200);
  t.equal(chunkRows(a, id), 1);

  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  await a.agent.queue.durable();
  t.equal(chunkRows(a, id), 0, 'gone with the endpoint');
});

t.test('a lost lease drops the abandoned attempt\'s unread chunks in the requeue\'s commit; its later chunks are refused as stale', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock, dir });
  const ep = await endpoint(a);
  const w1 = await TestWorker.create(a, ep);
  const w2 = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  t.equal((await w1.take())?.id, id);
  t.equal(await w1.stream(id, 'old-read'), 200);
  t.same(await outputs(a, ep, id), ['old-read'], 'a client reads the first chunk of the first attempt');
  for (const c of ['old-1', 'old-2']) t.equal(await w1.stream(id, c), 200);
  clock.advance(3001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the lease was lost');
  t.equal(chunkRows(a, id), 0, 'the unread chunks went with the requeue');
  t.same(await poll(a, ep, id), { status: 'IN_QUEUE', stream: [] }, 'and are not handed out');
  t.equal(await w1.stream(id, 'old-3'), 409, 'a chunk of the abandoned attempt is refused as stale');
  t.equal((await w2.take())?.id, id);
  t.equal(await w1.stream(id, 'old-4'), 409, 'also while another worker runs the job');
  for (const c of ['new-1', 'new-2']) t.equal(await w2.stream(id, c), 200);
  t.same(await outputs(a, ep, id), ['new-1', 'new-2'], "only the rerun's chunks (a client that read the first attempt's sees the rerun's from the start)");
  // A chunk whose write is queued in the same commit as the requeue: not written, not acknowledged.
  const racing = a.agent.queue.stream(ep, w2.workerId, id, { output: 'lost-race' });
  clock.advance(3001);
  a.agent.queue.reap();
  t.equal(await racing, 'stale', 'refused');
  await a.agent.queue.durable();
  t.equal(chunkRows(a, id), 0);
  t.same(await poll(a, ep, id), { status: 'IN_QUEUE', stream: [] });
  t.equal(await w2.ping([]), 200, 'w2 let go of it');
  t.equal((await w2.take())?.id, id, 'the third attempt');
  t.equal(await w2.stream(id, 'new-3'), 200);
  t.equal((await w2.done(id, { output: [] }, true)).status, 200);
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock, dir });
  t.same(await outputs(b, ep, id), ['new-3'], 'after a restart too, nothing of the abandoned attempt');
});

t.test('a progress update is stored with the running job and cleared when it goes back to the queue', async (t) => {
  const clock = new ManualClock();
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock, dir });
  const ep = await endpoint(a);
  const w = await TestWorker.create(a, ep);
  const id = await run(a, ep);
  await w.take();
  const row = () => a.agent.db.prepare('SELECT status, output FROM jobs WHERE id = ?').get(id);
  t.equal((await w.done(id, { status: 'IN_PROGRESS', output: { step: 1 } })).status, 200);
  t.same(row(), { status: 'IN_PROGRESS', output: '{"step":1}' }, 'stored at once, its claim with it');
  clock.advance(3001);
  a.agent.queue.reap();
  await a.agent.queue.durable();
  const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_QUEUE', 'the lease was lost');
  t.notOk('output' in s, 'no progress of the lost run');
  t.same(row(), { status: 'IN_QUEUE', output: null }, 'cleared in SQLite too');
  await a.agent.close();
  const b = await startAgent(t, { takeHoldMs: 300, leaseMs: 3000 }, { clock, dir });
  const w2 = w.rebase(a.url, b.url);
  // The job is fenced from the worker that lost it, across the restart too, until a ping
  // shows that worker no longer runs it.
  t.equal(await w2.ping([]), 200);
  t.equal((await w2.take())?.id, id);
  t.notOk('output' in (await b.req('GET', `/v2/${ep}/status/${id}`)).json, 'nor after a restart');
});
