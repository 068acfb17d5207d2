/**
 * The container runtime end to end (issue 4 §1, §2, §5): a real flashd with `runtime: docker`
 * on the Docker Engine API served by podman (`.ci/run` starts it and builds the worker image
 * with build/worker-image.sh), QUEUE endpoints on CPU hardware, jobs through the public API.
 * Deadlines are generous and every wait polls: CI has 2 loaded cores.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer as createHttpServer, request } from 'node:http';
import { tmpdir } from 'node:os';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { ADMIN_KEY, cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { cleanEnv, startFlashd } from '../helpers/spawn-flashd.js';
import { makeNetworkVolume, makeRegistry } from '../helpers/expect.js';
import { until as untilWithin } from '../helpers/wait.js';
import { DockerClient, LABELS, createBody, volumeName, type LaunchSpec } from '../../src/runtime/index.js';

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'] as string;
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'] as string;
if (!SOCKET || !IMAGE) {
  t.plan(0, 'needs a container engine: FLASHD_TEST_CONTAINER_SOCKET and FLASHD_TEST_WORKER_IMAGE (set by .ci/run)');
  process.exit(0);
}

/** The shared helper with this file's default: container starts on 2 loaded cores take a while. */
const until = <T>(what: string, fn: () => Promise<T | undefined | false>, ms = 90_000): Promise<T> => untilWithin(what, fn, ms);

const docker = new DockerClient({ socketPath: SOCKET });
t.teardown(() => docker.close());

const instanceOf = (dir: string): string => readFileSync(join(dir, 'container-instance-id'), 'utf8').trim();
const containersOf = (labels: string[]) => docker.listContainers({ all: true, labels: [`${LABELS.managed}=true`, ...labels] });

/** A flashd with the docker runtime; on teardown, after it closed, no container of it may remain. */
async function start(t: Test, extra: Record<string, unknown> = {}, dir?: string): Promise<TestAgent> {
  const a = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET, takeHoldMs: 1000, leaseMs: 6000, ...extra }, dir ? { dir } : {});
  const instance = instanceOf(a.dir);
  t.teardown(async () => {
    await a.agent.close();
    const left = await containersOf([`${LABELS.instance}=${instance}`]);
    if (left.length) {
      for (const c of left) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
      throw new Error(`${left.length} container(s) leaked after close`);
    }
  });
  return a;
}

async function endpoint(a: TestAgent, extra: Record<string, unknown>): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ image: IMAGE, ...extra }) });
  if (r.status !== 201) throw new Error(`create: ${r.status} ${r.text}`);
  return r.json.id as string;
}

