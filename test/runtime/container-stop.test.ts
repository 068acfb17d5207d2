/**
 * The container runtime across flashd's restarts and stops: leftovers removed at start, a second
 * SIGTERM, the init process, engines without an init binary.
 * A real flashd with `runtime: docker` on the Docker Engine API served by podman (see
 * test/helpers/containers.ts), QUEUE endpoints on CPU hardware, jobs through the public API.
 * Deadlines are generous and every wait polls: CI has 2 loaded cores.
 */
import { SOCKET, IMAGE, until, docker, instanceOf, containersOf, start, endpoint, runsync, health, logLines, noWorkers, engineProxy, engineWithoutInit } from '../helpers/containers.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { testDataDir } from '../helpers/data-dir.js';
import t from 'tap';
import { ADMIN_KEY, cpuBody, startAgent } from '../helpers/agent.js';
import { cleanEnv, startFlashd } from '../helpers/spawn-flashd.js';
import { LABELS, createBody, type LaunchSpec } from '../../src/runtime/index.js';

t.test('after a restart, containers left by the previous run are removed; none leak', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET }, { dir });
  await first.agent.close();
  const instance = instanceOf(dir);
  // What a crashed flashd leaves: a running worker and a stopped FlashBoot one, with its labels.
  const leftover = (n: number, flashboot: LaunchSpec['flashboot']): LaunchSpec => ({
    endpointId: 'leftoverendpnt', workerId: `wkr_left${n}${process.pid}`, entrypoint: ['sleep'], cmd: ['300'], image: IMAGE,
    env: {}, ports: [], diskGb: null, volume: null, gpuDeviceIds: [], cpu: null, registryAuth: null, flashboot, configHash: 'x',
  });
  const ids: string[] = [];
  for (const [n, mode] of [[1, 'OFF'], [2, 'FLASHBOOT']] as const) {
    const { Id } = await docker.createContainer(createBody(leftover(n, mode), { instanceId: instance, diskLimit: false }), `flashd-wkr_left${n}${process.pid}`);
    ids.push(Id);
  }
  await docker.startContainer(ids[0] as string);
  const other = await docker.createContainer(createBody(leftover(3, 'OFF'), { instanceId: 'another-flashd', diskLimit: false }), `flashd-wkr_left3${process.pid}`);
  t.teardown(() => docker.removeContainer(other.Id, { force: true }));

  const a = await start(t, {}, dir);
  t.same(await containersOf([`${LABELS.instance}=${instance}`]), [], 'both leftovers of this data directory removed at start');
  t.ok(await docker.inspectContainer(other.Id), 'another flashd\'s container is left alone');
  t.ok(a.logs.some((l) => /removed containers left by a previous run .*count=2/.test(l)), 'and logged');
});

t.test('a second SIGTERM during a clean stop exits 1 at once and leaves no container behind', async (t) => {
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'docker', '--container-socket', SOCKET, '--worker-stop-grace-ms', '60000',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const instance = instanceOf(dir);
  t.teardown(async () => {
    for (const c of await containersOf([`${LABELS.instance}=${instance}`])) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
  });
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const body = (extra: Record<string, unknown>) => cpuBody({ image: IMAGE, workers: { min: 0, max: 1, idleTimeout: 1 }, ...extra });
  // A kept FlashBoot container of one endpoint, a busy worker of another.
  const kept = (await call('POST', '/v2/serverless', body({ name: 'kept', flashboot: 'FLASHBOOT' }))).id as string;
  t.equal((await call('POST', `/v2/${kept}/runsync?wait=120000`, { input: {} })).status, 'COMPLETED');
  await until('the FlashBoot container to be kept', async () => /container kept for FlashBoot/.test(flashd.stderr()));
  const busy = (await call('POST', '/v2/serverless', body({ name: 'busy' }))).id as string;
  const id = (await call('POST', `/v2/${busy}/run`, { input: { sleep: 120 } })).id as string;
  await until('the job to start', async () => (await call('GET', `/v2/${busy}/status/${id}`)).status === 'IN_PROGRESS');
  t.equal((await containersOf([`${LABELS.instance}=${instance}`])).length, 2, 'two containers: one running, one kept');

  flashd.child.kill('SIGTERM');
  await until('the clean stop to begin', async () => /shutting down/.test(flashd.stderr()), 5000);
  await new Promise((r) => setTimeout(r, 500));
  t.equal(flashd.child.exitCode, null, 'the first SIGTERM waits for the running job (60 s grace)');
  const started = Date.now();
  t.equal(await flashd.stop('SIGTERM'), 1, 'the second exits 1');
  t.ok(Date.now() - started < 10_000, `soon, not after the grace (${Date.now() - started} ms)`);
  t.match(flashd.stderr(), /removed containers \(second signal\): their jobs are queued again at the next start count=2/, 'and says so');
  t.same(await containersOf([`${LABELS.instance}=${instance}`]), [], 'no container of it is left, running or kept');
  const b = await startAgent(t, { runtime: 'none' }, { dir });
  t.equal((await b.req('GET', `/v2/${busy}/status/${id}`)).json.status, 'IN_QUEUE', 'the next start reclaims the job');
});

