/**
 * When the process runtime's workers start and stop, end to end: real flashd, real worker
 * processes running the vendor_flash SDK, real HTTP. The loop's wake-ups (QUEUE_DELAY's
 * deadline, a new worker's first job-take, a replaced worker's last job, the end of a crash
 * backoff) and idle time.
 */
import { mock } from 'node:test';
import t from 'tap';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { TestWorker } from '../helpers/worker.js';

const health = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/${ep}/health`)).json;

t.test('a worker freed from a job flashd ended (cancel) gets its full idleTimeout, counted from when its handler returned', async (t) => {
  // A lease longer than the handler runs on after the cancel: one that ran on a lease after it
  // was told to stop would be stopped (process-hung.test.ts).
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 10_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 3 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 5 } } })).json.id as string;
  await until('the job to run', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'IN_PROGRESS');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).json.status, 'CANCELLED');
  // The sync handler cannot be interrupted: the worker is busy until it returns (about 5 s).
  await until('the worker to be busy with the cancelled job', async () => (await health(a, ep)).workers.running === 1);
  await until('the handler to return', async () => (await health(a, ep)).workers.idle === 1, 15_000);
  const freed = Date.now();
  // It was busy, not idle, for the last 5 s: no stop before its 3 s of idleness.
  await new Promise((r) => setTimeout(r, 2000));
  t.same(pick((await health(a, ep)).workers), { idle: 1, running: 0 }, 'still idle 2 s after its handler returned');
  await until('the idle stop', async () => (await health(a, ep)).workers.idle === 0, 10_000);
  t.ok(Date.now() - freed >= 2900, `stopped ${Date.now() - freed} ms after it became idle`);
  const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
  const why = lines.map((l) => /stopping worker .*: idle for ([\d.]+) s/.exec(l.line)).find(Boolean);
  t.ok(why && Number(why[1]) < 5, `the log counts the idle time from the handler's return: ${why?.[0]}`);
});

function pick(w: { idle: number; running: number }): { idle: number; running: number } {
  return { idle: w.idle, running: w.running };
}

t.test('QUEUE_DELAY adds the worker when the oldest job has waited queueDelay, not at the next 1 s tick after', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 4, idleTimeout: 30 }, scaling: { type: 'QUEUE_DELAY', queueDelay: 0.5 } }),
  })).json.id as string;
  const first = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 10 } } })).json.id as string;
  await until('the first worker to run its job', async () => (await a.req('GET', `/v2/${ep}/status/${first}`)).json.status === 'IN_PROGRESS');
  // Three waits, each starting at a different point of the loop's 1 s tick: a scale-up held
  // for the tick came 0.5–1.5 s after the submit, 1 s on average.
  const waits: number[] = [];
  for (let i = 0; i < 3; i++) {
    const before = Date.now();
    await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 10 } } });
    const line = await until(`scale-up ${i + 1}`, async () => {
      const lines = (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as { line: string; at: string }[];
      return lines.filter((l) => /starting worker .*: QUEUE_DELAY/.test(l.line))[i];
    }, 5000);
    waits.push(Date.parse(line.at) - before);
    t.match(line.line, /the oldest job has waited 0\.[5-7] s \(queueDelay 0\.5 s\)/, line.line);
    await until(`worker ${i + 2} to take its job`, async () => (await health(a, ep)).workers.running === i + 2, 10_000);
    await new Promise((r) => setTimeout(r, 330));
  }
  t.ok(waits.every((ms) => ms >= 450 && ms < 750), `started ${waits.join(', ')} ms after the job was submitted`);
});