const runsync = async (a: TestAgent, ep: string, input: unknown) => (await a.req('POST', `/v2/${ep}/runsync?wait=120000`, { body: { input } })).json;
const health = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/${ep}/health`)).json;
const logLines = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string; workerId: string }[];
const noWorkers = (h: any) => h.workers.idle + h.workers.running + h.workers.initializing === 0;

/** A socket relayed to the real engine, which `cut()` takes away (the engine stopped, a daemon restart). */
async function engineRelay(relaySocket: string): Promise<{ relaySocket: string; cut(): void }> {
  const open = new Set<Socket>();
  const relay = createServer((c) => {
    const up = connect(SOCKET);
    open.add(c).add(up);
    c.on('close', () => open.delete(c));
    up.on('close', () => open.delete(up));
    c.on('error', () => up.destroy());
    up.on('error', () => c.destroy());
    c.pipe(up).pipe(c);
  });
  await new Promise<void>((r) => relay.listen(relaySocket, r));
  return {
    relaySocket,
    cut: () => {
      relay.close();
      for (const c of open) c.destroy();
    },
  };
}

t.test('OFF: cold start, warm reuse, logs, scale to zero removes the container', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { env: { GREETING: 'hello from env' }, workers: { min: 0, max: 1, idleTimeout: 2 } });
  t.same(await containersOf([`${LABELS.endpoint}=${ep}`]), [], 'no container before a job');

  const first = await runsync(a, ep, { n: 1 });
  t.equal(first.status, 'COMPLETED', `the container starts, takes the job, returns the output: ${JSON.stringify(first)}`);
  t.same(first.output.echo, { n: 1 });
  t.equal(first.output.env, 'hello from env', 'endpoint env reaches the container');
  t.equal(first.output.worker, first.workerId, 'the worker id is the container\'s RUNPOD_POD_ID');
  const running = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.equal(running.length, 1, 'one container');
  t.equal(running[0]?.Labels?.[LABELS.worker], first.workerId, 'labelled with the worker id');

  const second = await runsync(a, ep, { n: 2 });
  t.equal(second.status, 'COMPLETED');
  t.equal(second.workerId, first.workerId, 'the warm worker takes the second job');
  t.equal((await containersOf([`${LABELS.endpoint}=${ep}`])).length, 1, 'still one container');

  const logs = await until('container output in the endpoint log', async () => {
    const l = await logLines(a, ep);
    return l.some((x) => x.stream === 'stdout' && x.line.includes(`handling ${second.id}`)) && l;
  });
  t.ok(logs.some((l) => l.workerId === first.workerId && l.stream === 'stdout'), 'container stdout lines carry the worker id');
  t.ok(logs.some((l) => l.stream === 'system' && /docker runtime/.test(l.line)), 'the start is logged');

  await until('scale to zero after idleTimeout', async () => noWorkers(await health(a, ep)));
  await until('the container removed (OFF)', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0);
  t.pass('worker gone and container removed');
  t.ok(a.logs.some((l) => /container started .*reused=false .*createMs=/.test(l)), 'launch timing is logged (bench hook)');
});

t.test('FLASHBOOT: scale to zero keeps the container stopped; the next job restarts it', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { flashboot: 'FLASHBOOT', workers: { min: 0, max: 1, idleTimeout: 1 } });
  const first = await runsync(a, ep, { n: 1 });
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  const [c1] = await containersOf([`${LABELS.endpoint}=${ep}`]);

  await until('scale to zero', async () => noWorkers(await health(a, ep)));
  const kept = await until('the container stopped, not removed', async () => {
    const list = await containersOf([`${LABELS.endpoint}=${ep}`]);
    return list.length === 1 && list[0]?.State !== 'running' && list[0];
  });
  t.equal(kept.Id, c1?.Id, 'the same container, stopped');
  t.equal(kept.Labels?.[LABELS.flashboot], 'FLASHBOOT');

  const again = await runsync(a, ep, { n: 2 });
  t.equal(again.status, 'COMPLETED', JSON.stringify(again));
  t.equal(again.workerId, first.workerId, 'the kept worker (same id and key) took the job');
  const list = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.same(list.map((c) => [c.Id, c.State]), [[c1?.Id, 'running']], 'restarted, not created');
  t.ok(a.logs.some((l) => /container started .*reused=true/.test(l)), 'the restart is timed as a reuse');
  const logs = await logLines(a, ep);
  t.ok(logs.some((l) => /restarted kept worker/.test(l.line)), 'the endpoint log tells of the FlashBoot restart');
  t.equal(logs.filter((l) => l.line.includes(`handling ${first.id}`)).length, 1, 'the first run\'s output is not replayed by the restart');

  await until('scale to zero again', async () => noWorkers(await health(a, ep)));
  await until('kept again', async () => (await containersOf([`${LABELS.endpoint}=${ep}`]))[0]?.State === 'exited');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status < 300, true, 'endpoint deleted');
  await until('deleting the endpoint removes its kept container', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0);
  t.pass('no container left');
});

t.test('FLASHBOOT: a PATCH that needs a restart while a worker is being stopped keeps no container of the old configuration', async (t) => {
  // The worker ignores SIGTERM, so its stop takes the whole grace period: the PATCH lands in it.
  const a = await start(t, { workerStopGraceMs: 4000 });
  const ep = await endpoint(a, {
    flashboot: 'FLASHBOOT', env: { GEN: '1' }, workers: { min: 0, max: 1, idleTimeout: 1 },
    args: JSON.stringify({ entrypoint: ['sh', '-c', 'trap "" TERM; exec python3 -u /opt/flashd-worker/handler.py'] }),
  });
  const first = await runsync(a, ep, { n: 1 });
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  await until('the idle worker being stopped', async () => a.logs.some((l) => /worker stopping/.test(l)), 30_000);
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { GEN: '2' } } });
  t.same(patched.json.restartReasons, ['env']);
  // The stop ends with the container kept (stopped) or removed.
  await until('the stop to end', async () => {
    const list = await containersOf([`${LABELS.endpoint}=${ep}`]);
    return list.length === 0 || list[0]?.State === 'exited';
  }, 30_000);
  await until('no container of the old configuration', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0, 15_000);
  t.notOk(a.logs.some((l) => /container kept for FlashBoot/.test(l)), 'the worker stopped for the old configuration was not kept');
});

t.test('FLASHBOOT: a PATCH that needs a restart removes the kept container at once, not at the next launch', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { flashboot: 'FLASHBOOT', env: { GEN: '1' }, workers: { min: 0, max: 1, idleTimeout: 1 } });
  const first = await runsync(a, ep, { n: 1 });
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  await until('scale to zero', async () => noWorkers(await health(a, ep)));
  await until('kept stopped', async () => (await containersOf([`${LABELS.endpoint}=${ep}`]))[0]?.State === 'exited');
  const patched = await a.req('PATCH', `/v2/serverless/${ep}`, { body: { env: { GEN: '2' } } });
  t.same(patched.json.restartReasons, ['env']);
  await until('the kept container of the old configuration removed', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0, 30_000);
  const next = await runsync(a, ep, { n: 2 });
  t.equal(next.status, 'COMPLETED', JSON.stringify(next));
  t.not(next.workerId, first.workerId, 'a new worker, with the new configuration');
});

t.test('FLASHBOOT: deleting the endpoint while its kept container restarts stops and removes that container', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { flashboot: 'FLASHBOOT', workers: { min: 0, max: 1, idleTimeout: 1 } });
  t.equal((await runsync(a, ep, { n: 1 })).status, 'COMPLETED');
  await until('scale to zero', async () => noWorkers(await health(a, ep)));
  await until('kept stopped', async () => (await containersOf([`${LABELS.endpoint}=${ep}`]))[0]?.State === 'exited');
  // The next job restarts the kept container; the deletion lands while that restart is under way.
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  await new Promise((r) => setTimeout(r, 30));
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  await until('no container of the deleted endpoint left', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0, 60_000);
  t.pass('removed');
});

t.test('FLASHBOOT: a worker stopped for never asking for a job is removed, not kept for a restart', async (t) => {
  const a = await start(t, { workerStopGraceMs: 1000 });
  const ep = await endpoint(a, {
    flashboot: 'FLASHBOOT', args: 'sleep 600', env: { RUNPOD_INIT_TIMEOUT: '2' }, workers: { min: 0, max: 1, idleTimeout: 30 },
  });
  await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } });
  const first = await until('a container', async () => (await containersOf([`${LABELS.endpoint}=${ep}`]))[0]);
  // Its replacement starts at once and takes its place in /health: the log is what stays.
  await until('the silent worker stopped', async () => (await logLines(a, ep)).some((l) => /never asked for a job/.test(l.line)), 30_000);
  await until('its container removed, not kept', async () => !(await containersOf([`${LABELS.endpoint}=${ep}`])).some((c) => c.Id === first.Id), 60_000);
  t.ok((await logLines(a, ep)).some((l) => /never asked for a job/.test(l.line)), 'the log says why');
});

t.test('a handler that crashes the container: the job is retried, /health shows unhealthy', async (t) => {
  const a = await start(t, { maxAttempts: 2 });
  const ep = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 30 } });
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { crash: true } } })).json.id as string;
  const final = await until('the crashing job to fail', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${id}`)).json;
    return s.status === 'FAILED' && s;
  }, 180_000);
  t.match(final.error, /exited/, 'the reason names the worker exit');
  t.equal(final.retries, 1, 'retried once before failing (maxAttempts 2)');
  const h = await health(a, ep);
  t.ok(h.workers.unhealthy >= 1, `crashed workers are unhealthy: ${JSON.stringify(h.workers)}`);
  t.ok(h.jobs.retried >= 1, 'the retry is counted');
  const logs = await logLines(a, ep);
  t.ok(logs.some((l) => l.line.includes('crashing on purpose')), 'the container\'s last words are in the log');
  t.ok(logs.some((l) => /exited unexpectedly \(code 3\)/.test(l.line)), 'the exit code is reported');
  await until('crashed containers removed', async () =>
    (await containersOf([`${LABELS.endpoint}=${ep}`])).every((c) => c.State === 'running'));
  const ok = await runsync(a, ep, { fine: true });
  t.equal(ok.status, 'COMPLETED', `a healthy job still runs after the crashes: ${JSON.stringify(ok)}`);
});

