import t from 'tap';
import { afterCrash, decideScale, type CrashState, type ScaleInput, type WorkerSnapshot } from '../../src/scheduler/index.js';

const w = (id: string, state: WorkerSnapshot['state'], idleMs = 0, extra: Partial<WorkerSnapshot> = {}): WorkerSnapshot => ({
  id, state, idleMs, managed: true, recycle: false, ...extra,
});

const base: ScaleInput = {
  min: 0, max: 3, idleTimeoutMs: 10_000, scaling: { type: 'QUEUE_DELAY', queueDelay: 4 },
  queued: 0, lowQueued: 0, inProgress: 0, oldestWaitMs: 0, workers: [], capacity: Infinity, backoff: false,
};

const cases: { name: string; input: Partial<ScaleInput>; start: number; stop?: string[]; retire?: string[]; unretire?: string[]; throttled?: number }[] = [
  { name: 'idle endpoint, nothing queued: nothing happens', input: {}, start: 0 },
  { name: 'min > 0 keeps warm workers', input: { min: 2 }, start: 2 },
  { name: 'first job to an idle endpoint: a cold start at once', input: { queued: 1, oldestWaitMs: 0 }, start: 1 },
  { name: 'low-priority jobs never scale up', input: { lowQueued: 50, oldestWaitMs: 60_000 }, start: 0 },
  { name: 'queue delay not reached: no new worker', input: { queued: 5, oldestWaitMs: 3_000, workers: [w('a', 'running')] }, start: 0 },
  { name: 'queue delay passed and nobody idle: one more', input: { queued: 5, oldestWaitMs: 4_000, workers: [w('a', 'running')] }, start: 1 },
  { name: 'queue delay passed but a worker is idle: none', input: { queued: 5, oldestWaitMs: 9_000, workers: [w('a', 'running'), w('b', 'idle')] }, start: 0 },
  {
    name: 'queue delay passed and the only idle worker takes no job (paused: no job-take open for a while): one more',
    input: { queued: 1, oldestWaitMs: 4_000, workers: [w('a', 'idle', 2_000, { paused: true })] }, start: 1, stop: [],
  },
  {
    name: 'a paused external worker holds off no scale-up either',
    input: { queued: 2, oldestWaitMs: 4_000, workers: [w('x', 'idle', 2_000, { managed: false, paused: true }), w('a', 'running')] }, start: 1,
  },
  { name: 'a paused worker is no cold start: the queue delay applies', input: { queued: 1, oldestWaitMs: 1_000, workers: [w('a', 'idle', 2_000, { paused: true })] }, start: 0, stop: [] },
  { name: 'a paused worker beside one that takes: none', input: { queued: 1, oldestWaitMs: 9_000, workers: [w('a', 'idle', 0, { paused: true }), w('b', 'idle')] }, start: 0 },
  { name: 'a paused worker at max: none', input: { queued: 1, oldestWaitMs: 9_000, max: 1, workers: [w('a', 'idle', 0, { paused: true })] }, start: 0, stop: [] },
  { name: 'a paused worker counts toward min: nothing starts with no job queued', input: { min: 1, workers: [w('a', 'idle', 60_000, { paused: true })] }, start: 0, stop: [] },
  {
    name: 'a paused worker still stops after idleTimeout (above min)',
    input: { queued: 1, oldestWaitMs: 9_000, workers: [w('a', 'idle', 11_000, { paused: true }), w('b', 'running')] }, start: 1, stop: ['a'],
  },
  {
    name: 'REQUEST_COUNT is unaffected by a paused worker',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, queued: 2, inProgress: 0, workers: [w('a', 'idle', 0, { paused: true })] }, start: 0, stop: [],
  },
  { name: 'one step at a time while another is starting, until the oldest job has waited queueDelay more', input: { queued: 5, oldestWaitMs: 7_999, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 0 },
  // A slow boot (a model loading for a minute): one more each further queueDelay, not one per boot time.
  { name: 'while one starts, a second once the oldest job has waited twice queueDelay', input: { queued: 5, oldestWaitMs: 8_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 1 },
  { name: 'while two start, none more before three times queueDelay', input: { queued: 5, max: 10, oldestWaitMs: 11_999, workers: [w('a', 'initializing'), w('b', 'initializing')] }, start: 0 },
  { name: 'while two start, a third at three times queueDelay', input: { queued: 5, max: 10, oldestWaitMs: 12_000, workers: [w('a', 'initializing'), w('b', 'initializing')] }, start: 1 },
  {
    name: 'a backlog that has waited long starts one per queueDelay waited at once, within max',
    input: { queued: 100, max: 10, oldestWaitMs: 20_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 4,
  },
  { name: 'and no more than max', input: { queued: 100, max: 3, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 1 },
  {
    name: 'never more starting workers than jobs waiting (each is for one of them)',
    input: { queued: 2, max: 10, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 1,
  },
  { name: 'one job waiting for a worker that starts: none more', input: { queued: 1, max: 10, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 0 },
  {
    name: 'low-priority jobs count for none of them',
    input: { queued: 1, lowQueued: 50, max: 10, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'initializing')] }, start: 0,
  },
  {
    name: 'an idle worker that takes no job (paused) is no starting one: the waiting jobs still count',
    input: { queued: 2, max: 10, oldestWaitMs: 8_000, workers: [w('a', 'idle', 0, { paused: true }), w('b', 'initializing')] }, start: 1,
  },
  { name: 'not during a crash backoff', input: { queued: 5, max: 10, oldestWaitMs: 60_000, backoff: true, workers: [w('b', 'initializing')] }, start: 0 },
  { name: 'a cold start booting: the second at twice queueDelay', input: { queued: 5, oldestWaitMs: 8_000, workers: [w('b', 'initializing')] }, start: 1 },
  { name: 'never above max', input: { queued: 5, oldestWaitMs: 9_000, max: 1, workers: [w('a', 'running')] }, start: 0 },
  { name: 'max 0: nothing starts', input: { queued: 5, max: 0 }, start: 0 },
  {
    name: 'REQUEST_COUNT targets ceil((inQueue+inProgress)/requestCount)',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, queued: 3, inProgress: 2, max: 10 }, start: 3,
  },
  {
    name: 'REQUEST_COUNT ignores low-priority jobs',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, lowQueued: 9, max: 10 }, start: 0,
  },
  {
    name: 'REQUEST_COUNT: a worker busy only with work the target leaves out (low-priority jobs, a job flashd ended) serves none of the jobs counted',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 1, workers: [w('a', 'running', 0, { uncounted: true })] }, start: 1, stop: [],
  },
  {
    name: 'REQUEST_COUNT: and it is not replaced by an idle one once the job is done (the idle one stops after the grace)',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, idleTimeoutMs: 5000, workers: [w('a', 'running', 0, { uncounted: true }), w('b', 'idle', 6000)] }, start: 0, stop: ['b'],
  },
  {
    name: 'REQUEST_COUNT: busy with uncounted work it still counts toward max',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, max: 1, queued: 1, workers: [w('a', 'running', 0, { uncounted: true })] }, start: 0, retire: [],
  },
  {
    name: 'REQUEST_COUNT: with nothing counted queued, a worker busy with a low-priority job starts nobody',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, lowQueued: 4, workers: [w('a', 'running', 0, { uncounted: true })] }, start: 0, stop: [],
  },
  {
    name: 'REQUEST_COUNT: workers still starting count toward the target (no second start while they boot)',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 2, workers: [w('a', 'initializing'), w('b', 'initializing')] }, start: 0, stop: [],
  },
  {
    name: 'REQUEST_COUNT: idle workers above the target stop after the grace, down to the target',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, idleTimeoutMs: 5000, inProgress: 1, workers: [w('a', 'running'), w('b', 'idle', 6000), w('c', 'idle', 7000)] }, start: 0, stop: ['c', 'b'],
  },
  {
    name: 'REQUEST_COUNT: and not below min',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, idleTimeoutMs: 5000, min: 1, workers: [w('a', 'idle', 6000), w('b', 'idle', 7000)] }, start: 0, stop: ['b'],
  },
  {
    name: 'REQUEST_COUNT: an idle worker within the grace stays',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, idleTimeoutMs: 5000, workers: [w('a', 'idle', 4000)] }, start: 0, stop: [],
  },
  {
    name: 'REQUEST_COUNT: a worker busy only with uncounted work that is coming back for more jobs (a free slot, concurrency above 1) takes the queued job itself',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 1, workers: [w('a', 'running', 0, { uncounted: true, returningMs: 800 })] }, start: 0, stop: [],
  },
  {
    name: 'REQUEST_COUNT: coming back no more (its take loop blocked), it is occupied again and the queued job gets a worker of its own',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 1, workers: [w('a', 'running', 0, { uncounted: true, returningMs: 0 })] }, start: 1, stop: [],
  },
  {
    name: 'REQUEST_COUNT: a returning worker has room for as many jobs as any other worker, not more',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 2, workers: [w('a', 'running', 0, { uncounted: true, returningMs: 800 })] }, start: 1,
  },
  {
    name: 'REQUEST_COUNT: beside one returning worker, another busy with uncounted work still does not stand for the target',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 1, workers: [w('a', 'running', 0, { uncounted: true, returningMs: 800 }), w('b', 'running', 0, { uncounted: true })] }, start: 0, stop: [],
  },
  { name: 'REQUEST_COUNT clamps to max', input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 50 }, start: 3 },
  { name: 'idle past idleTimeout stops, down to zero', input: { workers: [w('a', 'idle', 10_001)] }, start: 0, stop: ['a'] },
  { name: 'idle below idleTimeout stays', input: { workers: [w('a', 'idle', 9_999)] }, start: 0, stop: [] },
  { name: 'min keeps idle workers warm', input: { min: 1, workers: [w('a', 'idle', 60_000), w('b', 'idle', 30_000)] }, start: 0, stop: ['a'] },
  { name: 'busy workers are never stopped', input: { workers: [w('a', 'running', 60_000)] }, start: 0, stop: [], retire: [] },
  {
    name: 'max lowered under a backlog: busy workers above it are retired (no new job, stop once idle), the newest first',
    input: { max: 1, queued: 9, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'running'), w('c', 'running')] }, start: 0, stop: [], retire: ['c', 'b'],
  },
  {
    name: 'above max, idle and starting workers stop before a busy one is retired',
    input: { max: 2, queued: 9, workers: [w('a', 'running'), w('b', 'running'), w('c', 'idle', 5), w('d', 'initializing')] }, start: 0, stop: ['d', 'c'], retire: [],
  },
  {
    name: 'external workers are never retired, they count toward max',
    input: { max: 1, queued: 9, workers: [w('x', 'running', 0, { managed: false }), w('a', 'running')] }, start: 0, retire: ['a'],
  },
  {
    name: 'a retired worker (asked to stop, still busy) keeps its place: no replacement while it runs',
    input: { max: 1, queued: 9, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'running', 0, { recycle: true, refresh: true })] }, start: 0, stop: [], retire: [],
  },
  {
    name: 'max raised again while a retired worker still runs: it takes jobs again, no cold start to replace it',
    input: { max: 2, queued: 4, oldestWaitMs: 60_000, workers: [w('a', 'running'), w('b', 'running', 0, { recycle: true, refresh: true, retired: true })] },
    start: 0, stop: [], retire: [], unretire: ['b'],
  },
  {
    name: 'an idle retired worker that fits under max again is kept, not stopped',
    input: { max: 2, workers: [w('a', 'running'), w('b', 'idle', 0, { recycle: true, refresh: true, retired: true })] }, start: 0, stop: [], unretire: ['b'],
  },
  {
    name: 'retired workers stay retired while max has no room for them, only as many as fit come back',
    input: { max: 2, queued: 9, workers: [w('a', 'running'), w('b', 'running', 0, { recycle: true, refresh: true, retired: true }), w('c', 'running', 0, { recycle: true, refresh: true, retired: true })] },
    start: 0, retire: [], unretire: ['b'],
  },
  {
    name: 'a worker that asked to be recycled (refresh_worker) never comes back',
    input: { max: 3, queued: 9, workers: [w('a', 'running'), w('b', 'running', 0, { recycle: true, refresh: true })] }, start: 0, unretire: [],
  },
  { name: 'at max, busy workers stay', input: { max: 2, queued: 9, workers: [w('a', 'running'), w('b', 'running')] }, start: 0, retire: [] },
  { name: 'external workers are never stopped', input: { workers: [w('x', 'idle', 60_000, { managed: false })] }, start: 0, stop: [] },
  { name: 'above max, idle workers stop at once', input: { max: 1, workers: [w('a', 'idle', 1), w('b', 'idle', 2)] }, start: 0, stop: ['b'] },
  { name: 'recycled workers stop when idle', input: { workers: [w('a', 'idle', 0, { recycle: true })] }, start: 0, stop: ['a'] },
  { name: 'a recycled worker still starting stops too (it holds no job)', input: { workers: [w('a', 'initializing', 0, { recycle: true })] }, start: 0, stop: ['a'] },
  { name: 'a recycled busy worker stays until its job is done', input: { workers: [w('a', 'running', 0, { recycle: true })] }, start: 0, stop: [] },
  { name: 'max lowered to 0 stops a starting worker', input: { max: 0, workers: [w('a', 'initializing')] }, start: 0, stop: ['a'] },
  {
    name: 'above max, starting workers stop before idle ones',
    input: { max: 1, workers: [w('a', 'idle', 5), w('b', 'initializing')] }, start: 0, stop: ['b'],
  },
  { name: 'a starting worker is not stopped for idleness', input: { workers: [w('a', 'initializing', 60_000)] }, start: 0, stop: [] },
  {
    name: 'a busy worker being replaced does not serve: a job queued after the change starts its replacement at once',
    input: { max: 1, queued: 1, workers: [w('a', 'running', 0, { recycle: true })] }, start: 1, stop: [],
  },
  {
    name: 'REQUEST_COUNT: workers being replaced do not count toward the target',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 4 }, queued: 1, inProgress: 1, workers: [w('a', 'running', 0, { recycle: true })] }, start: 1,
  },
  {
    name: 'a worker that asked to be recycled (refresh_worker) and still runs jobs keeps its place under max',
    input: { max: 1, queued: 3, workers: [w('a', 'running', 0, { recycle: true, refresh: true })] }, start: 0, stop: [],
  },
  {
    name: 'below max its replacement starts while it finishes',
    input: { max: 2, queued: 3, workers: [w('a', 'running', 0, { recycle: true, refresh: true })] }, start: 1, stop: [],
  },
  {
    name: 'an idle one is stopped and its place stays taken (its replacement starts when it has exited)',
    input: { max: 1, queued: 3, workers: [w('a', 'idle', 0, { recycle: true, refresh: true })] }, start: 0, stop: ['a'],
  },
  {
    name: 'and until it has exited',
    input: { max: 1, queued: 3, exiting: [{ id: 'a' }] }, start: 0,
  },
  {
    name: 'max caps the workers that exist: one stopped for idleness holds its place until it has exited (the job waits, then cold-starts)',
    input: { max: 1, queued: 1, exiting: [{ id: 'a' }] }, start: 0, throttled: 0,
  },
  {
    name: 'below max a job arriving while one exits starts a worker beside it',
    input: { max: 2, queued: 1, exiting: [{ id: 'a' }] }, start: 1,
  },
  {
    name: 'QUEUE_DELAY: no step past max while one exits',
    input: { max: 2, queued: 2, oldestWaitMs: 9_000, workers: [w('b', 'running')], exiting: [{ id: 'a' }] }, start: 0,
  },
  {
    name: 'workers.min waits for the exit too (a lowered max stopped the surplus)',
    input: { min: 2, max: 2, workers: [w('b', 'idle')], exiting: [{ id: 'a' }] }, start: 0,
  },
  {
    name: 'a retired worker does not serve again while max is taken by one exiting',
    input: { max: 2, workers: [w('b', 'idle'), w('c', 'running', 0, { recycle: true, refresh: true, retired: true })], exiting: [{ id: 'a' }] }, start: 0, unretire: [],
  },
  {
    name: 'one stopped for the init timeout stands for its replacement until it has exited, below max too (its exit is a crash a backoff may follow)',
    input: { max: 2, queued: 1, exiting: [{ id: 'a', initTimedOut: true }] }, start: 0, throttled: 0,
  },
  {
    name: 'workers.min waits for its exit too',
    input: { min: 2, max: 4, workers: [w('b', 'idle')], exiting: [{ id: 'a', initTimedOut: true }] }, start: 0,
  },
  {
    name: 'while the other starts a backlog wants go on',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, max: 4, queued: 3, exiting: [{ id: 'a', initTimedOut: true }] }, start: 2,
  },
  {
    name: 'one replaced for the new configuration holds no place while it exits: its replacement starts at once',
    input: { max: 1, queued: 1, exiting: [{ id: 'a', replaced: true }] }, start: 1,
  },
  {
    name: 'REQUEST_COUNT: a refreshing worker holds its place under max too',
    input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, max: 2, queued: 5, workers: [w('a', 'running', 0, { recycle: true, refresh: true }), w('b', 'running', 0, { recycle: true, refresh: true })] }, start: 0,
  },
  {
    name: 'an external worker that asked to be recycled still serves until it leaves',
    input: { queued: 1, workers: [w('x', 'running', 0, { recycle: true, managed: false })] }, start: 0,
  },
  { name: 'no capacity: throttled, not started', input: { queued: 2, capacity: 0 }, start: 0, throttled: 1 },
  { name: 'some capacity: the rest is throttled', input: { scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 3, capacity: 1 }, start: 1, throttled: 2 },
  { name: 'crash-loop backoff holds back the warm workers of min too', input: { min: 2, backoff: true }, start: 0 },
  { name: 'a warm idle worker takes the first job: no cold start beside it', input: { min: 1, queued: 1, workers: [w('a', 'idle', 60_000)] }, start: 0, stop: [] },
  { name: 'crash-loop backoff holds starts back without throttling', input: { queued: 2, backoff: true }, start: 0, throttled: 0 },
  { name: 'unhealthy workers do not count as capacity', input: { queued: 1, workers: [w('a', 'unhealthy')] }, start: 1 },
  // A handler that never returns from a job flashd ended (its heartbeat still lists the job).
  {
    name: 'a worker running only jobs flashd ended, told to stop them more than endedStopMs ago, is stopped',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running', 0, { uncounted: true, endedOnly: ended(3001) })] }, start: 0, stop: ['a'],
  },
  {
    name: 'not within endedStopMs of the first stop offered',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running', 0, { uncounted: true, endedOnly: ended(3000) })] }, start: 0, stop: [],
  },
  {
    name: 'not without endedStopMs',
    input: { max: 1, queued: 1, workers: [w('a', 'running', 0, { uncounted: true, endedOnly: ended(60_000) })] }, start: 0, stop: [],
  },
  {
    name: 'not an external worker: flashd cannot stop it, and it keeps counting as running',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('x', 'running', 0, { managed: false, endedOnly: ended(60_000) })] }, start: 0, stop: [],
  },
  {
    name: 'not one that runs a job of its own too (endedOnly is unset then)',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running')] }, start: 0, stop: [],
  },
  {
    name: 'above a lowered max a stuck worker is stopped, not retired as well, and counts as gone',
    input: { max: 1, endedStopMs: 3000, workers: [w('a', 'running'), w('b', 'running', 0, { uncounted: true, endedOnly: ended(5000) })] }, start: 0, stop: ['b'], retire: [],
  },
  {
    name: 'a worker that asked to be recycled (stopPod) and runs only jobs flashd ended is stopped at once, not a lease later: it takes no job and exits anyway',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running', 0, { recycle: true, refresh: true, uncounted: true, endedOnly: ended(10) })] }, start: 0, stop: ['a'],
  },
  {
    name: 'so is one replaced for a new configuration (its replacement already started beside it)',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running', 0, { recycle: true, uncounted: true, endedOnly: ended(10) })] }, start: 1, stop: ['a'],
  },
  {
    name: 'not a recycled one that still runs a job of its own (endedOnly is unset then)',
    input: { max: 1, queued: 1, endedStopMs: 3000, workers: [w('a', 'running', 0, { recycle: true, refresh: true })] }, start: 0, stop: [],
  },
  {
    name: 'a retired stuck worker is stopped, not taken back under a raised max',
    input: { max: 2, endedStopMs: 3000, workers: [w('a', 'running', 0, { recycle: true, refresh: true, retired: true, endedOnly: ended(5000) })] }, start: 0, stop: ['a'], unretire: [],
  },
];

