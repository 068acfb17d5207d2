/**
 * The process runtime's crash loops and recycled workers: the crash backoff, its cap and its reset
 * by a PATCH, unhealthy counts within max, start failures, and refresh_worker.
 */
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

const health = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/${ep}/health`)).json;

t.test('a PATCH that replaces a crash-looping configuration starts its worker without the old backoff', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(1)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  // Five crashes within a minute: the next start would wait 8 s.
  await until('five crashes', async () => {
    const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return lines.filter((l) => /exited unexpectedly/.test(l.line)).length >= 5;
  }, 40_000);
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { args: 'python3 -u test/fixtures/workers/echo.py' } });
  t.same(patched.json.restartReasons, ['args']);
  const started = performance.now();
  const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { ok: 1 } } });
  t.equal(r.json.status, 'COMPLETED');
  const took = performance.now() - started;
  t.ok(took < 5000, `the fixed configuration ran a job ${Math.round(took)} ms after the PATCH`);
});

t.test('a crash loop backs off up to 60 s and stays there: the wait never falls back as old crashes age', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(1)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const crashes = async () =>
    ((await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as { line: string }[]).filter((l) => /exited unexpectedly/.test(l.line)).length;
  await until('three crashes in a row', async () => (await crashes()) >= 3, 20_000);
  const said = async (re: RegExp) => ((await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as { line: string }[]).some((l) => re.test(l.line));
  await until('the backoff in the log', () => said(/^3 workers crashed in a row: no new worker for 2 s \(crash backoff\)$/), 5000);
  // Then 2, 4, 8, 16 and 32 s between starts: the clock moves exactly that far each time.
  let n = 3;
  for (const wait of [2, 4, 8, 16, 32]) {
    clock.advance(wait * 1000);
    n++;
    await until(`crash ${n} after the ${wait} s backoff`, async () => (await crashes()) >= n, 10_000);
  }
  // Eight crashes in a row: the next start waits 60 s. (With the crashes of a sliding minute,
  // the first ones had aged out by now and the wait fell back to 8 s.)
  clock.advance(9_000);
  await new Promise((r) => setTimeout(r, 2500));
  t.equal(await crashes(), 8, 'no start 9 s after the eighth crash');
  t.ok(await said(/^8 workers crashed in a row: no new worker for 60 s/), 'the log says how long starts wait');
  clock.advance(51_000);
  await until('a start once the 60 s are over', async () => (await crashes()) >= 9, 10_000);
  clock.advance(30_000);
  await new Promise((r) => setTimeout(r, 2500));
  t.equal(await crashes(), 9, 'still 60 s after the ninth crash, not less');
});

t.test('a crash loop shows at most workers.max workers, the crashed ones included: unhealthy does not pile up', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(3)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const crashes = async () =>
    ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).filter((l) => /exited unexpectedly/.test(l.line)).length;
  let most = 0;
  let mostUnhealthy = 0;
  const seen: string[] = [];
  // Crashes at once, at once, then after 2 and 4 s of backoff: four within about 7 s.
  await until('four crashes', async () => {
    const w = (await health(a, ep)).workers;
    most = Math.max(most, w.initializing + w.idle + w.running + w.unhealthy);
    mostUnhealthy = Math.max(mostUnhealthy, w.unhealthy);
    seen.push(JSON.stringify(w));
    return (await crashes()) >= 4;
  }, 20_000);
  t.equal(mostUnhealthy, 1, `the crashed worker is shown unhealthy, one at a time: at most ${mostUnhealthy}`);
  t.equal(most, 1, `never more workers shown than max (1): ${most}`);
  await until('the last crash shown during its backoff', async () => (await health(a, ep)).workers.unhealthy === 1, 5000);
  t.pass(`samples: ${[...new Set(seen)].join(' ')}`);
});

t.test('a worker that cannot be started gets one log line that says why, not an exit it never had', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'no-such-command-flashd-test --flag', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const lines = await until('the failed start in the log', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
    return l.some((x) => /failed to start/.test(x.line)) && l;
  }, 10_000);
  const first = lines.find((l) => /failed to start/.test(l.line)) as { line: string; workerId: string };
  t.match(first.line, /^worker wkr_\w+ failed to start: cannot start "no-such-command-flashd-test": .*ENOENT/, 'it says why');
  const about = lines.filter((l) => l.workerId === first.workerId && !/^starting worker/.test(l.line)).map((l) => l.line);
  t.same(about, [first.line], `one line for the failed start: ${about.join(' | ')}`);
  t.notOk(lines.some((l) => /exited unexpectedly|code \?/.test(l.line)), 'no exit of a process that never ran');
  t.ok(a.logs.some((l) => /worker failed to start/.test(l)), "flashd's log says it too");
  t.notOk(a.logs.some((l) => /worker exited unexpectedly/.test(l)), 'once');
});

t.test('a worker whose command ends before it ever asks for a job is said so: not a bare "exited unexpectedly (code 0)"', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  // A command that is no worker (a handler.py that never calls runpod.serverless.start): it
  // prints and exits 0, at once, every time.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "print(42)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const exit = await until('the exit in the log', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
    return l.find((x) => /^worker wkr_\w+ exited/.test(x.line));
  }, 10_000);
  t.equal(exit.line, `worker ${exit.workerId} exited unexpectedly (code 0) before it ever asked for a job: a worker's command runs until it is stopped (does it call runpod.serverless.start?)`,
    'it says the worker never asked for a job, and what a clean exit of its own means');
  t.ok(a.logs.some((l) => /worker exited unexpectedly .*neverAsked=true/.test(l)), "flashd's log says it never asked");
  const r = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(3)"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const crash = await until('the crash in the log', async () => {
    const l = (await a.req('GET', `/v2/serverless/${r}/logs`)).json as { line: string; workerId: string }[];
    return l.find((x) => /^worker wkr_\w+ exited/.test(x.line));
  }, 10_000);
  t.equal(crash.line, `worker ${crash.workerId} exited unexpectedly (code 3) before it ever asked for a job`, 'a failing exit: that it never asked, its output says why');
});

