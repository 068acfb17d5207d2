/**
 * Autoscaling with the process runtime, end to end: real flashd, real worker processes running
 * the vendor_flash SDK, real HTTP. Cold start, warm reuse, scale to zero, logs and crashes.
 */
import t, { type Test } from 'tap';
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ManualClock } from '../../src/core/clock.js';
import { startAgent, cpuBody, ADMIN_KEY, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT, cleanEnv, run, startFlashd } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

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
  // A worker being stopped leaves /health at once; its exit (and the line saying so) follows.
  const after = await until('the worker to exit', async () => {
    const lines = (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[];
    return lines.some((l) => /stopped/.test(l.line)) && lines;
  }, 15_000);
  t.ok(after.some((l) => /stopped/.test(l.line)), 'the stop is logged');
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

t.test('a worker stopped for the init timeout holds its place under max until it has exited', async (t) => {
  // It ignores SIGTERM, so it exits only when the stop grace period ends (SIGKILL).
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000, workerStopGraceMs: 3000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: JSON.stringify({ cmd: ['sh', '-c', "trap '' TERM; exec sleep 60"] }), env: { RUNPOD_INIT_TIMEOUT: '1' }, workers: { min: 1, max: 1, idleTimeout: 30 } }),
  })).json.id as string;
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

/**
 * flashd as its own process (`--runtime process`) with one worker process running a 60 s job:
 * the setup of the crash, lock and signal tests. The worker's process group is killed on teardown.
 */
async function withRunningJob(t: Test, dir: string, extra: string[], job: Record<string, unknown> = {}) {
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, ...extra,
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }))).id as string;
  const id = (await call('POST', `/v2/${ep}/run`, { input: { sleep: 60 }, ...job })).id as string;
  await until('the job to start', async () => (await call('GET', `/v2/${ep}/status/${id}`)).status === 'IN_PROGRESS', 20_000);
  // Its claim is written once the job has run 100 ms.
  await new Promise((r) => setTimeout(r, 300));
  const pids = readFileSync(join(dir, 'process-workers.pids'), 'utf8').split('\n').filter(Boolean).map((l) => Number(l.split(' ')[0]));
  t.equal(pids.length, 1, 'the worker process is recorded');
  t.teardown(() => {
    for (const pid of pids) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone, as it should be
      }
    }
  });
  return { flashd, call, ep, id, pid: pids[0] as number };
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

t.test('after a kill -9 of flashd, the next start stops its orphaned workers, revokes their keys and requeues their jobs at once', async (t) => {
  const dir = t.testdir();
  const { flashd, ep, id, pid } = await withRunningJob(t, dir, ['--lease-ms', '30000']);
  await flashd.stop('SIGKILL');
  t.ok(alive(pid), 'the worker outlived flashd');

  // The next start uses another runtime: the orphan is stopped all the same.
  const b = await startAgent(t, { runtime: 'none', leaseMs: 30_000 }, { dir });
  await until('the orphan to be gone', async () => !alive(pid), 10_000);
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_QUEUE', `queued again at once, not held for a 30 s lease: ${JSON.stringify(s)}`);
  t.equal(s.retries, 1);
  t.match((await b.req('GET', `/v2/${ep}/health`)).json.workers, { running: 0, idle: 0 }, 'the dead worker is not counted');
  const live = b.agent.db.prepare("SELECT count(*) AS n FROM api_keys WHERE name LIKE 'managed worker %' AND revoked_at IS NULL").get() as { n: number };
  t.equal(live.n, 0, "the previous run's worker keys are revoked");
  t.ok(b.logs.some((l) => l.includes('workers of the previous run released')), 'the start says so');
});