function ended(endedMs: number): NonNullable<WorkerSnapshot['endedOnly']> {
  return { jobId: 'job-1', why: 'timed out: execution timeout 5 s', endedMs };
}

for (const c of cases) {
  t.test(c.name, async (t) => {
    const d = decideScale({ ...base, ...c.input });
    t.equal(d.start, c.start, 'start');
    if (c.stop) t.same(d.stop, c.stop, 'stop');
    if (c.retire) t.same(d.retire, c.retire, 'retire');
    if (c.unretire) t.same(d.unretire, c.unretire, 'unretire');
    if (c.throttled !== undefined) t.equal(d.throttled, c.throttled, 'throttled');
  });
}

t.test('a decision says why its workers start and stop, for the logs', async (t) => {
  t.equal(decideScale(base).startReason, '', 'nothing starts: no reason');
  t.equal(decideScale({ ...base, queued: 2 }).startReason, 'cold start: 2 job(s) waiting and no worker up');
  t.equal(
    decideScale({ ...base, queued: 5, oldestWaitMs: 4_500, workers: [w('a', 'running')] }).startReason,
    'QUEUE_DELAY: the oldest job has waited 4.5 s (queueDelay 4 s) and no worker is idle',
  );
  t.equal(
    decideScale({ ...base, queued: 1, oldestWaitMs: 4_000, workers: [w('a', 'idle', 0, { paused: true })] }).startReason,
    'QUEUE_DELAY: the oldest job has waited 4 s (queueDelay 4 s) and no worker is idle (1 idle worker(s) take no job: paused intake)',
  );
  t.equal(decideScale({ ...base, min: 2 }).startReason, 'workers.min is 2');
  t.equal(
    decideScale({ ...base, queued: 1, workers: [w('a', 'running', 0, { recycle: true })] }).startReason,
    '1 job(s) waiting and no worker of the endpoint\'s new configuration up (replacing 1 worker(s) of the old configuration, which finish their jobs and take no new one)',
    'a worker of the old configuration is up: not a cold start with "no worker up"',
  );
  t.equal(
    decideScale({ ...base, min: 1, max: 2, workers: [w('a', 'idle', 0, { recycle: true, refresh: true })] }).startReason,
    'workers.min is 1 (replacing 1 recycled worker(s), which asked for it and take no new job)',
    'a worker that asked to be recycled (refresh_worker) is being replaced: said, as for a new configuration',
  );
  t.equal(decideScale({ ...base, min: 1, queued: 1 }).startReason, 'cold start: 1 job(s) waiting and no worker up', 'the job, not min, when both want one');
  t.equal(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, queued: 3, inProgress: 2, max: 10 }).startReason,
    'REQUEST_COUNT: 5 job(s) queued or running at 2 per worker: 3 worker(s) wanted',
  );
  t.equal(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 1, workers: [w('a', 'running', 0, { uncounted: true })] }).startReason,
    'REQUEST_COUNT: 1 job(s) queued or running at 1 per worker: 1 worker(s) wanted beside the 1 busy with low-priority or ended jobs',
  );
  t.equal(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 5 }).startReason,
    'REQUEST_COUNT: 5 job(s) queued or running at 1 per worker: 5 worker(s) wanted (capped at workers.max 3)',
    'more wanted than workers.max allows: the reason says the cap, so nobody looks for the missing workers',
  );
  t.equal(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 3, workers: [w('a', 'running', 0, { uncounted: true })] }).startReason,
    'REQUEST_COUNT: 3 job(s) queued or running at 1 per worker: 3 worker(s) wanted beside the 1 busy with low-priority or ended jobs (capped at workers.max 3)',
    'also when the busy ones beside them take the count past workers.max',
  );
  t.equal(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 3 }).startReason,
    'REQUEST_COUNT: 3 job(s) queued or running at 1 per worker: 3 worker(s) wanted',
    'no cap named when workers.max allows them all',
  );
  t.same(decideScale({ ...base, workers: [w('a', 'idle', 12_000)] }).stopReasons, { a: 'idle for 12 s (idle timeout 10 s)' });
  t.same(decideScale({ ...base, max: 0, workers: [w('a', 'initializing')] }).stopReasons, { a: 'above workers.max (0)' });
  t.same(
    decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, idleTimeoutMs: 5000, inProgress: 1, workers: [w('a', 'running'), w('b', 'idle', 6_000)] }).stopReasons,
    { b: 'idle for 6 s above the REQUEST_COUNT target of 1 worker(s) (grace 5 s; idleTimeout does not apply)' },
    'REQUEST_COUNT has no idleTimeout: the reason names the target and the grace',
  );
  t.match(decideScale({ ...base, workers: [w('a', 'idle', 0, { recycle: true })] }).stopReasons, { a: /^recycled/ });
  t.same(
    decideScale({ ...base, max: 1, workers: [w('x', 'running', 0, { managed: false }), w('a', 'initializing')] }).stopReasons,
    { a: "above workers.max (1), counting the endpoint's 1 external worker(s)" },
    'an external worker joined at max: said, as nobody lowered max',
  );
  const retired = { recycle: true, refresh: true, retired: true };
  t.same(
    decideScale({ ...base, max: 1, workers: [w('a', 'running'), w('b', 'idle', 0, retired)] }).stopReasons,
    { b: 'recycled: it was busy above a lowered workers.max (1)' },
  );
  t.same(
    decideScale({ ...base, max: 1, workers: [w('x', 'running', 0, { managed: false }), w('b', 'idle', 0, retired)] }).stopReasons,
    { b: "recycled: it was busy above workers.max (1), counting the endpoint's 1 external worker(s)" },
    'retired for an external worker that joined at max: not "a lowered workers.max"',
  );
  t.same(
    decideScale({ ...base, endedStopMs: 30_000, workers: [w('a', 'running', 0, { endedOnly: { jobId: 'job-1', why: 'cancelled', endedMs: 31_000 } })] }).stopReasons,
    { a: 'it still runs job job-1 31 s after flashd ended it (cancelled), over --lease-ms (30 s)' },
  );
  t.same(
    decideScale({ ...base, endedStopMs: 30_000, workers: [w('a', 'running', 0, { recycle: true, refresh: true, endedOnly: { jobId: 'job-1', why: 'cancelled', endedMs: 200 } })] }).stopReasons,
    { a: 'recycled: the worker asked for it (stopPod: refresh_worker, or a handler that exited); it runs only job job-1, which flashd ended (cancelled)' },
  );
});

