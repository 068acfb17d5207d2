/**
 * A process worker that hangs whole (handler and heartbeat both stuck: SIGSTOP) while it runs a
 * job: the job goes back to the queue at its lease, and the worker, which calls no more, counts
 * as `unhealthy` in `/health`, not `running` for good, and is stopped: it neither holds its place
 * under `workers.max` nor passes for the idle worker `workers.min` keeps, so the next job runs
 * on a new worker. And one whose handler never returns from a job flashd ended while the SDK's
 * heartbeat goes on listing it: stopped a lease after it was told to stop the job.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { startAgent, cpuBody, queueBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

/** Process groups of this test's workers (test/fixtures/workers/) (the process runtime starts each in its own). */
function workerGroups(): number[] {
  const out = execFileSync('ps', ['-eo', 'pid=,ppid=,pgid=,args='], { encoding: 'utf8' });
  const groups = new Set<number>();
  for (const line of out.split('\n')) {
    const m = /^\s*(\d+)\s+(\d+)\s+(\d+)\s+(.*)$/.exec(line);
    if (m && Number(m[2]) === process.pid && (m[4] as string).includes('test/fixtures/workers/')) groups.add(Number(m[3]));
  }
  return [...groups];
}

/** The process group of the one worker running now, killed when the test ends (if it is left). */
function theWorkerGroup(t: Test): number {
  const groups = workerGroups();
  t.equal(groups.length, 1, 'one worker process group');
  const pgid = groups[0] as number;
  t.teardown(() => {
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      // gone already
    }
  });
  return pgid;
}

/**
 * Creates an endpoint from `body` (max 1), runs a 5 s job on its one worker and SIGSTOPs that
 * worker's whole process group while it holds the job.
 */
async function hungOnItsJob(t: Test, a: TestAgent, body: unknown) {
  const ep = (await a.req('POST', '/v2/serverless', { body })).json.id as string;
  const status = async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 5 } } })).json.id as string;
  const hungWorker = await until('the job running', async () => {
    const s = await status(job);
    return s.status === 'IN_PROGRESS' && (s.workerId as string);
  }, 30_000);
  const pgid = theWorkerGroup(t);
  process.kill(-pgid, 'SIGSTOP');
  return { ep, status, job, hungWorker, pgid };
}

