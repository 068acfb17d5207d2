/**
 * Deleting an endpoint takes its jobs out of memory through the endpoint's own lists (its
 * queue's deques, those a purge in flight holds, running and finished jobs), never a walk of
 * every job in memory inside the DELETE request: with 400k queued jobs recovered at start, half
 * of them on the deleted endpoint, the request held the event loop ~150 ms, and deleting an
 * EMPTY endpoint ~45 ms (bench/.tmp/dropwalk.mjs). Its queued jobs leave memory a slice a turn;
 * meanwhile none of them is found by id. Checked structurally: which Maps the deletion walks (the
 * built-in Map is wrapped, nothing of flashd is replaced), and that the jobs are collected.
 */
import t, { type Test } from 'tap';
import v8 from 'node:v8';
import vm from 'node:vm';
import { startAgent, cpuBody, seedQueued, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const BACKLOG = 20_000;

/** Sizes of the Maps walked while `counting` (every way a Map is walked). */
let counting = false;
const walked: number[] = [];
const proto = Map.prototype as unknown as Record<PropertyKey, (...args: unknown[]) => unknown>;
const originals = new Map<PropertyKey, (...args: unknown[]) => unknown>();
for (const name of [Symbol.iterator, 'entries', 'values', 'keys', 'forEach'] as PropertyKey[]) {
  const original = proto[name] as (...args: unknown[]) => unknown;
  originals.set(name, original);
  proto[name] = function (this: Map<unknown, unknown>, ...args: unknown[]) {
    if (counting) walked.push(this.size);
    return original.apply(this, args);
  };
}
/** Entries deleted from Maps of 1,000 entries or more (the jobs by id) while `countingDeletes`. */
let countingDeletes = false;
let deletes = 0;
const mapDelete = Map.prototype.delete;
Map.prototype.delete = function (this: Map<unknown, unknown>, key: unknown) {
  if (countingDeletes && this.size >= 1_000) deletes++;
  return mapDelete.call(this, key);
};
t.teardown(() => {
  for (const [name, original] of originals) proto[name] = original;
  Map.prototype.delete = mapDelete;
});

const endpoint = async (a: TestAgent) => (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;

/** A server restarted on `rows` queued jobs (recovered into memory), `endpointOf(i)` each. */
async function withBacklog(t: Test, names: number, endpointOf: (i: number, eps: string[]) => string, rows = BACKLOG) {
  const dir = testDataDir(t);
  const first = await startAgent(t, {}, { dir });
  const eps: string[] = [];
  for (let i = 0; i < names; i++) eps.push(await endpoint(first));
  await first.agent.close();
  seedQueued(dir, rows, (i) => endpointOf(i, eps));
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  return { a, eps };
}

const seeded = (i: number) => `seeded-${String(i).padStart(8, '0')}`;

t.test('deleting an empty endpoint walks none of the jobs of other endpoints', async (t) => {
  const { a, eps } = await withBacklog(t, 2, (_, [kept]) => kept as string);
  const [kept, empty] = eps as [string, string];
  t.equal((await a.req('GET', `/v2/${kept}/health`)).json.jobs.inQueue, BACKLOG, 'the other endpoint\'s backlog is in memory');
  walked.length = 0;
  counting = true;
  const r = await a.req('DELETE', `/v2/serverless/${empty}`);
  counting = false;
  t.equal(r.status, 204);
  const largest = Math.max(0, ...walked);
  t.ok(largest < BACKLOG, `no Map of ${BACKLOG} jobs was walked by the request (largest walked: ${largest} entries, ${walked.length} walks)`);
  t.equal((await a.req('GET', `/v2/${kept}/health`)).json.jobs.inQueue, BACKLOG, 'the other endpoint keeps its backlog');
});

t.test('a deleted endpoint\'s backlog is found by no lookup from the DELETE on, and leaves memory in slices', async (t) => {
  const { a, eps } = await withBacklog(t, 2, (i, [gone, kept]) => (i % 2 ? gone : kept) as string);
  const [gone, kept] = eps as [string, string];
  const q = a.agent.queue;
  const last = seeded(BACKLOG - 1);
  const refs = [seeded(1), last].map((id) => new WeakRef(q.live(id) as object));
  t.ok(refs.every((r) => r.deref() !== undefined), 'the backlog is in memory');
  // A /runsync waiting at the back of the backlog.
  const sync = a.req('POST', `/v2/${gone}/runsync?wait=60000`, { body: { input: { n: 2 } } });
  await until('the /runsync job queued', async () => (await a.req('GET', `/v2/${gone}/health`)).json.jobs.inQueue === BACKLOG / 2 + 1);
  // Jobs deleted from memory per event-loop turn: a setImmediate chain counts them between its turns.
  const perTurn: number[] = [];
  let ticking = true;
  const tick = () => {
    perTurn.push(deletes);
    deletes = 0;
    if (ticking) setImmediate(tick);
  };
  countingDeletes = true;
  tick();
  walked.length = 0;
  counting = true;
  const r = await a.req('DELETE', `/v2/serverless/${gone}`);
  counting = false;
  t.equal(r.status, 204);
  t.ok(Math.max(0, ...walked) < BACKLOG, 'the request walked no Map of every job');
  t.equal(q.live(last), undefined, 'a queued job at the back is not found at once');
  t.equal((await a.req('GET', `/v2/${gone}/status/${last}`)).status, 404, 'nor by /status');
  const answered = await sync;
  t.equal(answered.status, 404, 'the /runsync at the back of the backlog is answered 404');
  // Nothing holds the jobs once their slices are through.
  await until('the backlog collected', async () => {
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    return refs.every((ref) => ref.deref() === undefined);
  }, 10_000);
  t.pass('the deleted endpoint\'s jobs were collected');
  ticking = false;
  countingDeletes = false;
  const total = perTurn.reduce((n, d) => n + d, 0);
  t.ok(total >= BACKLOG / 2, `its ${BACKLOG / 2} jobs left the map (${total} deletions)`);
  t.ok(Math.max(...perTurn) <= BACKLOG / 4, `a slice a turn: at most ${Math.max(...perTurn)} deletions between two turns, over ${perTurn.filter((d) => d > 0).length} turns`);
  // The other endpoint works on.
  const w = await TestWorker.create(a, kept);
  t.equal((await w.take())?.id, seeded(0), 'the other endpoint\'s backlog is untouched');
  t.equal((await a.req('GET', `/v2/${kept}/health`)).json.jobs.inQueue, BACKLOG / 2 - 1);
});

t.test('deleting an endpoint during a purge: the purge answers, and the jobs it still held leave memory', async (t) => {
  const { a, eps } = await withBacklog(t, 1, (_, [gone]) => gone as string);
  const [gone] = eps as [string];
  const q = a.agent.queue;
  const ref = new WeakRef(q.live(seeded(BACKLOG - 1)) as object);
  const purge = a.req('POST', `/v2/${gone}/purge-queue`);
  // The purge ends its backlog a slice per commit: the DELETE comes while its deques hold the rest.
  await until('a first purged slice', async () => q.find(gone, seeded(0))?.status === 'CANCELLED', 10_000);
  t.equal(q.find(gone, seeded(BACKLOG - 1))?.status, 'IN_QUEUE', 'the back of the backlog is not purged yet');
  t.equal((await a.req('DELETE', `/v2/serverless/${gone}`)).status, 204);
  t.equal(q.live(seeded(BACKLOG - 1)), undefined, 'a job the purge still held is found no more');
  const purged = await purge;
  t.equal(purged.status, 200, purged.text);
  t.ok(purged.json.removed < BACKLOG, `the purge stopped early (${purged.json.removed} ended)`);
  await until('the purge\'s jobs collected', async () => {
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    return ref.deref() === undefined;
  }, 10_000);
  t.pass('the jobs the purge held were collected');
});
