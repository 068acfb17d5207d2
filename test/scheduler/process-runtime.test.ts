/**
 * Autoscaling with the process runtime, end to end: real flashd, real worker processes running
 * the vendor_flash SDK, real HTTP. Cold start, warm reuse, scale to zero, logs and crashes.
 */
import { hostname } from 'node:os';
import t from 'tap';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { makeNetworkVolume, makeRegistry } from '../helpers/expect.js';

const health = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/${ep}/health`)).json;

t.test('cold start, warm reuse, scale to zero, logs', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const created = await a.req('POST', '/v2/serverless', {
    body: cpuBody({
      args: 'python3 -u test/fixtures/workers/echo.py',
      env: { GREETING: 'hello from env' },
      workers: { min: 0, max: 2, idleTimeout: 1 },
    }),
  });
  t.equal(created.status, 201, created.text);
  const ep = created.json.id as string;
  t.same((await health(a, ep)).workers, { idle: 0, initializing: 0, ready: 0, running: 0, throttled: 0, unhealthy: 0 }, 'no workers until needed');

  const first = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 1 } } });
  t.equal(first.json.status, 'COMPLETED', `cold start completes: ${first.text}`);
  t.same(first.json.output.echo, { n: 1 });
  t.equal(first.json.output.env, 'hello from env', 'the endpoint env reaches the worker');
  const second = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 2 } } });
  t.equal(second.json.status, 'COMPLETED');
  t.equal(second.json.workerId, first.json.workerId, 'the warm worker is reused');

  const logs = await until('worker output in the log', async () => {
    const r = await a.req('GET', `/v2/serverless/${ep}/logs`);
    const lines = r.json as { line: string; stream: string; workerId: string }[];
    return lines.some((l) => l.line.includes(`handling ${second.json.id}`)) && lines;
  });
  t.ok(logs.some((l) => l.stream === 'system' && /starting worker .*: cold start/.test(l.line)), 'the start is logged, with why');
  t.ok(logs.some((l) => l.workerId === first.json.workerId), 'lines carry the worker id');

  await until('scale to zero after idleTimeout', async () => {
    const h = await health(a, ep);
    return h.workers.idle + h.workers.running + h.workers.initializing === 0;
  });
  // A worker being stopped leaves /health at once; its exit (and flashd's line saying so)
  // follows. The SDK's own "worker … stopped" line comes before the exit: not the one awaited.
  const exitLine = (l: { line: string; stream: string }) => l.stream === 'system' && /^worker \S+ stopped \(/.test(l.line);
  const after = await until('the worker to exit', async () => {
    const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string }[];
    return lines.some(exitLine) && lines;
  }, 15_000);
  t.ok(after.some(exitLine), 'the stop is logged');
  t.ok(after.some((l) => /stopping worker .*: idle for [\d.]+ s \(idle timeout 1 s\)/.test(l.line)), 'and why it stopped');
});

t.test('a worker that dies mid-job: the job is retried, the worker shows unhealthy', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, maxAttempts: 2 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { crash: true } } })).json.id as string;
  const final = await until('the crashing job to fail', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'FAILED' && s;
  }, 40_000);
  t.match(final.error, /exited/, 'the reason names the worker exit');
  t.equal(final.retries, 1, 'it was retried once before failing (maxAttempts 2)');
  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line);
  t.ok(lines.some((l) => new RegExp(`^job ${id} went back to the queue: worker wkr_\\w+ exited \\(`).test(l)), 'the endpoint log says the job went back after the first crash');
  t.ok(lines.some((l) => new RegExp(`^job ${id} failed: worker wkr_\\w+ exited \\(.*\\) and it was the job's last attempt$`).test(l)), 'and that it failed after the second');
  const h = await health(a, ep);
  t.ok(h.workers.unhealthy >= 1, 'crashed workers are reported unhealthy');
  t.ok(h.jobs.retried >= 1);
  const ok = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { fine: true } } });
  t.equal(ok.json.status, 'COMPLETED', 'a healthy job still runs after the crashes');
});