t.test('refresh_worker with concurrency above 1 stays within max: the replacement waits for the old worker to exit', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 5000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({
      args: 'python3 -u test/fixtures/workers/echo.py', env: { ECHO_CONCURRENCY: '3', ECHO_REFRESH: '1' },
      scaling: { type: 'QUEUE_DELAY', queueDelay: 1 }, workers: { min: 0, max: 1, idleTimeout: 5 },
    }),
  })).json.id as string;
  const ids: string[] = [];
  for (let i = 0; i < 6; i++) ids.push((await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: i % 3 === 0 ? 0.2 : 1.5, i } } })).json.id as string);
  let most = 0;
  const workersSeen = new Set<string>();
  const done = await until('every job to complete', async () => {
    const w = (await health(a, ep)).workers;
    most = Math.max(most, w.initializing + w.idle + w.running);
    const s = await Promise.all(ids.map(async (id) => (await a.req('GET', `/v2/${ep}/status/${id}`)).json));
    for (const x of s) if (x.workerId) workersSeen.add(x.workerId);
    return s.every((x) => x.status === 'COMPLETED') ? s : undefined;
  }, 60_000);
  t.equal(done.length, 6);
  t.equal(most, 1, `never more than max (1) worker at once: ${most}`);
  t.ok(workersSeen.size >= 2, `the worker was refreshed: ${workersSeen.size} workers ran the jobs`);
});

t.test('refresh_worker after a cancelled job: the worker is recycled, not counted as a crash', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 5000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', env: { ECHO_REFRESH: '1' }, workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 1.5 } } })).json.id as string;
  const first = await until('the job to start', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'IN_PROGRESS' && (s.workerId as string);
  }, 30_000);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).json.status, 'CANCELLED');
  const lines = await until('the worker to exit', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
    return l.some((x) => x.workerId === first && /^worker \S+ (stopped|exited)/.test(x.line)) && l;
  }, 20_000);
  const end = lines.find((x) => x.workerId === first && /^worker \S+ (stopped|exited)/.test(x.line))?.line ?? '';
  t.match(end, /stopped \(code 0\)/, `a recycle, not a crash: ${end}`);
  const stopping = lines.find((x) => x.workerId === first && /^stopping worker/.test(x.line))?.line;
  t.match(stopping, /: recycled: the worker asked for it \(stopPod: refresh_worker, or a handler that exited\)$/, `the log says which recycle: ${stopping}`);
  t.equal((await health(a, ep)).workers.unhealthy, 0, 'no unhealthy worker');
  const next = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 2 } } });
  t.equal(next.json.status, 'COMPLETED', next.text);
  t.not(next.json.workerId, first, 'a fresh worker runs the next job');
});