t.test('QUEUE_DELAY under a backlog: the next worker starts as soon as the last one is up, not at the next 1 s tick', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  // A queueDelay longer than a boot: while one starts the next is due only after a further
  // queueDelay (a slow boot's pace, below), so here each next one waits for the last to be up.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 4, idleTimeout: 30 }, scaling: { type: 'QUEUE_DELAY', queueDelay: 3 } }),
  })).json.id as string;
  for (let i = 0; i < 8; i++) await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 10 } } });
  type Line = { line: string; at: string; workerId: string; stream: string };
  const lines = await until('four workers running', async () => {
    const all = (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[];
    return (await health(a, ep)).workers.running === 4 && all;
  }, 30_000);
  const starts = lines.filter((l) => l.stream === 'system' && /^starting worker /.test(l.line));
  t.equal(starts.length, 4);
  // A worker is up once it takes its first job; the SDK logs "Started." for it just after (the
  // next worker may start before that line arrives). The cold-started first worker is up before
  // the oldest job has waited queueDelay, so the steps after the second one show the wake-up.
  const upAt = (workerId: string) => Date.parse((lines.find((l) => l.workerId === workerId && l.stream === 'stdout' && /"message": "Started\."/.test(l.line)) as Line).at);
  const prev = starts.slice(1, -1);
  const gaps = starts.slice(2).map((s, i) => Date.parse(s.at) - upAt((prev[i] as Line).workerId));
  // On a loaded host a boot can take longer than queueDelay; then the pacing rule (one more per
  // further queueDelay waited while one starts) may rightly start the next before the last is up.
  // Only a boot that slow excuses an early start; a late one (the 1 s tick) is never excused.
  const boots = prev.map((s) => upAt(s.workerId) - Date.parse(s.at));
  t.ok(gaps.every((ms, i) => ms < 300 && (ms > -300 || (boots[i] as number) > 2500)),
    `each next worker started ${gaps.join(', ')} ms after the previous one was up (boots ${boots.join(', ')} ms)`);
});

t.test('a worker to be replaced stops as soon as its last job is done, not at the next 1 s tick (it shows idle until then)', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, workers: { min: 0, max: 3 } }),
  })).json.id as string;
  const ids = await Promise.all([0.6, 1.0, 1.4].map(async (sleep) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep } } })).json.id as string));
  await until('three jobs running on three workers', async () => (await health(a, ep)).workers.running === 3, 20_000);
  // A new configuration: every worker finishes its job, takes no new one and stops.
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { X: '1' } } })).json.restartReasons[0], 'env');
  const done = await Promise.all(ids.map((id) => until(`job ${id}`, async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'COMPLETED' && s;
  }, 20_000)));
  type Line = { line: string; at: string; workerId: string; stream: string };
  // Both lines of each worker: its stdout may reach the log after flashd's stop line (a pipe).
  const lines = await until('the three stops and the three finished lines', async () => {
    const all = (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[];
    const has = (workerId: string, re: RegExp) => all.some((l) => l.workerId === workerId && re.test(l.line));
    return done.every((j) => has(j.workerId, /"message": "Finished\."/) && has(j.workerId, /^stopping worker .*: recycled/)) && all;
  }, 10_000);
  // The SDK logs "Finished." (runpod-python's line) after its result post got its answer.
  const lags = done.map((j) => {
    const finished = lines.find((l) => l.workerId === j.workerId && /"message": "Finished\."/.test(l.line)) as Line;
    const stopping = lines.find((l) => l.workerId === j.workerId && /^stopping worker .*: recycled/.test(l.line)) as Line;
    return Date.parse(stopping.at) - Date.parse(finished.at);
  });
  t.ok(lags.every((ms) => ms < 200), `stopped ${lags.join(', ')} ms after their last job was done`);
});

t.test('a worker flashd is stopping is not counted idle while it takes its time to exit', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 6000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/deaf_to_sigterm.py', workers: { min: 1, max: 1, idleTimeout: 1 } }),
  })).json.id as string;
  await until('the warm worker to be up', async () => (await health(a, ep)).workers.idle === 1, 15_000);
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: 0, max: 1, idleTimeout: 1 } } })).status, 200);
  await until('the idle stop', async () => {
    const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return lines.some((l) => /stopping worker .*: idle/.test(l.line));
  }, 10_000);
  // It ignores SIGTERM and polls on for the 6 s grace: it takes no job, so it is not idle.
  for (let i = 0; i < 5; i++) {
    const w = (await health(a, ep)).workers;
    t.same({ idle: w.idle, ready: w.ready }, { idle: 0, ready: 0 }, `${i * 500} ms into the grace: not idle, not ready`);
    await new Promise((r) => setTimeout(r, 500));
  }
});

