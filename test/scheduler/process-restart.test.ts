/**
 * The process runtime across flashd's own crashes and stops: kill -9 and the next start (orphaned
 * workers, their keys, jobs and owed webhooks), pid reuse, the data-dir lock, a second signal, and
 * no job handed out while a clean stop waits for its workers.
 */
import t, { type Test } from 'tap';
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { existsSync, readdirSync, readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startAgent, cpuBody, ADMIN_KEY } from '../helpers/agent.js';
import { REPO_ROOT, cleanEnv, run, startFlashd } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { testDataDir } from '../helpers/data-dir.js';
import { TestWorker } from '../helpers/worker.js';

/** JSON requests with the admin key to a flashd started as its own process. */
const adminCall = (url: string) => async (method: string, path: string, body?: unknown): Promise<any> => {
  const r = await fetch(url + path, {
    method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
  });
  return r.json();
};

/**
 * flashd as its own process (`--runtime process`) with one worker process running a 60 s job:
 * the setup of the crash, lock and signal tests. The worker's process group is killed on teardown.
 */
async function withRunningJob(t: Test, dir: string, extra: string[], job: Record<string, unknown> = {}) {
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, ...extra,
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const call = adminCall(flashd.url);
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
  const dir = testDataDir(t);
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
  t.ok(b.logs.some((l) => /stopped orphaned worker process pid=\d+ workerId=wkr_/.test(l)), 'naming the worker it stopped');
  const lines = (await b.req('GET', `/v2/serverless/${ep}/logs`)).json as { stream: string; line: string }[];
  const released = lines.findIndex((l) => l.stream === 'system'
    && /belonged to a run of flashd that did not stop cleanly \(killed or crashed\): it was stopped and its key revoked; its 1 job\(s\) went back to the queue, each using an attempt/.test(l.line));
  t.ok(released >= 0, "and so does the endpoint's log");
  t.ok(lines.slice(released + 1).every((l) => l.stream === 'system'), "after that worker's own lines");
});

/** The processes of a process group, from /proc (field 5 of /proc/<pid>/stat). */
function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[2]) === pgid && fields[0] !== 'Z') out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

t.test("after a kill -9 of flashd, a worker whose main process died meanwhile has what is left of its process group stopped at the next start", async (t) => {
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT,
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const call = adminCall(flashd.url);
  await call('POST', '/v2/serverless', cpuBody({ args: 'sh test/fixtures/workers/with_helper.sh', workers: { min: 1, max: 1, idleTimeout: 30 } }));
  const file = join(dir, 'process-workers.pids');
  await until('the worker to be recorded', async () => existsSync(file) && readFileSync(file, 'utf8').trim() !== '', 20_000);
  const pid = Number(readFileSync(file, 'utf8').split(' ')[0]);
  const isHelper = (p: number) => {
    try {
      return readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('sleep\0');
    } catch {
      return false;
    }
  };
  await until('its helper to start', async () => groupMembers(pid).some(isHelper), 10_000);
  const helpers = groupMembers(pid).filter(isHelper);
  t.teardown(() => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone, as it should be
    }
  });
  await flashd.stop('SIGKILL');
  // The worker's main process dies while flashd is down (crashed, OOM-killed, or a write to the
  // stdout flashd no longer reads); the helper it started lives on in its process group.
  process.kill(pid, 'SIGKILL');
  await until('the main process to be gone', async () => !groupMembers(pid).includes(pid), 5000);
  t.ok(helpers.every(alive), 'its helper outlived it');

  const b = await startAgent(t, { runtime: 'none' }, { dir });
  await until('the helper to be stopped', async () => !groupMembers(pid).some(isHelper), 5000);
  t.same(groupMembers(pid), [], 'nothing of the worker is left running');
  t.ok(b.logs.some((l) => /stopped orphaned worker process/.test(l)), 'the start says so');
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
  const dir = testDataDir(t);
  const { flashd, ep, id } = await withRunningJob(t, dir, ['--lease-ms', '30000', '--max-attempts', '1', '--webhook-allow-private'], { webhook });
  await flashd.stop('SIGKILL');
  const b = await startAgent(t, { runtime: 'none', leaseMs: 30_000, maxAttempts: 1, webhookAllowPrivate: true }, { dir });
  t.match((await b.req('GET', `/v2/${ep}/status/${id}`)).json, {
    status: 'FAILED',
    error: /^worker wkr_\S+ was lost when flashd stopped without a clean shutdown \(killed or crashed\), which uses an attempt; gave up after 1 attempts$/,
  }, 'its one attempt was used, and its error says that a crash of flashd ended it, not its handler');
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
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'process', '--process-workdir', REPO_ROOT, '--lease-ms', '3000',
    '--max-attempts', '1', '--webhook-allow-private', '--webhook-retry-delay-ms', '60000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const call = adminCall(flashd.url);
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
    const dir = testDataDir(t);
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
    const dir = testDataDir(t);
    const pid = bystander(t);
    const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    writeFileSync(join(dir, 'process-workers.pids'), `${pid} 1 ${boot}\n`);
    await startAgent(t, { runtime: 'none' }, { dir });
    await new Promise((r) => setTimeout(r, 300));
    t.ok(alive(pid), 'alive');
  });
  t.test('a pid alone for a process that was running when the file was written is still stopped (an upgrade after a crash)', async (t) => {
    const dir = testDataDir(t);
    const pid = bystander(t);
    await new Promise((r) => setTimeout(r, 1100));
    writeFileSync(join(dir, 'process-workers.pids'), `${pid}\n`);
    await startAgent(t, { runtime: 'none' }, { dir });
    await until('the orphan to be gone', async () => !alive(pid), 5000);
    t.pass('stopped');
  });
});