t.test('a worker whose SIGTERM waits for its poll (as runpod-python) exits by itself when scaled down', async (t) => {
  // The take hold is far longer than the stop grace: only an answered poll lets it exit cleanly.
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 30_000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/late_sigterm.py', workers: { min: 0, max: 1, idleTimeout: 1 } }),
  })).json.id as string;
  const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: { n: 1 } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  const lines = await until('the worker to stop', async () => {
    const l = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((x) => x.line);
    return l.some((x) => /stopped \(/.test(x)) && l;
  }, 30_000);
  t.ok(lines.some((x) => x.includes('exiting cleanly')), 'the worker left its loop');
  t.ok(lines.some((x) => /stopped \(code 0\)/.test(x)), `it exited with code 0: ${lines.filter((x) => /stopped/.test(x)).join(' | ')}`);
  t.notOk(lines.some((x) => /SIGKILL/.test(x)), 'it was not killed');
});

t.test('a PATCH that running workers can pick up keeps them; one that needs a restart replaces them', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const workerOf = async () => (await a.req('POST', `/v2/${ep}/runsync`, { body: { input: {} } })).json.workerId as string;
  const warm = await workerOf();
  const renamed = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { name: 'renamed' } });
  t.equal(renamed.json.restartRequired, false);
  t.equal(await workerOf(), warm, 'a new name: the warm worker stays');
  // A host process has no disk limit, ports, pull credential, volume or FlashBoot: changing
  // them replaces nobody on this runtime (a container runtime still replaces its workers).
  const reg = await makeRegistry(t, a);
  const nv = await makeNetworkVolume(t, a);
  for (const body of [
    { flashboot: 'FLASHBOOT' }, { disk: 30 }, { ports: ['8000/http'] }, { registry: reg.id },
    { mounts: { network: [{ volumeId: nv.id }] } }, { flashboot: 'OFF', disk: 40 },
  ]) {
    const r = await a.req('PATCH', `/v2/serverless/${ep}`, { body });
    t.equal(r.status, 200, r.text);
    t.same([r.json.restartRequired, r.json.restartReasons], [false, []], `${JSON.stringify(body)}: no restart on the process runtime`);
  }
  t.equal(await workerOf(), warm, 'container-only fields: the warm worker stays');
  // A lower max that leaves the one worker under it stops nobody (one above it: the next test).
  for (const max of [3, 2, 1]) {
    const r = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { max } } });
    t.same([r.status, r.json.restartRequired, r.json.restartReasons], [200, false, []], `max ${max} with one worker: no restart`);
  }
  t.equal(await workerOf(), warm, 'a lower max above the workers up: the warm worker stays');
  const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line);
  t.notOk(lines.some((l) => l.includes('recycled')), `no worker was recycled: ${lines.filter((l) => l.includes('recycled')).join(' | ')}`);
  const env = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { GREETING: 'new' } } });
  t.equal(env.json.restartRequired, true, env.text);
  await until('the worker to be replaced', async () => {
    const r = await a.req('POST', `/v2/${ep}/runsync`, { body: { input: {} } });
    return r.json.workerId !== warm && r.json.output?.env === 'new';
  }, 30_000);
  t.pass('a new env: the worker is replaced and the new one sees it');
});

t.test("flashd's own shutdown lets a running job finish and post its result before the API closes", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 15_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 1.5 } } })).json.id as string;
  await until('the job to start', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'IN_PROGRESS', 20_000);
  await a.agent.close();
  const b = await startAgent(t, {}, { dir: a.dir });
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'COMPLETED', `finished during the shutdown, not run again after it: ${JSON.stringify(s)}`);
  t.same(s.output.echo, { sleep: 1.5 });
  t.notOk(s.retries, 'never requeued');
});

t.test("flashd's own shutdown lets a job finish within the grace when the worker runs under a shell script (no exec)", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 15_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sh test/fixtures/workers/wrapped_echo.sh', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 1.5 } } })).json.id as string;
  await until('the job to start', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'IN_PROGRESS', 20_000);
  // The shell dies of the SIGTERM at once; the worker under it got the same SIGTERM and finishes.
  const started = performance.now();
  await a.agent.close();
  const took = performance.now() - started;
  t.ok(took < 10_000, `closed once the worker was done, in ${Math.round(took)} ms`);
  const b = await startAgent(t, {}, { dir: a.dir });
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'COMPLETED', `finished during the shutdown, not cut short with its shell: ${JSON.stringify(s)}`);
  t.notOk(s.retries, 'never requeued');
});