t.test('REQUEST_COUNT: a job waiting behind a worker busy with a low-priority job or a cancelled one gets a worker of its own', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, workers: { min: 1, max: 3 } }),
  })).json.id as string;
  await until('the warm worker to be up', async () => (await health(a, ep)).workers.idle === 1, 15_000);
  const status = async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status as string;
  // The warm worker takes a long low-priority job; a normal job submitted then is counted, the
  // worker running the low-priority one serves none of the counted jobs.
  const low = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 15 }, policy: { lowPriority: true } } })).json.id as string;
  await until('the low-priority job to run', async () => (await status(low)) === 'IN_PROGRESS', 10_000);
  const first = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 15 } } })).json.id as string;
  await until('a second worker to run the normal job', async () => (await status(first)) === 'IN_PROGRESS', 10_000);
  t.equal((await health(a, ep)).workers.running, 2, 'two workers running');
  // The same for a job flashd ended that the worker still runs (a sync handler cannot be
  // interrupted): it counts as running, so a queued job gets another worker.
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${first}`)).json.status, 'CANCELLED');
  const second = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 1 } } })).json.id as string;
  await until('a third worker to run the next job', async () => (await status(second)) === 'COMPLETED', 10_000);
  t.equal(await status(low), 'IN_PROGRESS', 'the low-priority job is still running');
  await a.req('POST', `/v2/${ep}/cancel/${low}`);
});

t.test("the end of a crash backoff wakes the loop: the next start does not wait for the 1 s tick", async (t) => {
  // flashd's setInterval timers (the loop's 1 s tick among them) are made inert for this agent,
  // so only the loop's own wake-ups can start a worker once the backoff is over.
  mock.timers.enable({ apis: ['setInterval'] });
  let a: TestAgent;
  try {
    a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  } finally {
    mock.timers.reset();
  }
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(1)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const lines = async () => (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as { line: string; at: string }[];
  const backoff = await until('three crashes and the 2 s backoff', async () =>
    (await lines()).find((l) => /^3 workers crashed in a row: no new worker for 2 s \(crash backoff\)$/.test(l.line)), 20_000);
  const fourth = await until('a fourth start once the backoff is over', async () => (await lines()).filter((l) => /^starting worker /.test(l.line))[3], 15_000);
  const after = Date.parse(fourth.at) - Date.parse(backoff.at);
  t.ok(after >= 1900, `not before the backoff ended: ${after} ms after it began`);
  // The crash loop goes on until flashd stops: stop it here, not while tap removes the data
  // directory it is still writing to (under load that removal raced a launch: ENOTEMPTY).
  await a.agent.close();
});

t.test('REQUEST_COUNT: a worker busy with a low-priority job that has free slots (concurrency above 1) takes the next job itself, between its job-takes too', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 60_000, workerStopGraceMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, workers: { min: 0, max: 3 } }),
  })).json.id as string;
  const starts = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as { line: string; at: string }[]).filter((l) => /starting worker/.test(l.line));
  // An external worker with four slots (a concurrency_modifier of 4) takes a low-priority job: its
  // job-take asked for four, got one, and it comes back for three more. A job queued before it
  // is back (the moment between the answer and its next take) is its to take: the vendor_flash
  // SDK asks again within milliseconds, and it took its own worker, which then stood idle.
  const x = await TestWorker.create(a, ep);
  const low = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, policy: { lowPriority: true } } })).json.id as string;
  t.same((await x.takeBatch(4)).jobs.map((j) => j.id), [low], 'the worker took the low-priority job, one of the four it asked for');
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await new Promise((r) => setTimeout(r, 300));
  t.same(await starts(), [], 'no worker started for a job the worker with free slots is coming back for');
  t.same((await x.takeBatch(3)).jobs.map((j) => j.id), [job], 'it took the job with its next job-take');
  // Past the time it had to come back: the loop looked again, and the job is taken.
  await new Promise((r) => setTimeout(r, 1500));
  t.same(await starts(), [], 'nor once it was overdue, the job taken');
  t.equal((await x.done(job, { output: 'ok' })).status, 200);
  // One that does not come back (runpod-python's sync handler blocks the loop that takes jobs) is
  // busy with the low-priority job after a second: the next job gets a worker of its own, as
  // with concurrency 1, not after the low-priority job.
  t.same((await x.takeBatch(3)).jobs, [], 'its hold ran out with nothing for it: it would come back now, and does not');
  const before = Date.now();
  const next = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const line = await until('a worker to start for the job', async () => (await starts())[0], 5000);
  t.match(line.line, /beside the 1 busy with low-priority or ended jobs/, line.line);
  t.ok(Date.parse(line.at) - before < 2500, `it started ${Date.parse(line.at) - before} ms after the submit`);
  await until('the job to complete on the new worker', async () => (await a.req('GET', `/v2/${ep}/status/${next}`)).json.status === 'COMPLETED', 15_000);
  t.not((await a.req('GET', `/v2/${ep}/status/${next}`)).json.workerId, x.workerId, 'not on the worker busy with the low-priority job');
  await x.done(low, { output: 'ok' });
});

t.test('low-priority jobs with no worker up wait, and the endpoint log says why, once', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 5 } }),
  })).json.id as string;
  const low = await Promise.all([1, 2].map(async (n) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n }, policy: { lowPriority: true } } })).json.id as string));
  type Line = { line: string; workerId: string | null; stream: string };
  // No count: said once while they wait, a number would be that of the first pass only.
  const said = (l: Line) => /^low-priority jobs wait with no worker up: policy\.lowPriority never starts a worker/.test(l.line);
  const lines = await until('the log to say why they wait', async () => {
    const all = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
    return all.some(said) && all;
  }, 5000);
  t.equal(lines.filter((l) => l.stream === 'system' && /^starting worker/.test(l.line)).length, 0, 'no worker started for them');
  await new Promise((r) => setTimeout(r, 2500));
  const later = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
  t.equal(later.filter(said).length, 1, 'said once, not at every tick');
  // A normal job starts a worker, which then takes the low-priority ones too.
  const normal = await a.req('POST', `/v2/${ep}/runsync?wait=30000`, { body: { input: { n: 0 } } });
  t.equal(normal.json.status, 'COMPLETED', normal.text);
  for (const id of low) {
    await until(`low-priority job ${id}`, async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'COMPLETED', 15_000);
  }
});

t.test('jobs to an endpoint with workers.max 0 wait, and the endpoint log says why, once', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 0 } }),
  })).json.id as string;
  const ids = [
    (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string,
    (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 }, policy: { lowPriority: true } } })).json.id as string,
  ];
  type Line = { line: string; workerId: string | null; stream: string };
  const said = (l: Line) => l.stream === 'system' && /^jobs wait with no worker up: workers\.max is 0, so flashd starts no worker/.test(l.line);
  const lines = await until('the log to say why they wait', async () => {
    const all = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
    return all.some(said) && all;
  }, 5000);
  await new Promise((r) => setTimeout(r, 2500));
  const later = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
  t.equal(later.filter(said).length, 1, 'said once, not at every tick');
  t.equal(later.filter((l) => /low-priority jobs wait/.test(l.line)).length, 0, 'not blamed on lowPriority: a normal job waits too');
  t.equal(lines.filter((l) => /^starting worker/.test(l.line)).length, 0, 'no worker started');
  // Raising max starts a worker, which runs them.
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { max: 1 } } })).status, 200);
  for (const id of ids) {
    await until(`job ${id}`, async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'COMPLETED', 15_000);
  }
});

t.test('with no runtime, jobs to an endpoint with workers.max 0 and no worker up are said too; low-priority ones only where flashd starts workers', async (t) => {
  const a = await startAgent(t, { runtime: 'none', takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const low = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 1 } }) })).json.id as string;
  type Line = { line: string; stream: string };
  const said = (l: Line) => l.stream === 'system' && /^jobs wait with no worker up: workers\.max is 0, so flashd starts no worker/.test(l.line);
  // README's external-worker setup: a worker of its own calls once, then dies.
  const x = await TestWorker.create(a, ep);
  t.equal(await x.take(), null, 'the external worker asked for a job: none yet');
  await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } });
  await a.req('POST', `/v2/${low}/run`, { body: { input: { n: 1 }, policy: { lowPriority: true } } });
  await new Promise((r) => setTimeout(r, 1500));
  t.equal(((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[]).filter(said).length, 0, 'not while the external worker is up');
  await until('the log to say why they wait once it is gone', async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[]).some(said), 15_000);
  await new Promise((r) => setTimeout(r, 2500));
  t.equal(((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[]).filter(said).length, 1, 'said once, not at every tick');
  t.ok(a.logs.some((l) => /jobs wait with workers.max 0 and no worker up/.test(l)), "flashd's log says it too");
  const lowLines = (await a.req('GET', `/v2/serverless/${low}/logs`)).json as Line[];
  t.equal(lowLines.filter((l) => /low-priority jobs wait/.test(l.line)).length, 0, 'with no runtime every job waits for an external worker alike: no low-priority line');
});

t.test('a PATCH that needs a restart says in the log which busy workers are replaced, and their replacement says why it starts', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 2, idleTimeout: 5 } }),
  })).json.id as string;
  const long = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 6 } } })).json.id as string;
  await until('the first job to run', async () => (await a.req('GET', `/v2/${ep}/status/${long}`)).json.status === 'IN_PROGRESS', 10_000);
  const old = (await a.req('GET', `/v2/${ep}/status/${long}`)).json.workerId as string;
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { V: '2' } } });
  t.same(patched.json.restartReasons, ['env']);
  const next = await a.req('POST', `/v2/${ep}/runsync?wait=30000`, { body: { input: { n: 1 } } });
  t.equal(next.json.status, 'COMPLETED', next.text);
  t.not(next.json.workerId, old, 'the job after the PATCH ran on a new worker');
  type Line = { line: string; workerId: string | null; stream: string };
  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[]).filter((l) => l.stream === 'system');
  const said = lines.find((l) => l.workerId === old && /runs the endpoint's old configuration/.test(l.line));
  t.ok(said, `the busy worker's replacement is announced: ${lines.map((l) => l.line).join(' | ')}`);
  t.match(said?.line, /\(changed: env\): it finishes its jobs, takes no new one and is replaced$/);
  const start = lines.find((l) => l.workerId === next.json.workerId && /^starting worker/.test(l.line));
  t.ok(start, 'the replacement start is logged');
  t.notMatch(start?.line, /no worker up/, `a worker (of the old configuration) was up: ${start?.line}`);
  t.match(start?.line, /replacing 1 worker\(s\) of the old configuration/);
  await until('the long job to complete', async () => (await a.req('GET', `/v2/${ep}/status/${long}`)).json.status === 'COMPLETED', 15_000);
});