t.test('crash loop: workers that crash at start back off up to 60 s, and stay there', async (t) => {
  let s: CrashState | undefined;
  let at = 0;
  const waits: number[] = [];
  for (let i = 0; i < 10; i++) {
    s = afterCrash(s, at, 500);
    waits.push(s ? s.backoffUntil && s.backoffUntil - at : 0);
    at = Math.max(at + 1000, s?.backoffUntil ?? 0) + 500;
  }
  t.same(waits, [0, 0, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000]);
});

t.test('crash loop: crashes of workers that had run for a minute are no loop, however close together', async (t) => {
  // Ten long-lived workers, each crashing once in five minutes: the endpoint sees a crash every
  // 30 s. Counted as a loop, the 60 s backoff renewed at each crash would hold every start back.
  let s: CrashState | undefined;
  for (let i = 0; i < 20; i++) {
    s = afterCrash(s, i * 30_000, 5 * 60_000);
    t.ok(s === undefined || s.backoffUntil <= i * 30_000, `crash ${i + 1}: no start held back`);
  }
  // They do not lift a loop's backoff either.
  let loop: CrashState | undefined;
  for (const at of [0, 1000, 2000]) loop = afterCrash(loop, at, 100);
  t.equal(afterCrash(loop, 2500, 5 * 60_000)?.backoffUntil, loop?.backoffUntil, 'the backoff of the loop stays');
});

