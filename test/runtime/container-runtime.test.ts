/**
 * The container runtime end to end (issue 4 §1, §2, §5): cold start, warm reuse, logs, scale to
 * zero, FlashBoot, crashes, env and command encoding.
 * A real flashd with `runtime: docker` on the Docker Engine API served by podman (see
 * test/helpers/containers.ts), QUEUE endpoints on CPU hardware, jobs through the public API.
 * Deadlines are generous and every wait polls: CI has 2 loaded cores.
 */
import { until, docker, containersOf, start, endpoint, runsync, health, logLines, noWorkers, engineProxy } from '../helpers/containers.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { testDataDir } from '../helpers/data-dir.js';
import { createLogger } from '../../src/core/logger.js';
import { ContainerRuntime, LABELS, type LaunchSpec } from '../../src/runtime/index.js';

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
  // One id throughout the worker's life: the restart's start line names the kept worker, never
  // a fresh id that then does not run (it used to say `starting worker <fresh id>` first).
  const starts = logs.filter((l) => l.stream === 'system' && /^starting worker /.test(l.line));
  t.same(starts.map((l) => [l.workerId, l.line.split(' ')[2]]), [[first.workerId, first.workerId], [first.workerId, first.workerId]], 'both start lines name the kept worker');
  t.match(starts[1]?.line, /its kept container restarts \(FlashBoot\)/, 'the endpoint log tells of the FlashBoot restart');
  t.same(a.logs.filter((l) => /worker starting/.test(l)).map((l) => /workerId=(\S+)/.exec(l)?.[1]), [first.workerId, first.workerId], "flashd's log names the kept worker too");
  t.notOk(logs.some((l) => l.workerId !== first.workerId && l.workerId !== null), 'no other worker id in the endpoint log');
  t.equal(logs.filter((l) => l.line.includes(`handling ${first.id}`)).length, 1, 'the first run\'s output is not replayed by the restart');

  await until('scale to zero again', async () => noWorkers(await health(a, ep)));
  await until('kept again', async () => (await containersOf([`${LABELS.endpoint}=${ep}`]))[0]?.State === 'exited');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status < 300, true, 'endpoint deleted');
  await until('deleting the endpoint removes its kept container', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0);
  t.pass('no container left');
});

t.test('FLASHBOOT: a worker recycled by refresh_worker is not kept: the next job gets a new container', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { flashboot: 'FLASHBOOT', workers: { min: 0, max: 1, idleTimeout: 30 } });
  const first = await runsync(a, ep, { refresh: true });
  t.equal(first.status, 'COMPLETED', JSON.stringify(first));
  const [c1] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.ok(c1, 'its container');
  await until('the recycled container removed, not kept stopped', async () => (await containersOf([`${LABELS.endpoint}=${ep}`])).length === 0);
  const again = await runsync(a, ep, { n: 2 });
  t.equal(again.status, 'COMPLETED', JSON.stringify(again));
  t.not(again.workerId, first.workerId, 'a new worker took the next job');
  t.equal(again.output?.leftover, null, 'nothing the recycled worker left in its filesystem');
  const list = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.notOk(list.some((c) => c.Id === c1?.Id), 'in a new container');
  t.notOk(a.logs.some((l) => /container kept for FlashBoot/.test(l)), 'no recycled container was kept');
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