t.test('a second SIGTERM while a container is being started leaves that container behind neither', async (t) => {
  // The engine takes its time to start the container: both signals land between its create and
  // its start, before the runtime has registered it as running.
  const sockets = mkdtempSync(join(tmpdir(), 'flashd-slowstart-'));
  t.teardown(() => rmSync(sockets, { recursive: true, force: true }));
  let startAsked!: () => void;
  const asked = new Promise<void>((r) => (startAsked = r));
  const engine = await engineProxy(join(sockets, 'engine.sock'), {
    async before(r) {
      if (r.method !== 'POST' || !/\/containers\/[^/]+\/start\b/.test(r.url)) return undefined;
      startAsked();
      await new Promise((w) => setTimeout(w, 3000));
      return undefined;
    },
  });
  t.teardown(() => engine.close());
  const dir = testDataDir(t);
  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', dir, '--runtime', 'docker', '--container-socket', join(sockets, 'engine.sock'),
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  const instance = instanceOf(dir);
  t.teardown(async () => {
    for (const c of await containersOf([`${LABELS.instance}=${instance}`])) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
  });
  const r = await fetch(`${flashd.url}/v2/serverless`, {
    method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(cpuBody({ image: IMAGE, workers: { min: 1, max: 1, idleTimeout: 5 } })),
  });
  t.equal(r.status, 201);
  await asked;
  flashd.child.kill('SIGTERM');
  await until('the clean stop to begin', async () => /shutting down/.test(flashd.stderr()), 5000);
  t.equal(await flashd.stop('SIGTERM'), 1, 'the second signal exits 1');
  // The start the engine was still working on lands after the exit.
  await new Promise((w) => setTimeout(w, 4000));
  const left = await containersOf([`${LABELS.instance}=${instance}`]);
  t.same(left.map((c) => `${c.Names?.[0] ?? c.Id} ${c.State}`), [], 'no container of it is left, running or created');
  t.match(flashd.stderr(), /removed containers \(second signal\).* count=1/, 'the one being started is counted');
});

t.test('an init process is PID 1: a worker stopped while booting stops at SIGTERM, not after the grace', async (t) => {
  // Python as PID 1 before the SDK installed its SIGTERM handler (importing torch, loading a
  // model): PID 1 gets no default signal action, so without an init `docker stop` waits out the
  // whole grace and kills.
  const a = await start(t, { workerStopGraceMs: 30_000 });
  const ep = await endpoint(a, {
    workers: { min: 1, max: 1, idleTimeout: 30 },
    args: JSON.stringify({ entrypoint: ['python3', '-u', '-c', 'import time; print("loading the model", flush=True); time.sleep(600)'] }),
  });
  await until('the worker booting', async () => (await logLines(a, ep)).some((l) => /loading the model/.test(l.line)));
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.equal((await docker.inspectContainer(c?.Id as string)).HostConfig.Init, true, 'created with HostConfig.Init');
  const stopping = Date.now();
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  await until('its container removed', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0, 60_000);
  const took = Date.now() - stopping;
  t.ok(took < 10_000, `stopped and removed in ${took} ms, not after the 30 s grace`);
});

for (const [engineName, refuses] of [['Podman', 'create'], ['Docker', 'start']] as const) {
  t.test(`an engine without an init binary (${engineName}: refused at ${refuses}): containers start without one, logged once`, async (t) => {
    const sockets = mkdtempSync(join(tmpdir(), 'flashd-noinit-'));
    t.teardown(() => rmSync(sockets, { recursive: true, force: true }));
    const engine = await engineWithoutInit(join(sockets, 'engine.sock'), refuses);
    t.teardown(() => engine.close());
    const a = await start(t, { containerSocket: join(sockets, 'engine.sock') });
    t.teardown(() => a.agent.close());
    const ep = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 1 } });
    const first = await runsync(a, ep, { n: 1 });
    t.equal(first.status, 'COMPLETED', `the job runs: ${JSON.stringify(first)}`);
    const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
    t.notOk((await docker.inspectContainer(c?.Id as string)).HostConfig.Init, 'the container was created without HostConfig.Init');
    await until('scale to zero', async () => noWorkers(await health(a, ep)));
    const second = await runsync(a, ep, { n: 2 });
    t.equal(second.status, 'COMPLETED', JSON.stringify(second));
    t.same(engine.creates, [{ init: true }, { init: false }, { init: false }], 'asked once with Init, then without it from then on');
    const warned = a.logs.filter((l) => /the container engine has no init binary/.test(l));
    t.equal(warned.length, 1, `one warning: ${warned.join('')}`);
    t.match(warned[0], /catatonit|docker-init/, 'with the engine\'s reason and what to install');
    t.notOk(a.logs.some((l) => /worker failed to start/.test(l)), 'no start failed');
  });
}