t.test('QUEUE_DELAY says when the oldest job will have waited long enough, so the loop decides again then', async (t) => {
  const busy = [w('a', 'running')];
  t.equal(decideScale({ ...base, queued: 2, oldestWaitMs: 2_600, workers: busy }).recheckInMs, 1_400, 'queueDelay 4 s, waited 2.6 s');
  t.equal(decideScale({ ...base, queued: 2, oldestWaitMs: 4_000, workers: busy }).recheckInMs, 0, 'reached: it starts one now instead');
  t.equal(decideScale({ ...base, queued: 2, oldestWaitMs: 100, workers: [w('a', 'running'), w('b', 'initializing')] }).recheckInMs, 7_900, 'another still starting: the next one at twice queueDelay');
  t.equal(decideScale({ ...base, queued: 5, max: 10, oldestWaitMs: 9_000, workers: [w('a', 'initializing'), w('b', 'initializing')] }).recheckInMs, 3_000, 'two starting: at three times queueDelay');
  t.equal(decideScale({ ...base, queued: 1, oldestWaitMs: 100, workers: [w('a', 'running'), w('b', 'initializing')] }).recheckInMs, 0, 'as many starting as jobs waiting: none more is due');
  t.equal(decideScale({ ...base, queued: 2, oldestWaitMs: 100, workers: [w('a', 'running'), w('b', 'idle')] }).recheckInMs, 0, 'a worker is idle');
  t.equal(decideScale({ ...base, queued: 2, oldestWaitMs: 100, max: 1, workers: busy }).recheckInMs, 0, 'at max');
  t.equal(decideScale({ ...base, lowQueued: 5, oldestWaitMs: 0, workers: busy }).recheckInMs, 0, 'low-priority jobs never scale up');
  t.equal(decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 2, workers: busy }).recheckInMs, 0, 'REQUEST_COUNT waits for nothing');
});