t.test('refresh_worker with workers.min 1: the stop is logged first, and the replacement says what it replaces', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 5000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', env: { ECHO_REFRESH: '1' }, workers: { min: 1, max: 2, idleTimeout: 30 } }),
  })).json.id as string;
  const done = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 1 } } });
  t.equal(done.json.status, 'COMPLETED', done.text);
  const first = done.json.workerId as string;
  type Line = { line: string; workerId: string };
  const lines = await until('the recycled worker stopped and its replacement started', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
    const stop = l.findIndex((x) => x.workerId === first && /^stopping worker/.test(x.line));
    return stop >= 0 && l.filter((x) => /^starting worker/.test(x.line)).length >= 2 && l;
  }, 30_000);
  const stop = lines.findIndex((x) => x.workerId === first && /^stopping worker/.test(x.line));
  t.match(lines[stop]?.line, /: recycled: the worker asked for it/);
  const starts = lines.filter((x) => /^starting worker/.test(x.line));
  const replacement = starts[1] as Line;
  t.ok(stop < lines.indexOf(replacement), `the stop comes first: ${lines.map((x) => x.line).join(' | ')}`);
  t.match(replacement.line, /: workers\.min is 1 \(replacing 1 recycled worker\(s\), which asked for it and take no new job\)$/, `the replacement says why: ${replacement.line}`);
});

t.test('a crash loop of workers that die as they start does not also say, at each restart, that a starting worker holds QUEUE_DELAY back', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT });
  // Each one dies a second into its boot, before it ever asks for a job.
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({
      args: 'sh -c "sleep 1; exit 3"', scaling: { type: 'QUEUE_DELAY', queueDelay: 0.5 }, workers: { min: 0, max: 2, idleTimeout: 5 },
    }),
  })).json.id as string;
  await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } });
  const lines = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line);
  await until('four crashes', async () => (await lines()).filter((l) => /exited unexpectedly/.test(l)).length >= 4, 20_000);
  const held = (await lines()).filter((l) => /still starting/.test(l));
  t.ok(held.length <= 1, `the crash lines say why the job waits, not a line per restart: ${held.length} x "${held[0] ?? ''}"`);
});

t.test('a start after a crash names the crashed worker it replaces, and the crash backoff it follows', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -c "import sys; sys.exit(3)"', workers: { min: 0, max: 1, idleTimeout: 5 } }),
  })).json.id as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  const log = async () => (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
  const starts = async (n: number) => until(`${n} starts`, async () => {
    const l = (await log()).filter((x) => /^starting worker/.test(x.line));
    return l.length >= n && l;
  }, 20_000);
  // Crashes at once, at once, then a 2 s backoff after the third: the fourth start follows it.
  await until('the backoff', async () => (await log()).some((l) => /crash backoff/.test(l.line)), 20_000);
  clock.advance(2000);
  const s = await starts(4);
  const [w0, w1, w2] = s.map((x) => x.workerId);
  const head = (i: number) => `starting worker ${(s[i] as { workerId: string }).workerId} (process runtime): cold start: 1 job(s) waiting and no worker up`;
  t.equal(s[0]?.line, head(0), 'the first start: a plain cold start');
  // It read "cold start: 1 job(s) waiting and no worker up", as if the endpoint had been idle.
  t.equal(s[1]?.line, `${head(1)} (after worker ${w0} exited with code 3)`, 'the next names the crash');
  t.equal(s[2]?.line, `${head(2)} (after worker ${w1} exited with code 3)`);
  t.equal(s[3]?.line, `${head(3)} (after the crash backoff: worker ${w2} exited with code 3)`, 'after the backoff, it says so');
  t.ok(a.logs.some((l) => l.includes('worker starting') && l.includes(`afterCrashOf=${w0}`)), "flashd's log names the crashed worker");
  // The fourth crashes too; its job is cancelled, and a job long after starts a plain cold start.
  await until('the fourth crash', async () => (await log()).filter((l) => /exited unexpectedly/.test(l.line)).length >= 4, 10_000);
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${job}`)).status, 200);
  clock.advance(5 * 60_000);
  await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } });
  const later = await starts(5);
  t.equal(later[4]?.line, `starting worker ${later[4]?.workerId} (process runtime): cold start: 1 job(s) waiting and no worker up`, 'minutes after the crash: a plain cold start');
});