t.test("a job the next start fails (its orphaned worker's attempt was the last) has its webhook sent in that run", async (t) => {
  const received: { status: string }[] = [];
  const hook = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      received.push(JSON.parse(body));
      res.end();
    });
  });
  await new Promise<void>((resolve) => hook.listen(0, '127.0.0.1', resolve));
  t.teardown(() => hook.close());
  const webhook = `http://127.0.0.1:${(hook.address() as { port: number }).port}/hook`;
  const dir = t.testdir();
  const { flashd, ep, id } = await withRunningJob(t, dir, ['--lease-ms', '30000', '--max-attempts', '1', '--webhook-allow-private'], { webhook });
  await flashd.stop('SIGKILL');
  const b = await startAgent(t, { runtime: 'none', leaseMs: 30_000, maxAttempts: 1, webhookAllowPrivate: true }, { dir });
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'FAILED', 'its one attempt was used');
  await until('the webhook', async () => received.length > 0, 5000);
  t.match(received, [{ id, status: 'FAILED' }], 'sent once, by this run, not by the next start');
});

t.test("a retried job the next start fails keeps the first run's owed webhook row until its own delivery ends", async (t) => {
  // The receiver fails every try, so each delivery stays owed (the next try is a minute away).
  const received: { status: string }[] = [];
  const hook = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      received.push(JSON.parse(body));
      res.statusCode = 503;
      res.end();
    });
  });
  await new Promise<void>((resolve) => hook.listen(0, '127.0.0.1', resolve));
  t.teardown(() => hook.close());
  const webhook = `http://127.0.0.1:${(hook.address() as { port: number }).port}/hook`;
  const dir = t.testdir();
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--lease-ms', '3000',
    '--max-attempts', '1', '--webhook-allow-private', '--webhook-retry-delay-ms', '60000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const ep = (await call('POST', '/v2/serverless', cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 1, idleTimeout: 30 } }))).id as string;
  // The first run times out (its webhook is owed: the receiver fails); the retried run is running at the crash.
  const id = (await call('POST', `/v2/${ep}/run`, { input: { sleep: 6 }, webhook, policy: { executionTimeout: 5000 } })).id as string;
  await until('the first run to time out', async () => received.length === 1, 20_000);
  t.equal((await call('POST', `/v2/${ep}/retry/${id}`)).status, 'IN_QUEUE');
  await until('the retried run to start', async () => (await call('GET', `/v2/${ep}/status/${id}`)).status === 'IN_PROGRESS', 20_000);
  await new Promise((r) => setTimeout(r, 300));
  const pids = readFileSync(join(dir, 'process-workers.pids'), 'utf8').split('\n').filter(Boolean).map((l) => Number(l.split(' ')[0]));
  t.teardown(() => {
    for (const pid of pids) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
  });
  await flashd.stop('SIGKILL');
  const b = await startAgent(t, { runtime: 'none', leaseMs: 30_000, maxAttempts: 1, webhookAllowPrivate: true, webhookRetryDelayMs: 60_000 }, { dir });
  await until("the retried run's webhook", async () => received.length === 2, 5000);
  t.match(received[1], { id, status: 'FAILED', retries: 1 });
  await new Promise((r) => setTimeout(r, 200));
  await b.agent.queue.durable();
  t.same(b.agent.db.prepare('SELECT job_id FROM webhook_outbox').pluck().all(), [id], 'still owed: its delivery has tries left');
});

/**
 * A process that is no worker of this data directory but carries the worker marker in its
 * environment (a worker of another flashd, or one started by hand from `flashd worker-env`), in
 * its own process group as flashd's workers are. Killed on teardown.
 */
function bystander(t: Test): number {
  const child = spawn('sleep', ['60'], { detached: true, stdio: 'ignore', env: { PATH: process.env['PATH'] ?? '', VENDOR_POD_ID: 'wkr_someoneelse' } });
  child.unref();
  const pid = child.pid as number;
  t.teardown(() => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone
    }
  });
  return pid;
}