t.test('env and command encoding as seen inside the container; the safe defaults from inside', async (t) => {
  const a = await start(t);
  const env = { QUOTED: 'a "b" $c \\d', SPACES: ' x  y ', NVIDIA_VISIBLE_DEVICES: 'all', NVIDIA_DRIVER_CAPABILITIES: 'all' };
  // One CPU worker fits this 2-vCPU machine at a time (placement), so these run one by one.
  const json = await endpoint(a, {
    env, workers: { min: 0, max: 1, idleTimeout: 1 },
    args: JSON.stringify({ entrypoint: ['python3', '-u'], cmd: ['/opt/flashd-worker/handler.py', '--flag', 'two words'] }),
  });
  const shell = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 1 }, args: `python3 -u /opt/flashd-worker/handler.py 'single quoted' "double \\"q\\""` });
  const plain = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 1 } });
  const j = await runsync(a, json, { inspect: true });
  const s = await runsync(a, shell, { inspect: true });
  const p = await runsync(a, plain, { inspect: true });
  for (const r of [j, s, p]) t.equal(r.status, 'COMPLETED', JSON.stringify(r).slice(0, 500));
  t.same(j.output.argv, ['/opt/flashd-worker/handler.py', '--flag', 'two words'], 'JSON args: entrypoint and cmd, each argument whole');
  t.same(s.output.argv, ['/opt/flashd-worker/handler.py', 'single quoted', 'double "q"'], 'shell-style args: split like a shell');
  t.same(p.output.argv, ['/opt/flashd-worker/handler.py'], 'no args: the image\'s own CMD');
  const inside = j.output.environ as Record<string, string>;
  t.equal(inside['QUOTED'], env.QUOTED, 'quotes, $ and backslashes arrive as they were');
  t.equal(inside['SPACES'], env.SPACES, 'spaces kept');
  t.equal(inside['NVIDIA_VISIBLE_DEVICES'], 'void', 'the user\'s NVIDIA_VISIBLE_DEVICES is replaced: a CPU worker sees no GPU');
  t.equal(inside['NVIDIA_DRIVER_CAPABILITIES'], undefined, 'NVIDIA_DRIVER_CAPABILITIES removed');
  t.match(inside['RUNPOD_WEBHOOK_GET_JOB'], /^http:\/\/[\d.]+:\d+\/v2\//, 'workers get a URL they can reach (the bridge gateway), not 127.0.0.1');
  t.notMatch(inside['RUNPOD_WEBHOOK_GET_JOB'], /127\.0\.0\.1/);
  t.equal(j.output.capEff, '0000000000000000', 'no capabilities: the Python worker needs none');
  t.equal(j.output.noNewPrivs, '1', 'no-new-privileges');
});