t.test('a PATCH that needs a restart says that the external (worker-env) workers still up keep the old configuration', async (t) => {
  const a = await startAgent(t, { runtime: 'none', takeHoldMs: 200, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ env: { V: '1' } }) })).json.id as string;
  const none = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const x1 = await TestWorker.create(a, ep);
  const x2 = await TestWorker.create(a, ep);
  t.equal(await x1.take(), null, 'the first external worker asked for a job');
  t.equal(await x2.ping(), 200, 'the second one pinged');
  type Line = { line: string; workerId: string | null; stream: string };
  const said = async (id: string) => ((await a.req('GET', `/v2/serverless/${id}/logs`)).json as Line[])
    .filter((l) => l.stream === 'system' && /external worker/.test(l.line));

  t.same((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { name: 'renamed' } })).json.restartReasons, [], 'a rename needs no restart');
  t.same(await said(ep), [], 'nor a line');
  t.same((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { V: '2' } } })).json.restartReasons, ['env']);
  const lines = await said(ep);
  t.equal(lines.length, 1, `one line: ${lines.map((l) => l.line).join(' | ')}`);
  t.equal(lines[0]?.workerId, null, "the endpoint's, not a worker's");
  t.match(lines[0]?.line, /^2 external worker\(s\) \(worker-env\) still run the endpoint's old configuration \(changed: env\)/);
  t.match(lines[0]?.line, new RegExp(`${x1.workerId}.*${x2.workerId}|${x2.workerId}.*${x1.workerId}`), 'naming them');
  t.match(lines[0]?.line, /flashd cannot restart workers it did not start, so whoever runs them must restart them on the new configuration$/);
  t.ok(a.logs.some((l) => /external workers run the old configuration/.test(l) && l.includes(ep) && /externalWorkers=2/.test(l)), "flashd's log says it too");

  t.same((await a.req('PATCH', `/v2/serverless/${none}`, { body: { env: { V: '2' } } })).json.restartReasons, ['env']);
  t.same(await said(none), [], 'no line when no external worker is up');
});