t.test('a recorded pid that now belongs to another process is not killed at start', async (t) => {
  t.test('a pid alone, as flashd recorded it before, written before that process started (a reboot since)', async (t) => {
    const dir = t.testdir();
    const pid = bystander(t);
    const file = join(dir, 'process-workers.pids');
    writeFileSync(file, `${pid}\n`);
    const hourAgo = new Date(Date.now() - 3600_000);
    utimesSync(file, hourAgo, hourAgo);
    const a = await startAgent(t, { runtime: 'none' }, { dir });
    await new Promise((r) => setTimeout(r, 300));
    t.ok(alive(pid), 'the process that took the pid since is alive');
    t.notOk(a.logs.some((l) => /stopped orphaned worker process/.test(l)), 'nothing was stopped');
  });
  t.test('a pid with another start time', async (t) => {
    const dir = t.testdir();
    const pid = bystander(t);
    const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    writeFileSync(join(dir, 'process-workers.pids'), `${pid} 1 ${boot}\n`);
    await startAgent(t, { runtime: 'none' }, { dir });
    await new Promise((r) => setTimeout(r, 300));
    t.ok(alive(pid), 'alive');
  });
  t.test('a pid alone for a process that was running when the file was written is still stopped (an upgrade after a crash)', async (t) => {
    const dir = t.testdir();
    const pid = bystander(t);
    await new Promise((r) => setTimeout(r, 1100));
    writeFileSync(join(dir, 'process-workers.pids'), `${pid}\n`);
    await startAgent(t, { runtime: 'none' }, { dir });
    await until('the orphan to be gone', async () => !alive(pid), 5000);
    t.pass('stopped');
  });
});

t.test('a second flashd on a live data directory is refused before it touches anything; kill -9 frees the directory', async (t) => {
  const dir = t.testdir();
  const { flashd, call, ep, id, pid } = await withRunningJob(t, dir, ['--lease-ms', '30000']);

  // Another port, the same data dir: before the lock this one reaped the live worker and requeued its job.
  const second = run(process.execPath, ['dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process'], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.equal(second.status, 1, second.stderr);
  t.match(second.stderr, new RegExp(`data directory \\S+ is in use by another flashd \\(pid ${flashd.child.pid}\\)`));
  t.notMatch(second.stderr, /orphaned|released|listening/, 'it did nothing else');
  await t.rejects(startAgent(t, { runtime: 'none' }, { dir }), /in use by another flashd/, 'in-process too');
  process.kill(pid, 0);
  t.pass('the live worker was left alone');
  const s = await call('GET', `/v2/${ep}/status/${id}`);
  t.equal(s.status, 'IN_PROGRESS', 'its job was not requeued');
  t.notOk(s.retries, 'and no attempt was charged');
  t.equal((await call('GET', `/v2/${ep}/health`)).workers.running, 1);

  await flashd.stop('SIGKILL');
  const b = await startAgent(t, { runtime: 'none', leaseMs: 30_000 }, { dir });
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'after kill -9 the next start takes the directory and recovers');
});

t.test('a second SIGTERM during a clean stop exits 1 at once and leaves no worker running', async (t) => {
  const dir = t.testdir();
  const { flashd, ep, id, pid } = await withRunningJob(t, dir, ['--worker-stop-grace-ms', '30000']);
  flashd.child.kill('SIGTERM');
  await until('the clean stop to begin', async () => /shutting down/.test(flashd.stderr()), 5000);
  await new Promise((r) => setTimeout(r, 300));
  t.equal(flashd.child.exitCode, null, 'the first SIGTERM waits for the running job (30 s grace)');
  const started = Date.now();
  const code = await flashd.stop('SIGTERM');
  t.equal(code, 1, 'the second exits 1');
  t.ok(Date.now() - started < 5000, 'at once, not after the grace');
  t.match(flashd.stderr(), /second signal: stopping now/);
  t.match(flashd.stderr(), /killed worker process \(second signal\): its jobs are queued again at the next start pid=\d+/, 'its own worker, said as such');
  t.notMatch(flashd.stderr(), /orphaned/, 'not called an orphan of an earlier run');
  await until('the worker to be gone', async () => !alive(pid), 5000);
  t.pass('no worker outlives flashd');
  const b = await startAgent(t, { runtime: 'none' }, { dir });
  t.equal((await b.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the next start reclaims the job');
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
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { workers: { min: 0, max: 1 } } })).status, 200);
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