t.test('disk: a container disk limit where the engine has one, else a launch without it', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { disk: 7, workers: { min: 0, max: 1, idleTimeout: 30 } });
  const r = await runsync(a, ep, {});
  t.equal(r.status, 'COMPLETED', JSON.stringify(r));
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  const size = (await docker.inspectContainer(c?.Id as string)).HostConfig.StorageOpt?.['size'];
  const refused = a.logs.some((l) => /cannot limit container disk size/.test(l));
  t.ok(refused !== (size !== undefined), `either StorageOpt.size (${size ?? 'none'}) or the logged refusal (${refused}), not both`);
  if (size !== undefined) t.match(size, /^7G/, 'the endpoint\'s disk in GB');
});

t.test('a network volume is visible at /vendor-volume and outlives its workers', async (t) => {
  const a = await start(t);
  const nv = await makeNetworkVolume(t, a, { name: 'models' });
  t.teardown(async () => {
    await a.agent.close();
    await docker.removeVolume(volumeName(nv.id), { force: true });
  });
  const body = { mounts: { network: [{ volumeId: nv.id }] }, workers: { min: 0, max: 1, idleTimeout: 1 } };
  const writer = await endpoint(a, body);
  const reader = await endpoint(a, body);
  const w = await runsync(a, writer, { writeVolume: { name: 'weights.txt', content: 'shared bytes' } });
  t.equal(w.status, 'COMPLETED', JSON.stringify(w));
  const r = await runsync(a, reader, { readVolume: 'weights.txt' });
  t.equal(r.output.volume, 'shared bytes', 'another endpoint\'s worker reads what the first wrote');
  t.equal(r.output.volumeIsMount, true, '/vendor-volume is a mount');
  const vol = await docker.inspectVolume(volumeName(nv.id));
  t.equal(vol?.Labels?.[LABELS.volume], nv.id, `a flashd-managed named volume: ${volumeName(nv.id)}`);
  t.equal(vol?.Labels?.[LABELS.instance], instanceOf(a.dir), 'labelled with the flashd that made it');
  const [c] = await containersOf([`${LABELS.endpoint}=${reader}`]);
  const mounts = (await docker.inspectContainer(c?.Id as string)).Mounts ?? [];
  t.same(mounts.map((m) => [m.Type, m.Name, m.Destination]), [['volume', volumeName(nv.id), '/vendor-volume']], 'the only mount');
});