t.test('QUEUE_DELAY names the starting workers that hold a start back once a job has waited queueDelay', async (t) => {
  const booting = [w('a', 'running'), w('b', 'initializing')];
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 5_000, workers: booting }).heldByStarting, ['b'], 'waited past queueDelay, b still starting: b holds it');
  t.same(decideScale({ ...base, queued: 1, oldestWaitMs: 60_000, workers: booting }).heldByStarting, ['b'], 'one job, b starting for it: b holds a start back');
  t.same(decideScale({ ...base, queued: 5, max: 10, oldestWaitMs: 9_000, workers: booting }).heldByStarting, ['b'], 'a start beside b, the next still held back');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, workers: booting }).heldByStarting, [], 'the start beside b fills max: nothing more is held back');
  t.same(decideScale({ ...base, queued: 5, oldestWaitMs: 9_000, capacity: 0, workers: booting }).heldByStarting, [], 'the runtime has no room: said by its own line');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, workers: [w('b', 'initializing')] }).heldByStarting, ['b'], 'a cold start still booting');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 3_000, workers: booting }).heldByStarting, [], 'queueDelay not reached yet');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, max: 2, workers: booting }).heldByStarting, [], 'at max: no start would come anyway');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, workers: [...booting, w('c', 'idle')] }).heldByStarting, [], 'a worker is idle');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, backoff: true, workers: booting }).heldByStarting, [], 'a crash backoff is said by its own line');
  t.same(decideScale({ ...base, lowQueued: 2, oldestWaitMs: 9_000, workers: booting }).heldByStarting, [], 'low-priority jobs never scale up');
  t.same(decideScale({ ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, queued: 5, oldestWaitMs: 9_000, workers: booting }).heldByStarting, [], 'REQUEST_COUNT starts its target at once');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 9_000, workers: [w('a', 'running')] }).heldByStarting, [], 'nothing starting: one starts now');
  // No room in the runtime (every matching GPU held, the engine gone): a start that came due
  // could not happen either, so "held by a starting worker" misled; the held-back line says why.
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 5_000, capacity: 0, workers: booting }).heldByStarting, [], 'held, but the runtime has no room for another anyway');
  t.same(decideScale({ ...base, queued: 5, max: 10, oldestWaitMs: 9_000, capacity: 1, workers: booting }).heldByStarting, [], "this decision's start takes the runtime's last room");
  t.same(decideScale({ ...base, queued: 5, max: 10, oldestWaitMs: 9_000, capacity: 2, workers: booting }).heldByStarting, ['b'], 'room for one more after the start: b holds it');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 5_000, capacity: 1, workers: booting }).heldByStarting, ['b'], 'room for one: b holds it');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 5_000, max: 2, workers: [w('x', 'running', 0, { managed: false }), w('b', 'initializing')] }).heldByStarting, [], 'an external worker fills max with b');
  t.same(decideScale({ ...base, queued: 2, oldestWaitMs: 5_000, workers: booting, exiting: [{ id: 'c' }] }).heldByStarting, [], 'a worker still exiting holds the last place under max');
});

t.test('REQUEST_COUNT says when a worker expected back for more jobs is overdue, so a queued job it did not take gets a worker then', async (t) => {
  const rc = { ...base, scaling: { type: 'REQUEST_COUNT', requestCount: 1 } as const };
  const returning = [w('a', 'running', 0, { uncounted: true, returningMs: 700 }), w('b', 'running', 0, { uncounted: true, returningMs: 300 })];
  t.equal(decideScale({ ...rc, queued: 1, workers: returning }).recheckInMs, 300, 'the first to be overdue');
  t.equal(decideScale({ ...rc, queued: 0, lowQueued: 3, workers: returning }).recheckInMs, 0, 'nothing counted queued: nothing to look again for');
  t.equal(decideScale({ ...rc, queued: 1, workers: [w('a', 'running', 0, { uncounted: true })] }).recheckInMs, 0, 'none expected back: it starts one now instead');
});