t.test('an idle worker that takes no job (no job-take open for 2 s: concurrency_modifier 0) holds off no QUEUE_DELAY scale-up, and the start says why', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 30_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 2, idleTimeout: 30 }, scaling: { type: 'QUEUE_DELAY', queueDelay: 1 } }),
  })).json.id as string;
  // An external worker whose concurrency_modifier went to 0: its heartbeat pings, it asks for no job.
  const x = await TestWorker.create(a, ep);
  t.equal(await x.take(), null, 'it asked once (the hold ran out), then its modifier returned 0');
  const pinging = setInterval(() => void x.ping().catch(() => undefined), 1000);
  t.teardown(() => clearInterval(pinging));
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  t.match((await health(a, ep)).workers, { idle: 1, ready: 1, running: 0 }, '/health counts it idle, as RunPod does');
  await until('the job to run on a worker flashd starts beside it', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'COMPLETED', 20_000);
  type Line = { line: string; workerId: string | null; stream: string };
  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[]).filter((l) => l.stream === 'system');
  const start = lines.find((l) => /^starting worker/.test(l.line));
  t.match(start?.line, /QUEUE_DELAY: .* no worker is idle \(1 idle worker\(s\) take no job: paused intake\)/, `the start says why: ${start?.line}`);
  t.match((await health(a, ep)).workers, { idle: 2, ready: 2 }, 'both count idle: the one started, and the paused one');
});

