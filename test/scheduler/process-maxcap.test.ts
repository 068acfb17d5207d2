/**
 * workers.max caps the process workers that exist at once, end to end: real flashd, real worker
 * processes running the vendor_flash SDK, real HTTP. A worker being stopped still runs until it
 * has exited (its SDK's shutdown, a handler's cleanup), so it keeps its place under max. External
 * workers count toward max too.
 */
import t from 'tap';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { TestWorker } from '../helpers/worker.js';

type Line = { line: string; at: string; workerId: string | null; stream: string };
const logs = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/serverless/${ep}/logs?limit=10000`)).json as Line[];

t.test('with max 1, a job arriving while an idle-stopped worker exits waits for the exit, then cold-starts: never two processes', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 10_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', env: { ECHO_EXIT_DELAY: '2' }, workers: { min: 0, max: 1, idleTimeout: 1 } }),
  })).json.id as string;
  const first = (await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 1 } } })).json;
  t.equal(first.status, 'COMPLETED', 'the first job cold-starts a worker and completes');
  const stopping = await until('the idle stop', async () => (await logs(a, ep)).find((l) => /^stopping worker .*: idle for/.test(l.line)), 10_000);
  // The worker is exiting (its cleanup takes 2 s): the job arrives meanwhile.
  const submitted = Date.now();
  const second = (await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 2 } } })).json;
  const took = Date.now() - submitted;
  t.equal(second.status, 'COMPLETED', 'the job arriving during the exit completes');
  t.not(second.output.worker, first.output.worker, 'on a new worker');
  const lines = await until('the first worker\'s exit in the log', async () => {
    const all = await logs(a, ep);
    return all.some((l) => l.workerId === stopping.workerId && /^worker \S+ stopped \(/.test(l.line)) && all;
  }, 10_000);
  const exited = lines.find((l) => l.workerId === stopping.workerId && /^worker \S+ stopped \(/.test(l.line)) as Line;
  const starts = lines.filter((l) => l.stream === 'system' && /^starting worker /.test(l.line));
  t.equal(starts.length, 2, 'two workers in all, one after the other');
  const next = starts[1] as Line;
  t.ok(Date.parse(next.at) >= Date.parse(exited.at), `the second worker started after the first had exited (started ${next.at}, exited ${exited.at})`);
  t.ok(Date.parse(next.at) - Date.parse(exited.at) < 500, `and at once: ${Date.parse(next.at) - Date.parse(exited.at)} ms after the exit, not at a later tick`);
  t.ok(took >= 1500, `the job waited for the exit: completed ${took} ms after it was submitted`);
});

t.test('an external worker joining at workers.max: a busy flashd worker is retired, and the log says external workers count, not that max was lowered', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 10_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const busy = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 3 } } })).json.id as string;
  await until('the flashd worker to run the job', async () => (await a.req('GET', `/v2/${ep}/health`)).json.workers.running === 1, 20_000);
  const own = (await a.req('GET', `/v2/${ep}/status/${busy}`)).json.workerId as string;
  const next = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  const x = await TestWorker.create(a, ep);
  t.match(await x.take(), { id: next }, 'the external worker takes the queued job');
  const lines = await until('the flashd worker to stop once its job is done', async () => {
    await x.ping([next]);
    const l = await logs(a, ep);
    return l.some((y) => y.workerId === own && /^stopping worker/.test(y.line)) && l;
  }, 20_000);
  const retiring = lines.find((l) => l.workerId === own && /is above workers\.max/.test(l.line))?.line;
  t.equal(retiring, `worker ${own} is above workers.max (1), counting the endpoint's 1 external worker(s): it finishes its jobs, takes no new one and stops`);
  const stopping = lines.find((l) => l.workerId === own && /^stopping worker/.test(l.line))?.line;
  t.match(stopping, /: recycled: it was busy above workers\.max \(1\), counting the endpoint's 1 external worker\(s\)$/, `not "a lowered workers.max": ${stopping}`);
  t.equal((await a.req('GET', `/v2/${ep}/status/${busy}`)).json.status, 'COMPLETED', 'its job finished where it was');
  t.ok(a.logs.some((l) => /worker retiring/.test(l) && l.includes(own) && /externalWorkers=1/.test(l)), "flashd's log says so too");
  t.equal((await x.done(next, { output: 'ok' })).status, 200);
});