t.test('a hung worker whose job went back at its lease is unhealthy, not running, and is stopped and replaced', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 1500, takeHoldMs: 1000, workerStopGraceMs: 2000 });
  // min 1: the worker that min keeps must not be the hung one.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 1, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json;

  await until('the min worker up', async () => (await health()).workers.idle === 1, 30_000);
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 60 } } })).json.id as string;
  await until('the job running', async () => (await health()).jobs.inProgress === 1, 10_000);
  const pgid = theWorkerGroup(t);
  process.kill(-pgid, 'SIGSTOP');

  await until('the job back in the queue at its lease', async () => (await health()).jobs.inQueue === 1, 10_000);
  t.equal((await health()).jobs.retried, 1);
  await a.req('POST', `/v2/${ep}/cancel/${job}`);
  const h = await until('the hung worker counted unhealthy', async () => {
    const now = await health();
    return now.workers.unhealthy === 1 ? now : undefined;
  }, 5000);
  t.match(h.workers, { idle: 0, ready: 0, running: 0, unhealthy: 1 }, 'neither running nor ready');

  // Stopped (SIGKILL once the stop grace is over), and a new worker takes its place under max (1)
  // without waiting for that.
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=30000`, { body: { input: { ok: 1 } } });
  t.equal(r.json.status, 'COMPLETED', 'the next job ran on a new worker');
  await until('the hung worker stopped', async () => workerGroups().every((g) => g !== pgid), 10_000);
  const logs = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
  t.ok(logs.some((l) => /has not called for [\d.]+ s, over --lease-ms \(1\.5 s\): hung, or gone unreported/.test(l.line)), 'the endpoint log says why it was stopped');
  t.notOk(logs.some((l) => /exited unexpectedly/.test(l.line)), 'a stop, not a crash');
});

t.test('at workers.max a hung worker being stopped does not hold its place: its requeued job runs on a replacement at once, not after the stop grace', async (t) => {
  // A long stop grace: the replacement must not wait for the hung worker's SIGKILL.
  const graceMs = 30_000;
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 1500, takeHoldMs: 1000, workerStopGraceMs: graceMs });
  const { ep, status, job, hungWorker, pgid } = await hungOnItsJob(t, a,
    cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 60 } }));
  const stoppedAt = Date.now();

  const s = await until('the job running again, on a replacement', async () => {
    const now = await status(job);
    return now.status === 'IN_PROGRESS' && now.workerId !== hungWorker ? now : undefined;
  }, graceMs);
  const waitedMs = Date.now() - stoppedAt;
  t.ok(waitedMs < graceMs / 2, `the replacement took the job ${waitedMs} ms after the hang, well before the stop grace (${graceMs} ms) ended`);
  t.equal(s.retries, 1, 'requeued once');
  let hungAlive = true;
  try {
    process.kill(-pgid, 0);
  } catch {
    hungAlive = false;
  }
  t.ok(hungAlive, 'the hung worker was still being stopped (its grace not over) when the replacement took the job');
  const logs = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
  t.ok(logs.some((l) => new RegExp(`^stopping worker ${hungWorker}: it has not called for [\\d.]+ s, over --lease-ms \\(1\\.5 s\\): hung, or gone unreported$`).test(l.line)), 'stopped as hung');
  const done = await until('the job done', async () => {
    const now = await status(job);
    return now.status === 'COMPLETED' ? now : undefined;
  }, 20_000);
  t.not(done.workerId, hungWorker, 'completed on the replacement');
  // Not left to the stop grace (flashd's close would wait for it).
  process.kill(-pgid, 'SIGKILL');
});

t.test('a hung GPU worker being stopped keeps its GPU: the replacement waits for its exit, not placed on the same GPU', async (t) => {
  // The fake nvidia-smi (one RTX 4090), for this agent's discovery only.
  const path = process.env['PATH'];
  process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${path ?? ''}`;
  process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'rtx4090-single';
  t.teardown(() => {
    process.env['PATH'] = path;
    delete process.env['FAKE_NVIDIA_SMI_SCENARIO'];
  });
  const graceMs = 5000;
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 1500, takeHoldMs: 1000, workerStopGraceMs: graceMs });
  const { ep, status, job, hungWorker, pgid } = await hungOnItsJob(t, a,
    queueBody({ gpu: { pools: ['ADA_24'] }, args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 60 } }));

  await until('the job back in the queue at its lease', async () => (await status(job)).retries === 1, 10_000);
  let throttled = false;
  // Until the hung worker has exited (SIGKILL at the end of the grace), its GPU stays its own.
  for (;;) {
    const s = await status(job);
    if (!workerGroups().includes(pgid)) break;
    t.not(s.status === 'IN_PROGRESS' && s.workerId !== hungWorker, true, 'no replacement on the GPU the hung worker holds');
    if ((await a.req('GET', `/v2/${ep}/health`)).json.workers.throttled >= 1) throttled = true;
    await new Promise((r) => setTimeout(r, 200));
  }
  t.ok(throttled, 'the replacement waited throttled for the GPU');
  const done = await until('the job done on a replacement', async () => {
    const now = await status(job);
    return now.status === 'COMPLETED' ? now : undefined;
  }, 30_000);
  t.not(done.workerId, hungWorker, 'on a new worker, once the GPU was free');
});

/**
 * An endpoint of `max` 1 whose one worker runs `script` and a job with `input` that its handler
 * never returns from, timed out by flashd after 5 s: the endpoint, the job's status, its id and
 * the worker that holds it.
 */