t.test('a worker container removed outside flashd (rm -f) is said so, with no exit code: not a clean exit', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { workers: { min: 0, max: 1, idleTimeout: 30 } });
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { sleep: 600 } } })).json.id as string;
  await until('the job to run', async () => (await a.req('GET', `/v2/${ep}/status/${id}`)).json.status === 'IN_PROGRESS');
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  const worker = c?.Labels?.[LABELS.worker] as string;
  await docker.removeContainer(c?.Id as string, { force: true });
  const exit = await until('the exit to be reported', async () => (await logLines(a, ep)).find((l) => l.stream === 'system' && l.workerId === worker && /exited/.test(l.line)));
  t.equal(exit.line, `worker ${worker} exited unexpectedly (code ?)`, 'no exit code: the engine\'s 0 or 137 for a removed container is not the handler\'s');
  const lines = (await logLines(a, ep)).filter((l) => l.workerId === worker).map((l) => l.line);
  t.ok(lines.includes('flashd: the container was removed outside flashd (docker/podman rm); its exit code is unknown'), 'the endpoint log says why');
  t.ok(a.logs.some((l) => /worker container removed outside flashd .*workerId=/.test(l)), 'and flashd\'s log');
  t.equal((await a.req('POST', `/v2/${ep}/cancel/${id}`)).status, 200, 'the job, queued again for a new worker, is cancelled');
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

t.test('launches of one image with different registry credentials do not share a pull in flight', async (t) => {
  const sockets = mkdtempSync(join(tmpdir(), 'flashd-pullkey-'));
  t.teardown(() => rmSync(sockets, { recursive: true, force: true }));
  // The engine refuses every pull after a while, naming the registry user it was sent (none without X-Registry-Auth).
  const pulls: string[] = [];
  const engine = await engineProxy(join(sockets, 'engine.sock'), {
    async before(r) {
      if (r.method !== 'POST' || !/\/images\/create\b/.test(r.url)) return undefined;
      const auth = r.headers['x-registry-auth'];
      const user = typeof auth === 'string' ? (JSON.parse(Buffer.from(auth, 'base64url').toString('utf8')) as { username: string }).username : 'none';
      pulls.push(user);
      await new Promise((res) => setTimeout(res, 1000));
      return `pull access denied for user ${user}`;
    },
  });
  t.teardown(() => engine.close());
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', format: 'text', sink: { write: (l: string) => void lines.push(l) } });
  const runtime = new ContainerRuntime({ socketPath: join(sockets, 'engine.sock'), dataDir: testDataDir(t), log, workerUrl: 'http://127.0.0.1:9' });
  await runtime.start({ host: '127.0.0.1', port: 9 });
  t.teardown(() => runtime.close());
  t.ok(runtime.ready, 'the engine answered through the proxy');

  const image = `127.0.0.1:9/flashd/private:t${process.pid}`;
  let n = 0;
  const spec = (registryAuth: LaunchSpec['registryAuth']): LaunchSpec => ({
    endpointId: 'ep-pullkey', workerId: `wkr_pullkey${process.pid}${++n}`, entrypoint: [], cmd: [], image, env: {}, ports: [], diskGb: null, volume: null,
    gpuDeviceIds: [], cpu: { vcpuCount: 1, memoryGb: 1 }, registryAuth, flashboot: 'OFF', configHash: `pullkey${n}`,
  });
  const robot = { username: 'robot', password: 'pw-never-logged-0001', serveraddress: '127.0.0.1:9' };
  const events = { log: () => undefined, exit: () => undefined };
  const settle = (p: Promise<unknown>): Promise<string> => p.then(() => 'started', (err: unknown) => String(err));
  const anonymous = settle(runtime.launch(spec(null), events));
  await until('the first pull in flight', async () => pulls.length === 1);
  const withCredential = settle(runtime.launch(spec(robot), events));
  const sameCredential = settle(runtime.launch(spec({ ...robot }), events));
  const otherPassword = settle(runtime.launch(spec({ ...robot, password: 'pw-never-logged-0002' }), events));
  t.match(await anonymous, /pull access denied for user none/);
  t.match(await withCredential, /pull access denied for user robot/, 'the launch with a credential gets its own pull, not the anonymous one\'s failure');
  t.match(await sameCredential, /pull access denied for user robot/);
  t.match(await otherPassword, /pull access denied for user robot/);
  t.same(pulls.sort(), ['none', 'robot', 'robot'], 'one pull per image and credential: the same credential shares one, another password gets its own');
  t.notMatch(lines.join(''), /pw-never-logged/, 'no password in flashd\'s log');
});