t.test('jobs that wait behind idle workers taking none, with no worker to start for them, are said once in the endpoint log', async (t) => {
  // No runtime: nothing can start beside the paused worker, so /health shows an idle worker and
  // a queue that does not move.
  const a = await startAgent(t, { runtime: 'none', takeHoldMs: 300, leaseMs: 30_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 1, idleTimeout: 30 } }) })).json.id as string;
  const x = await TestWorker.create(a, ep);
  t.equal(await x.take(), null, 'it asked once (the hold ran out), then its modifier returned 0');
  const pinging = setInterval(() => void x.ping().catch(() => undefined), 500);
  t.teardown(() => clearInterval(pinging));
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  type Line = { line: string; workerId: string | null; stream: string };
  const said = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[])
    .filter((l) => l.stream === 'system' && /^jobs wait while 1 idle worker\(s\) take none/.test(l.line));
  const first = await until('the endpoint log to say why the job waits', async () => (await said())[0], 10_000);
  t.equal(first.workerId, null, "the endpoint's line");
  t.match(first.line, new RegExp(`\\(${x.workerId}\\): they hold no job and have had no job-take open for over 2 s .*no worker starts for the jobs`));
  t.ok(a.logs.some((l) => /jobs wait while idle workers take none/.test(l) && l.includes(ep)), "flashd's log says it too");
  await new Promise((r) => setTimeout(r, 2500));
  t.equal((await said()).length, 1, 'said once while they wait');
  t.equal((await x.take())?.id, id, 'asking again, it gets the job');
  t.equal((await x.done(id, { output: 1 })).status, 200);
});