t.test('deleting a network volume removes its engine volume, once no worker mounts it any more', async (t) => {
  const a = await start(t);
  const nv = await makeNetworkVolume(t, a, { name: 'scratch' });
  t.teardown(() => docker.removeVolume(volumeName(nv.id), { force: true }));
  const ep = await endpoint(a, { mounts: { network: [{ volumeId: nv.id }] }, workers: { min: 1, max: 1 } });
  const w = await runsync(a, ep, { writeVolume: { name: 'data.txt', content: 'bytes to delete' } });
  t.equal(w.status, 'COMPLETED', JSON.stringify(w));
  t.ok(await docker.inspectVolume(volumeName(nv.id)), 'the engine volume exists');
  const refused = await a.req('DELETE', `/v2/network-volumes/${nv.id}`);
  t.equal(refused.status, 409, 'refused while an endpoint mounts it');
  t.match(refused.json.detail, ep, 'naming the endpoint');
  t.ok(await docker.inspectVolume(volumeName(nv.id)), 'the engine volume is kept');

  // Detached: the warm worker (workers.min 1) still has it mounted until it is replaced.
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { mounts: { network: [] } } })).status, 200);
  t.equal((await a.req('DELETE', `/v2/network-volumes/${nv.id}`)).status, 204, 'deletable once detached');
  await until('the engine volume removed with its data', async () => (await docker.inspectVolume(volumeName(nv.id))) === null);
  t.pass(`${volumeName(nv.id)} is gone`);
  t.comment(a.logs.some((l) => /still in use/.test(l)) ? 'it was still in use at the DELETE' : 'no worker used it any more at the DELETE');
});