async function timedOutOnHungWorker(t: Test, script: string, input: Record<string, unknown>, workerStopGraceMs = 2000) {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 3000, takeHoldMs: 1000, workerStopGraceMs });
  // max 1: while the hung worker holds its place, nothing else runs.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: `python3 -u ${script}`, workers: { min: 0, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const status = async (id: string) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
  const hung = (await a.req('POST', `/v2/${ep}/run`, { body: { input, policy: { executionTimeout: 5000 } } })).json.id as string;
  const worker = await until('the job running', async () => {
    const s = await status(hung);
    return s.status === 'IN_PROGRESS' && (s.workerId as string);
  }, 30_000);
  return { a, ep, status, hung, worker };
}

t.test('a worker whose handler runs on, a lease after flashd timed its job out and told it to stop, is stopped and replaced', async (t) => {
  // A sync handler in a call that does not return (time.sleep(1000)); the SDK's heartbeat, its
  // own process, keeps pinging and listing the job.
  const { a, ep, status, hung, worker } = await timedOutOnHungWorker(t, 'test/fixtures/workers/echo.py', { sleep: 1000 });
  const pgid = theWorkerGroup(t);
  await until('the execution timeout', async () => (await status(hung)).status === 'TIMED_OUT', 15_000);

  // The next job gets the endpoint's one place once the hung worker is stopped (SIGKILL at the
  // end of the stop grace: its handler ignores SIGTERM's request to finish).
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=60000`, { body: { input: { ok: 1 } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.not(r.json.workerId, worker, 'on a new worker');
  t.same(workerGroups().filter((g) => g === pgid), [], 'the hung worker is gone');

  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[]).filter((l) => l.workerId === worker);
  t.ok(lines.some((l) => l.line === `job ${hung} ended on worker ${worker} (timed out: execution timeout 5 s): the worker was told to stop it (job-stop)`),
    'the endpoint log says flashd ended the job on the worker');
  const stopping = lines.find((l) => l.line.startsWith(`stopping worker ${worker}:`))?.line;
  t.match(stopping, new RegExp(`: it still runs job ${hung} [\\d.]+ s after flashd ended it \\(timed out: execution timeout 5 s\\), over --lease-ms \\(3 s\\)$`),
    `the endpoint log says why it was stopped: ${stopping}`);
  t.notOk(lines.some((l) => /exited unexpectedly/.test(l.line)), 'a stop, not a crash');
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.workers.unhealthy, 0, 'no unhealthy worker');
});

t.test('a worker in its stop grace that runs only a job flashd ended is in none of /health\'s counts, as the endpoint log\'s "no worker up" says', async (t) => {
  // Its handler ignores SIGTERM (a sync sleep): it lives out a long stop grace. /health counted
  // it running (its ended job's stop still pending) while the start beside it said no worker up.
  const graceMs = 8000;
  const { a, ep, status, hung, worker } = await timedOutOnHungWorker(t, 'test/fixtures/workers/echo.py', { sleep: 1000 }, graceMs);
  const pgid = theWorkerGroup(t);
  await until('the execution timeout', async () => (await status(hung)).status === 'TIMED_OUT', 15_000);
  const next = a.req('POST', `/v2/${ep}/runsync?wait=60000`, { body: { input: { ok: 3 } } });
  const logs = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[]);
  await until('the hung worker being stopped', async () => (await logs()).some((l) => l.line.startsWith(`stopping worker ${worker}: it still runs job ${hung} `)), 15_000);
  const h = (await a.req('GET', `/v2/${ep}/health`)).json;
  t.ok(workerGroups().includes(pgid), 'still in its stop grace');
  t.match(h.workers, { idle: 0, running: 0, ready: 0 }, 'neither running nor idle while it exits: it holds no job and takes none');
  const r = await next;
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.not(r.json.workerId, worker, 'on a new worker');
  t.ok((await logs()).some((l) => /^starting worker \S+ \(process runtime\): cold start: 1 job\(s\) waiting and no worker up/.test(l.line)),
    'the endpoint log said no worker was up');
});

t.test('the same for a worker that never asks job-stop (runpod-python): counted from the end of its job, not from a stop it never asked for', async (t) => {
  const { a, ep, status, hung, worker } = await timedOutOnHungWorker(t, 'test/fixtures/workers/never_asks_stop.py', { hang: true });
  const pgid = theWorkerGroup(t);
  await until('the execution timeout', async () => (await status(hung)).status === 'TIMED_OUT', 15_000);

  const r = await a.req('POST', `/v2/${ep}/runsync?wait=60000`, { body: { input: { ok: 2 } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.same(r.json.output, { ok: 2 });
  t.not(r.json.workerId, worker, 'on a new worker');
  t.same(workerGroups().filter((g) => g === pgid), [], 'the hung worker is gone');
  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[]).filter((l) => l.workerId === worker);
  t.ok(lines.some((l) => l.line.startsWith(`stopping worker ${worker}: it still runs job ${hung} `)), 'the endpoint log says why it was stopped');
  t.notOk(lines.some((l) => /exited unexpectedly/.test(l.line)), 'a stop, not a crash');
});

t.test('an idle worker that hangs whole with a job-take open is unhealthy and stopped a lease after its last ping, not after the take\'s hold plus a lease', async (t) => {
  // A take hold far longer than the lease: the idle worker's take stays open all along, and only
  // its heartbeat (pinging every lease/3 whatever it holds) says it is alive.
  const takeHoldMs = 60_000;
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 3000, takeHoldMs, workerStopGraceMs: 5000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 1, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json;
  await until('the min worker up', async () => (await health()).workers.idle === 1, 30_000);
  // A live idle worker is never taken for hung, however long its take is held.
  await new Promise((r) => setTimeout(r, 4500));
  t.match((await health()).workers, { idle: 1, unhealthy: 0 }, 'a live idle worker past a lease is still idle');
  const pgid = theWorkerGroup(t);
  process.kill(-pgid, 'SIGSTOP');
  const hungAt = Date.now();

  // Unhealthy a lease after its last ping, and stopped at the autoscaler's next pass (within a
  // second); the line gives the time since that ping, not the lease.
  const m = await until('the hung worker stopped, and why', async () => {
    const logs = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return logs.map((l) => /^stopping worker (\S+): it has not called for ([\d.]+) s, over --lease-ms \(3 s\): hung, or gone unreported$/.exec(l.line)).find((x) => x !== null) ?? undefined;
  }, 15_000);
  const waitedMs = Date.now() - hungAt;
  t.ok(waitedMs < takeHoldMs / 4, `stopped ${waitedMs} ms after the hang, not after the take's hold (${takeHoldMs} ms)`);
  const silentS = Number(m[2]);
  t.ok(silentS >= 3 && silentS < takeHoldMs / 4000, `silent for ${silentS} s: at least the lease, far less than the take's hold`);
  t.match((await health()).workers, { idle: 0, unhealthy: 1 }, 'counted unhealthy, not idle, while it is killed');
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=30000`, { body: { input: { ok: 1 } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.not(r.json.workerId, m[1], 'the next job ran on a new worker');
  t.notOk(r.json.retries, 'not handed to the hung worker first');
  await until('the hung worker stopped', async () => workerGroups().every((g) => g !== pgid), 10_000);
});

t.test('a worker that does not ping while idle (job-take only) is not taken for hung while its take is held past a lease', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, leaseMs: 1500, takeHoldMs: 5000, workerStopGraceMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/late_sigterm.py', workers: { min: 1, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const health = async () => (await a.req('GET', `/v2/${ep}/health`)).json;
  await until('the min worker up', async () => (await health()).workers.idle === 1, 30_000);
  let unhealthy = 0;
  for (const deadline = Date.now() + 4000; Date.now() < deadline;) {
    unhealthy = Math.max(unhealthy, (await health()).workers.unhealthy as number);
    await new Promise((r) => setTimeout(r, 250));
  }
  t.equal(unhealthy, 0, 'idle all along, though its take was held past the lease');
  const logs = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
  t.notOk(logs.some((l) => /has not called/.test(l.line)), 'not stopped');
});