t.test('a job cut short by the shutdown grace goes back to the queue without using an attempt', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, maxAttempts: 1, workerStopGraceMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 30 } } })).json.id as string;
  await until('the job to start', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'IN_PROGRESS', 20_000);
  const started = Date.now();
  await a.agent.close();
  t.ok(Date.now() - started < 10_000, 'the grace bounds the shutdown');
  const b = await startAgent(t, { maxAttempts: 1 }, { dir: a.dir });
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_QUEUE', `queued again, not FAILED after its one attempt: ${JSON.stringify(s)}`);
  const row = b.agent.db.prepare('SELECT attempt FROM jobs WHERE id = ?').get(id) as { attempt: number };
  t.equal(row.attempt, 0, 'the attempt it used was given back');
  // The endpoint log said the stop and the kill, but only flashd's own log said the job went back.
  const lines = ((await b.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string; workerId: string }[]).filter((l) => l.stream === 'system');
  const killed = lines.findIndex((l) => /^worker wkr_\w+ stopped \(signal SIGKILL\)$/.test(l.line));
  t.ok(killed >= 0, `the kill is in the endpoint log: ${JSON.stringify(lines.map((l) => l.line))}`);
  const back = lines.findIndex((l) => l.line === `job ${id} went back to the queue: its worker ${lines[killed]?.workerId} was stopped with flashd (signal SIGKILL); it runs again after the restart, without using an attempt`);
  t.ok(back > killed, 'and so is its job going back, after it');
});

t.test('a worker that never asks for a job is stopped after the init timeout and shown unhealthy', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sleep 60', env: { RUNPOD_INIT_TIMEOUT: '1' }, workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await until('a worker to start', async () => (await health(a, ep)).workers.initializing === 1, 10_000);
  await until('the silent worker to be stopped and shown unhealthy', async () => (await health(a, ep)).workers.unhealthy >= 1, 15_000);
  const lines = await until('the stop in the log', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return l.some((x) => /never asked for a job/.test(x.line)) && l;
  }, 10_000);
  t.ok(lines.some((l) => /did not ask for a job within 1 s/.test(l.line)), 'the log says why');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the job waits for a worker that works');
});

t.test('a worker that pings but never asks for a job (runpod-python --rp_serve_api) is initializing, not idle, and stopped after the init timeout', async (t) => {
  // Its heartbeat process pings as usual, its local HTTP API takes no job from the queue: counted
  // idle from its first ping, it held its place for good while every job waited for its TTL.
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/ping_only.py', env: { RUNPOD_INIT_TIMEOUT: '3' }, workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await until('a worker to start', async () => (await health(a, ep)).workers.initializing === 1, 10_000);
  await new Promise((r) => setTimeout(r, 1500)); // its pings (at once, then every second) have come by now
  t.match((await health(a, ep)).workers, { initializing: 1, idle: 0 }, 'a ping is no ask for work');
  const lines = await until('the stop for the init timeout', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return l.some((x) => /did not ask for a job within 3 s/.test(x.line)) && l;
  }, 15_000);
  t.ok(lines.length > 0, 'the log says why');
  t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the job waits for a worker that works');
});

t.test('a worker stopped for the init timeout holds its place under max until it has exited', async (t) => {
  // It ignores SIGTERM, so it exits only when the stop grace period ends (SIGKILL).
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: JSON.stringify({ cmd: ['sh', '-c', "trap '' TERM; exec sleep 60"] }), env: { RUNPOD_INIT_TIMEOUT: '1' }, workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  await until('the first silent worker to be stopped', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return l.some((x) => /^stopping worker \S+: it did not ask for a job within 1 s/.test(x.line));
  }, 15_000);
  const exiting = (await health(a, ep)).workers;
  t.same([exiting.initializing, exiting.idle, exiting.running, exiting.unhealthy], [0, 0, 0, 0],
    `while it exits (the stop grace: it ignores SIGTERM) it is in none of the counts: ${JSON.stringify(exiting)}`);
  let most = 0;
  let unhealthy = false;
  await until('the first silent worker to have exited and a replacement to start', async () => {
    const w = (await health(a, ep)).workers;
    most = Math.max(most, w.initializing + w.idle + w.running);
    // The replacement takes the crashed worker's place in /health: one or the other is shown.
    unhealthy ||= w.unhealthy >= 1;
    return unhealthy && w.initializing === 1;
  }, 20_000);
  t.equal(most, 1, `never more than max (1) worker at once: ${most}`);
  const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
  t.ok(lines.some((l) => /never asked for a job/.test(l.line)), 'the first one was stopped for the init timeout');
});