t.test('the engine volume of a volume deleted while a worker still used it goes at the next start, after a crash', async (t) => {
  const dir = t.testdir();
  const first = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET }, { dir });
  const instance = instanceOf(dir);
  const gone = await makeNetworkVolume(t, first, { name: 'deleted' });
  const kept = await makeNetworkVolume(t, first, { name: 'kept' });
  t.equal((await first.req('DELETE', `/v2/network-volumes/${gone.id}`)).status, 204);
  await first.agent.close();
  // What a flashd killed while a worker of an older configuration still mounted a volume deleted
  // meanwhile leaves in the engine: that volume (its removal was only pending in memory), beside
  // the volume of a flashd volume that still exists and a deleted one of another flashd.
  const labels = (id: string, owner: string) => ({ [LABELS.managed]: 'true', [LABELS.volume]: id, [LABELS.instance]: owner, 'dev.flashd.volume-kind': 'network' });
  const other = `nv_other${process.pid}`;
  for (const [id, owner] of [[gone.id, instance], [kept.id, instance], [other, 'another-flashd']] as const) {
    await docker.createVolume(volumeName(id), labels(id, owner));
    t.teardown(() => docker.removeVolume(volumeName(id), { force: true }));
  }

  const a = await start(t, {}, dir);
  await until('the deleted volume\'s engine volume removed', async () => (await docker.inspectVolume(volumeName(gone.id))) === null);
  t.pass(`${volumeName(gone.id)} is gone with its data`);
  t.ok(await docker.inspectVolume(volumeName(kept.id)), 'the volume of a flashd volume that still exists is kept');
  t.ok(await docker.inspectVolume(volumeName(other)), 'another flashd\'s volume is left alone');
  t.ok(a.logs.some((l) => /volume removed .*volume=flashd-volume-/.test(l)), 'and logged');
});

t.test('registry credentials reach the engine only: not the container, labels, logs or API', async (t) => {
  const a = await start(t);
  const password = `pw-${process.pid}-never-shown`;
  const reg = await makeRegistry(t, a, { username: 'robot', password });
  const ep = await endpoint(a, { registry: reg.id, workers: { min: 0, max: 1, idleTimeout: 5 } });
  const r = await runsync(a, ep, { inspect: true });
  t.equal(r.status, 'COMPLETED', JSON.stringify(r).slice(0, 300));
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  const inspect = await docker.inspectContainer(c?.Id as string);
  t.notMatch(JSON.stringify(inspect.Config.Env), password, 'not in Config.Env');
  t.notMatch(JSON.stringify(inspect.Config.Labels), password, 'not in the labels');
  t.notMatch(JSON.stringify(r.output.environ), password, 'not in the environment seen inside');
  t.notMatch(JSON.stringify(await logLines(a, ep)), password, 'not in the endpoint log');
  t.notMatch((await a.req('GET', `/v2/serverless/${ep}`)).text, password, 'not in the endpoint view');
  t.notMatch(a.logs.join(''), password, 'not in flashd\'s log');
});

t.test('after a restart, containers left by the previous run are removed; none leak', async (t) => {
  const dir = t.testdir();
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
  const dir = t.testdir();
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
  const dir = t.testdir();
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

interface Proxied {
  method: string;
  url: string;
  body: Buffer;
}

/**
 * The real engine behind an HTTP proxy. `before` sees each request first and may hold it (a
 * slow engine) or refuse it: a string is answered as the engine's 500 with that message.
 * `created` gets the id of each container created. Attach (an upgraded connection) is relayed as is.
 */
async function engineProxy(path: string, o: {
  before?(r: Proxied): Promise<string | undefined> | string | undefined;
  created?(r: Proxied, id: string): void;
}): Promise<{ close(): Promise<void> }> {
  const server = createHttpServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => void (async () => {
      const r: Proxied = { method: req.method ?? 'GET', url: req.url ?? '/', body: Buffer.concat(chunks) };
      const refused = await o.before?.(r);
      if (refused !== undefined) {
        res.writeHead(500, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ message: refused }));
      }
      const create = r.method === 'POST' && /\/containers\/create\b/.test(r.url);
      const up = request({ socketPath: SOCKET, method: r.method, path: r.url, headers: req.headers }, (u) => {
        if (!create) {
          res.writeHead(u.statusCode ?? 502, u.headers);
          return void u.pipe(res);
        }
        const out: Buffer[] = [];
        u.on('data', (c: Buffer) => out.push(c));
        u.on('end', () => {
          const text = Buffer.concat(out).toString('utf8');
          if (u.statusCode === 201) o.created?.(r, JSON.parse(text).Id);
          res.writeHead(u.statusCode ?? 502, { 'content-type': 'application/json' });
          res.end(text);
        });
      });
      up.on('error', () => res.destroy());
      up.end(r.body);
    })());
  });
  server.on('upgrade', (req, socket, head) => {
    const up = connect(SOCKET);
    const lines = [`${req.method} ${req.url} HTTP/1.1`];
    for (let i = 0; i < req.rawHeaders.length; i += 2) lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
    up.write(lines.join('\r\n') + '\r\n\r\n');
    up.write(head);
    up.on('error', () => socket.destroy());
    socket.on('error', () => up.destroy());
    socket.pipe(up).pipe(socket);
  });
  await new Promise<void>((r) => server.listen(path, r));
  return { close: () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }) };
}