t.test('QUEUE_DELAY says why no second worker starts for the one job waiting while a slow one boots past queueDelay', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  // A slow start (a model loading before runpod.serverless.start): 4 s before its first job-take.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({
      args: 'sh -c "sleep 4; exec python3 -u test/fixtures/workers/echo.py"',
      scaling: { type: 'QUEUE_DELAY', queueDelay: 1 }, workers: { min: 0, max: 3, idleTimeout: 5 },
    }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  const logs = async () => (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string | null }[];
  const held = await until('the hold in the endpoint log', async () => (await logs()).find((l) => /still starting/.test(l.line)), 8000);
  const started = (await logs()).filter((l) => /^starting worker/.test(l.line));
  t.equal(started.length, 1, 'one worker starting');
  const booting = started[0]?.workerId as string;
  t.equal(held.line, `jobs have waited over queueDelay (1 s) while worker ${booting} is still starting: QUEUE_DELAY starts one more worker for each further 1 s the oldest job waits while workers start, and no more starting than jobs waiting`,
    'the endpoint log says what holds the next worker back');
  t.equal(held.workerId, null, 'an endpoint line, not one of the worker');
  t.ok(a.logs.some((l) => /QUEUE_DELAY start held by a starting worker .*workerIds=/.test(l)), "flashd's log says it too");
  await until('the job to complete', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'COMPLETED', 15_000);
  t.equal((await logs()).filter((l) => /still starting/.test(l.line)).length, 1, 'said once while it booted');
});

t.test('QUEUE_DELAY with a slow boot: a backlog starts one more worker each further queueDelay while they boot, not one per boot time', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  // A model loading for 8 s before runpod.serverless.start: one worker per boot time would start
  // the third after 16 s. Paced by queueDelay, it starts when the oldest job has waited 3 s.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({
      args: 'sh -c "sleep 8; exec python3 -u test/fixtures/workers/echo.py"',
      scaling: { type: 'QUEUE_DELAY', queueDelay: 1 }, workers: { min: 0, max: 3, idleTimeout: 5 },
    }),
  })).json.id as string;
  const submitted = Date.now();
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: i } } })).json.id as string);
  type Line = { line: string; workerId: string | null };
  const logs = async () => (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[];
  const starts = await until('three workers starting', async () => {
    const s = (await logs()).filter((l) => /^starting worker /.test(l.line));
    return s.length >= 3 && s;
  }, 7000);
  t.ok(Date.now() - submitted < 8000, `three started ${Date.now() - submitted} ms after the submits, while the first still boots`);
  t.same((await health(a, ep)).workers.running, 0, 'none is up yet');
  t.match(starts[1]?.line, /QUEUE_DELAY: the oldest job has waited [\d.]+ s \(queueDelay 1 s\) and no worker is idle \(1 still starting: one more for each further queueDelay waited\)/, String(starts[1]?.line));
  t.match(starts[2]?.line, /\(2 still starting: /, String(starts[2]?.line));
  await new Promise((r) => setTimeout(r, 1500));
  t.equal((await logs()).filter((l) => /^starting worker /.test(l.line)).length, 3, 'no more than workers.max');
  for (const id of ids) await until(`job ${id}`, async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'COMPLETED', 20_000);
});