t.test('below max too, the replacement for an init-timed-out worker starts once it has exited, so a crash backoff holds it', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sleep 60', env: { RUNPOD_INIT_TIMEOUT: '1' }, workers: { min: 0, max: 2, idleTimeout: 30 } }),
  })).json.id as string;
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  type Line = { line: string; at: string };
  const lines = await until('three init timeouts and a crash backoff, then the next start', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as Line[];
    const backoff = l.findIndex((x) => /crashed in a row: no new worker for/.test(x.line));
    return backoff >= 0 && l.slice(backoff).some((x) => /^starting worker/.test(x.line)) && l;
  }, 30_000);
  // Each start after the first comes after the exit of the worker it replaces.
  let starts = 0;
  let exits = 0;
  for (const l of lines) {
    if (/^starting worker/.test(l.line)) {
      starts++;
      t.ok(starts - 1 <= exits, `start ${starts} after ${exits} exit(s): ${l.line}`);
    }
    if (/never asked for a job/.test(l.line)) exits++;
  }
  const backoff = lines.find((x) => /crashed in a row/.test(x.line)) as Line;
  t.match(backoff.line, /^3 workers crashed in a row: no new worker for 2 s \(crash backoff\)$/);
  const next = lines.slice(lines.indexOf(backoff)).find((x) => /^starting worker/.test(x.line)) as Line;
  const heldMs = Date.parse(next.at) - Date.parse(backoff.at);
  t.ok(heldMs >= 1500, `the backoff held the next start: ${heldMs} ms`);
  t.notOk(a.logs.some((l) => /worker exited unexpectedly/.test(l)), "flashd's log does not call a stop it made unexpected");
  t.ok(a.logs.some((l) => /worker stopped: it never asked for a job/.test(l)), "flashd's log says why it stopped");
});

t.test('lowering max or replacing the configuration stops a worker that is still starting', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sleep 60', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  await until('a worker to start', async () => (await health(a, ep)).workers.initializing === 1, 10_000);
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { args: 'python3 -u test/fixtures/workers/echo.py' } });
  t.equal(patched.status, 200, patched.text);
  const done = await until('the job to run on the new configuration', async () => {
    const r = await a.req('GET', `/v2/serverless/${ep}/logs`);
    return (r.json as { line: string }[]).some((l) => /handling/.test(l.line));
  }, 20_000);
  t.ok(done, 'the starting worker was replaced');
  const patched2 = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { args: 'sleep 60' } });
  t.equal(patched2.status, 200);
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  await until('a new starting worker', async () => (await health(a, ep)).workers.initializing === 1, 20_000);
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: 0, max: 0 } } })).status, 200);
  await until('max 0 stops it', async () => {
    const w = (await health(a, ep)).workers;
    return w.initializing === 0 && w.idle === 0 && w.running === 0;
  }, 15_000);
  t.pass('stopped');
});

t.test('process workers reserve no vCPUs: a flavor larger than the host still runs, beside others', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const big = (n: number) => a.req('POST', '/v2/serverless', {
    body: cpuBody({ name: `big${n}`, args: 'python3 -u test/fixtures/workers/echo.py', cpu: [{ id: 'cpu3g', vcpuCount: 32 }], workers: { min: 0, max: 1, idleTimeout: 30 } }),
  });
  const eps = [(await big(1)).json.id as string, (await big(2)).json.id as string];
  const results = await Promise.all(eps.map((ep) => a.req('POST', `/v2/${ep}/runsync?wait=20000`, { body: { input: { n: ep } } })));
  for (const r of results) t.equal(r.json.status, 'COMPLETED', `ran, not throttled: ${r.text}`);
});