/**
 * The real engine, refusing `HostConfig.Init` the way an engine without its init binary does, in
 * its words: Podman without catatonit at create, Docker without docker-init at start.
 */
async function engineWithoutInit(path: string, refuses: 'create' | 'start'): Promise<{ creates: { init: boolean }[]; close(): Promise<void> }> {
  const creates: { init: boolean }[] = [];
  const withInit = new Set<string>();
  const initOf = (r: Proxied): boolean => JSON.parse(r.body.toString('utf8')).HostConfig?.Init === true;
  const proxy = await engineProxy(path, {
    before(r) {
      if (r.method !== 'POST') return undefined;
      if (/\/containers\/create\b/.test(r.url)) {
        creates.push({ init: initOf(r) });
        if (initOf(r) && refuses === 'create') {
          return 'container create: container-init binary not found on the host: stat /usr/libexec/podman/catatonit: no such file or directory';
        }
      }
      const started = /\/containers\/([^/]+)\/start\b/.exec(r.url)?.[1];
      return started && withInit.has(started) ? 'exec: "docker-init": executable file not found in $PATH' : undefined;
    },
    created: (r, id) => void (initOf(r) && withInit.add(id)),
  });
  return { creates, close: proxy.close };
}

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

t.test('engine sockets', async (t) => {
  const sockets = mkdtempSync(join(tmpdir(), 'flashd-sock-'));
  t.teardown(() => rmSync(sockets, { recursive: true, force: true }));

  t.test('runtime docker without a socket fails to start', async (t) => {
    const err = await startAgent(t, { runtime: 'docker', containerSocket: join(sockets, 'missing.sock') }).catch((e: Error) => e);
    t.match(String(err), /no Docker Engine API socket found/);
  });

  t.test('auto without a socket: runtime none, logged', async (t) => {
    const auto = await startAgent(t, { runtime: 'auto', containerSocket: join(sockets, 'missing.sock') });
    t.ok(auto.logs.some((l) => /no container engine socket found: runtime none/.test(l)));
    t.ok(auto.logs.some((l) => /flashd listening .*runtime=none/.test(l)));
  });

  t.test('an engine that does not answer: no capacity, jobs wait throttled, nothing unhealthy', async (t) => {
    const dead = join(sockets, 'dead.sock');
    const server = createServer((c) => c.destroy());
    await new Promise<void>((r) => server.listen(dead, r));
    t.teardown(() => new Promise<void>((r) => server.close(() => r())));
    const d = await startAgent(t, { runtime: 'docker', containerSocket: dead });
    t.ok(d.logs.some((l) => /container engine unreachable/.test(l)), 'the outage is logged');
    const ep = await endpoint(d, { workers: { min: 0, max: 1, idleTimeout: 5 } });
    const id = (await d.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    const h = await until('the endpoint to show throttled', async () => {
      const x = await health(d, ep);
      return x.workers.throttled >= 1 && x;
    }, 30_000);
    t.equal(h.workers.unhealthy, 0, 'no capacity is not a crash');
    t.equal((await d.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the job waits');
  });

  t.test('an engine that goes away after it was ready: the start that finds it gone is no crash', async (t) => {
    // flashd talks to the real engine through a relay that the test takes away (the engine stopped).
    const { relaySocket, cut } = await engineRelay(join(sockets, 'gone.sock'));
    const d = await startAgent(t, { runtime: 'docker', containerSocket: relaySocket });
    t.ok(d.logs.some((l) => /container engine ready/.test(l)), 'the engine answered at start');
    const ep = await endpoint(d, { workers: { min: 0, max: 1, idleTimeout: 5 } });
    cut();
    const id = (await d.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
    await until('the start to fail on the missing engine', async () => d.logs.some((l) => /worker failed to start/.test(l)), 30_000);
    const h = await until('the endpoint to show throttled', async () => {
      const x = await health(d, ep);
      return x.workers.throttled >= 1 && x;
    }, 30_000);
    t.equal(h.workers.unhealthy, 0, 'no capacity is not a crash, even for the start that found the engine gone');
    t.notOk(d.logs.some((l) => /worker exited unexpectedly/.test(l)), 'no crash logged');
    t.equal((await d.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'the job waits');
  });

  t.test('a worker whose container dies while the engine is unreachable stops counting as idle once it falls silent', async (t) => {
    // The engine cannot report the exit (its API is down), but the worker's job-take and pings stop.
    const { relaySocket, cut } = await engineRelay(join(sockets, 'silent.sock'));
    const d = await startAgent(t, { runtime: 'docker', containerSocket: relaySocket, takeHoldMs: 1000, workerStopGraceMs: 1000, leaseMs: 6000 });
    const instance = instanceOf(d.dir);
    t.teardown(async () => {
      for (const c of await containersOf([`${LABELS.instance}=${instance}`])) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
    });
    const ep = await endpoint(d, { workers: { min: 1, max: 1, idleTimeout: 30 } });
    await until('a worker up', async () => (await health(d, ep)).workers.idle === 1);
    await new Promise((r) => setTimeout(r, 8000));
    t.equal((await health(d, ep)).workers.idle, 1, 'a live idle worker stays idle past the lease (its job-take is open)');
    const [c] = await containersOf([`${LABELS.instance}=${instance}`]);
    cut();
    await docker.killContainer(c?.Id as string);
    const killed = Date.now();
    const seen: string[] = [];
    const h = await until('the dead worker no longer idle', async () => {
      const x = await health(d, ep);
      const line = JSON.stringify(x.workers);
      if (!seen.at(-1)?.endsWith(line)) seen.push(`${Date.now() - killed} ms: ${line}`);
      return x.workers.idle === 0 && x;
    }, 45_000).catch((e: Error) => { t.comment(seen.join('\n')); throw e; });
    t.ok(Date.now() - killed < 20_000, `no longer idle ${Date.now() - killed} ms after it died (lease 6 s)`);
    t.equal(h.workers.ready, 0, 'nor ready');
    t.equal(h.workers.unhealthy, 1, 'but unhealthy');
  });

  t.test('an engine that goes away while a worker runs does not hold the shutdown', async (t) => {
    // flashd talks to the real engine through a relay that the test cuts (a daemon restart, or
    // the engine stopped first at system shutdown).
    const { relaySocket, cut } = await engineRelay(join(sockets, 'relay.sock'));
    const d = await startAgent(t, { runtime: 'docker', containerSocket: relaySocket, takeHoldMs: 1000, workerStopGraceMs: 1000 });
    const instance = instanceOf(d.dir);
    t.teardown(async () => {
      for (const c of await containersOf([`${LABELS.instance}=${instance}`])) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
    });
    const ep = await endpoint(d, { workers: { min: 1, max: 1, idleTimeout: 30 } });
    await until('a worker up', async () => (await health(d, ep)).workers.idle === 1);
    cut();
    const started = Date.now();
    await d.agent.close();
    const took = Date.now() - started;
    t.ok(took < 20_000, `closed in ${took} ms (grace 1 s + 5 s, not for ever)`);
  });
});