t.test('a second flashd on a live data directory is refused before it touches anything; kill -9 frees the directory', async (t) => {
  const dir = testDataDir(t);
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
  const dir = testDataDir(t);
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
  t.match(flashd.stderr().trimEnd().split('\n').at(-1), /info +stopped ms=\d+ exitCode=1$/, 'the last line says it is over');
  t.equal(flashd.stderr().match(/ stopped ms=/g)?.length, 1, 'once, though the first close was still going');
  await until('the worker to be gone', async () => !alive(pid), 5000);
  t.pass('no worker outlives flashd');
  // --max-attempts 1: a reclaim that used up the job's attempt would fail it.
  const b = await startAgent(t, { runtime: 'none', maxAttempts: 1 }, { dir });
  const s = (await b.req('GET', `/v2/${ep}/status/${id}`)).json;
  t.equal(s.status, 'IN_QUEUE', `the next start reclaims the job without using one of its --max-attempts: ${JSON.stringify(s)}`);
  t.equal(s.retries, 1, 'counted as a requeue');
  t.ok(b.logs.some((l) => /job requeued .*attempt=0 reason="worker wkr_\S+ was stopped by a second signal to the previous run of flashd"/.test(l)), 'its attempt given back');
  const lines = (await b.req('GET', `/v2/serverless/${ep}/logs`)).json as { stream: string; line: string }[];
  t.ok(lines.some((l) => l.stream === 'system' && /^worker wkr_\S+ was stopped by a second signal to the previous run of flashd \(stopping now, without waiting for it\): its key was revoked; its 1 job\(s\) went back to the queue, their attempt given back$/.test(l.line)),
    'the endpoint log says the operator stopped it');
  t.notOk(lines.some((l) => /killed or crashed|did not stop cleanly/.test(l.line)), 'not a crash');
  const noted = b.agent.db.prepare("SELECT count(*) AS n FROM settings WHERE key = 'managed_keys_stopped_by_signal'").get() as { n: number };
  t.equal(noted.n, 0, 'the note is read once: a later crash is not taken for this stop');
});

t.test("flashd's own shutdown hands no new job to any worker, an external one included, while it waits for its own: jobs queued meanwhile run after the restart", async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 20_000, leaseMs: 60_000, workerStopGraceMs: 15_000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ args: 'python3 -u test/fixtures/workers/echo.py', workers: { min: 0, max: 2, idleTimeout: 30 } }),
  })).json.id as string;
  // An external worker (as from `flashd worker-env`) holds a job through the stop.
  const ext = await TestWorker.create(a, ep);
  const first = ext.take();
  await until('the take to park', async () => a.agent.queue.workers.get(ep, ext.workerId)?.parked === 1);
  const held = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 0 } } })).json.id as string;
  t.equal((await first)?.id, held, 'the external worker holds a job');
  // flashd's own worker runs a job long enough for the stop to wait on it.
  const long = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 4 } } })).json.id as string;
  await until('the long job to start', async () => (await a.req('GET', `/v2/${ep}/status/${long}`)).json.status === 'IN_PROGRESS', 30_000);
  const parked = ext.take(true);
  await until('the take to park', async () => a.agent.queue.workers.get(ep, ext.workerId)?.parked === 1);

  const closing = a.agent.close();
  const queued: string[] = [];
  for (let i = 1; i <= 3; i++) {
    const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: i } } });
    t.equal(r.status, 200, `a job submitted during the stop is accepted: ${r.text}`);
    queued.push(r.json.id as string);
  }
  t.equal(await parked, null, 'the parked take got no job');
  let started = performance.now();
  t.equal(await ext.take(true), null, 'a later job-take gets no job');
  t.ok(performance.now() - started >= 200, 'after a short hold, not at once (no tight loop)');
  started = performance.now();
  t.same((await ext.takeBatch(4)).jobs, [], 'nor does a job-take-batch');
  t.ok(performance.now() - started >= 200, 'after a short hold too');
  t.equal((await a.req('GET', `/v2/${ep}/status/${long}`)).json.status, 'IN_PROGRESS', 'all that during the stop');
  t.equal(await ext.ping([held]), 200, 'a ping of a job held is still taken');
  t.equal((await ext.done(held, { output: { ok: held } })).status, 200, 'and its result');
  await closing;

  const b = await startAgent(t, {}, { dir: a.dir });
  const status = (id: string) => (b.agent.db.prepare('SELECT status FROM jobs WHERE id = ?').get(id) as { status: string }).status;
  t.equal(status(held), 'COMPLETED', "the external worker's result was stored");
  t.equal(status(long), 'COMPLETED', "flashd's own worker finished its job within the grace");
  t.same(queued.map(status), ['IN_QUEUE', 'IN_QUEUE', 'IN_QUEUE'], 'the jobs submitted during the stop are still queued');
  const w = ext.rebase(a.url, b.url);
  const got = await w.takeBatch(4);
  t.same(got.jobs.map((j) => j.id).sort(), [...queued].sort(), 'they go out after the restart');
  for (const j of got.jobs) t.equal((await w.done(j.id, { output: 1 })).status, 200);
  t.same(queued.map(status), ['COMPLETED', 'COMPLETED', 'COMPLETED']);
});