t.test('after a PATCH that needs a restart, a busy worker finishes its job but takes no new one: new jobs run on the new configuration', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', env: { GREETING: 'old' }, workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  let firstDone = false;
  const first = a.req('POST', `/v2/${ep}/runsync`, { body: { input: { sleep: 6 } } }).then((r) => {
    firstDone = true;
    return r;
  });
  await until('the first job to run', async () => (await health(a, ep)).workers.running === 1, 20_000);
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { GREETING: 'new' } } });
  t.same(patched.json.restartReasons, ['env']);
  const second = await a.req('POST', `/v2/${ep}/runsync?wait=30000`, { body: { input: { n: 2 } } });
  t.notOk(firstDone, 'the replacement started at once (the worker being replaced does not count toward max 1)');
  const one = (await first).json;
  t.equal(one.output.env, 'old', 'the running job finished where it was');
  t.equal(second.json.status, 'COMPLETED', second.text);
  t.equal(second.json.output.env, 'new', 'the job submitted after the PATCH ran on the new configuration');
  t.not(second.json.workerId, one.workerId, 'on a new worker');
  const stopping = await until('the replaced worker to stop', async () => {
    const l = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
    return l.find((x) => x.workerId === one.workerId && /^stopping worker/.test(x.line))?.line;
  }, 10_000);
  t.match(stopping, /: recycled: replaced for the endpoint's new configuration$/, `the log says which recycle: ${stopping}`);
});

t.test('lowering workers.max under a backlog: a busy surplus worker finishes its job, takes no new one and stops', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', scaling: { type: 'REQUEST_COUNT', requestCount: 1 }, workers: { min: 0, max: 2 } }),
  })).json.id as string;
  const first = [a.req('POST', `/v2/${ep}/runsync`, { body: { input: { sleep: 2 } } }), a.req('POST', `/v2/${ep}/runsync`, { body: { input: { sleep: 2 } } })];
  await until('both jobs running on two workers', async () => (await health(a, ep)).workers.running === 2, 20_000);
  const lowered = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: 0, max: 1 } } });
  t.same([lowered.status, lowered.json.restartRequired, lowered.json.restartReasons], [200, true, ['workers']], 'a worker above the new max: restart reason workers');
  // A backlog that keeps every worker busy: before, both workers took these as they came free.
  const backlog = await Promise.all([1, 2, 3, 4].map(async (n) => (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n, sleep: 0.3 } } })).json.id as string));
  const firstDone = await Promise.all(first.map(async (r) => (await r).json));
  t.same(firstDone.map((j) => j.status), ['COMPLETED', 'COMPLETED'], 'the jobs running at the PATCH finished where they were');
  const done = await Promise.all(backlog.map((id) => until(`job ${id}`, async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'COMPLETED' && s;
  }, 20_000)));
  t.equal(new Set(done.map((j) => j.workerId)).size, 1, `the backlog ran on one worker (max 1): ${done.map((j) => j.workerId).join(' ')}`);
  const retired = firstDone.map((j) => j.workerId as string).find((id) => id !== done[0].workerId);
  t.ok(retired, 'the other worker took none of it');
  const logs = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
  t.ok(logs.some((l) => l.workerId === retired && /above workers\.max \(1\)/.test(l.line)), 'its retirement is in the log');
  await until('the retired worker stopped', async () => {
    const h = await health(a, ep);
    return h.workers.idle + h.workers.running + h.workers.initializing === 1;
  }, 15_000);
  const stopping = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[])
    .find((l) => l.workerId === retired && /^stopping worker/.test(l.line))?.line;
  t.match(stopping, /: recycled: it was busy above a lowered workers\.max \(1\)$/, `the log says which recycle: ${stopping}`);
});

t.test("a process worker gets the host's name as RUNPOD_POD_HOSTNAME, which the SDK's error report carries; the endpoint's env may set it", async (t) => {
  // Without it every raised exception's report said "hostname": "unknown".
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  const make = async (env: Record<string, string>) => (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/env.py', env, workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const run = async (ep: string, input: unknown) => (await a.req('POST', `/v2/${ep}/runsync`, { body: { input } })).json;
  const [own, set] = [await make({}), await make({ RUNPOD_POD_HOSTNAME: 'gpu-box-7' })];
  const vars = await run(own, { vars: ['RUNPOD_POD_HOSTNAME', 'VENDOR_POD_HOSTNAME'] });
  t.same(vars.output, { RUNPOD_POD_HOSTNAME: hostname(), VENDOR_POD_HOSTNAME: hostname() }, `both names: ${JSON.stringify(vars)}`);
  const failed = await run(own, { raise: 'boom' });
  t.equal(failed.status, 'FAILED');
  t.match(JSON.parse(failed.error), { error_message: 'boom', hostname: hostname() }, 'the error report names the host');
  const theirs = await run(set, { raise: 'boom' });
  t.equal(JSON.parse(theirs.error).hostname, 'gpu-box-7', "the endpoint's own value is kept");
});

t.test("a Python worker's print() reaches the log while it runs, not when it exits (PYTHONUNBUFFERED)", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: `python3 -c "import time; print('booting the model'); time.sleep(60)"`, workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  await until('the line in the log', async () => {
    const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string }[];
    return lines.some((l) => l.stream === 'stdout' && l.line === 'booting the model');
  }, 10_000);
  t.pass('printed before the process exited');
});

t.test('a worker that dies while a child it started still holds its output is seen dead at once', async (t) => {
  // The lease (60 s) is far longer than the test: only the exit itself can end the job.
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 60_000, maxAttempts: 1 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sh -c "sleep 100 & exec python3 -u test/fixtures/workers/echo.py"', workers: { min: 0, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { crash: true } } })).json.id as string;
  const final = await until('the job of the dead worker to fail', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'FAILED' && s;
  }, 15_000);
  t.match(final.error, /exited \(code 3\)/);
  t.ok((await health(a, ep)).workers.unhealthy >= 1, 'shown unhealthy, not running');
});

t.test('shutdown does not wait for a child that left the worker process group', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, workerStopGraceMs: 2000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'sh -c "setsid sleep 40 & exec python3 -u test/fixtures/workers/echo.py"', workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
  await until('the warm worker', async () => (await health(a, ep)).workers.idle === 1);
  const started = performance.now();
  await a.agent.close();
  const took = performance.now() - started;
  t.ok(took < 10_000, `closed in ${Math.round(took)} ms`);
});

t.test('a worker whose boot takes longer than idleTimeout is idle from its first contact, not from its launch', async (t) => {
  const clock = new ManualClock();
  const a = await startAgent(t, { takeHoldMs: 300 }, { clock });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 1, idleTimeout: 5 } }) })).json.id as string;
  const registry = a.agent.queue.workers;
  const w = registry.launched(ep, 'wkr_boot');
  clock.advance(8000); // an 8 s boot
  registry.seen(ep, 'wkr_boot', true);
  t.equal(clock.monotonic() - w.idleSince, 0, 'idle since it came up');
  clock.advance(1000);
  registry.seen(ep, 'wkr_boot');
  t.equal(clock.monotonic() - w.idleSince, 1000, 'later contacts do not reset it');
});

t.test("an admin revoking a managed worker's key has it replaced; a worker stopped by flashd has its key revoked as before", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 20_000, leaseMs: 3000 });
  const created = await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 1, max: 1, idleTimeout: 1 } }),
  });
  t.equal(created.status, 201, created.text);
  const ep = created.json.id as string;
  type Key = { id: string; name: string; endpointId: string };
  const liveKeys = async () => ((await a.req('GET', '/v2/api-keys?kind=worker')).json as Key[]).filter((k) => k.endpointId === ep);
  const first = await until('the min worker up', async () => {
    const keys = await liveKeys();
    return (await health(a, ep)).workers.idle === 1 && keys.length === 1 && keys[0];
  }, 20_000);
  const firstId = first.name.replace('managed worker ', '');

  t.equal((await a.req('DELETE', `/v2/api-keys/${first.id}`)).status, 204);
  t.match((await health(a, ep)).workers, { idle: 0, ready: 0 }, 'the worker with the revoked key no longer counts');
  const second = await until('a replacement with a key of its own', async () => {
    const keys = await liveKeys();
    return (await health(a, ep)).workers.idle === 1 && keys.length === 1 && keys[0]?.id !== first.id && keys[0];
  }, 20_000);
  const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; workerId: string }[];
  t.ok(lines.some((l) => l.workerId === firstId && /^stopping worker/.test(l.line)), 'the worker with the revoked key was stopped');

  // The usual stop (min 0, idle timeout): flashd revokes the key itself, by its own path.
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: 0 } } })).status, 200);
  await until('the idle worker stopped and its key revoked', async () => (await liveKeys()).length === 0, 20_000);
  const revokedLog = a.logs.filter((l) => l.includes('worker key revoked'));
  t.equal(revokedLog.length, 1, 'only the admin\'s revocation went through the queue');
  t.notOk(revokedLog.some((l) => l.includes(second.id)), 'not the key flashd revoked at the stop');
});
