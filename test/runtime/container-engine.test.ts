/**
 * The container runtime's engine socket: missing, silent, cut and restored engines.
 * A real flashd with `runtime: docker` on the Docker Engine API served by podman (see
 * test/helpers/containers.ts), QUEUE endpoints on CPU hardware, jobs through the public API.
 * Deadlines are generous and every wait polls: CI has 2 loaded cores.
 */
import { until, docker, instanceOf, containersOf, endpoint, health, engineRelay } from '../helpers/containers.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer } from 'node:net';
import { createServer as createHttpServer, type ServerResponse } from 'node:http';
import { join } from 'node:path';
import t from 'tap';
import { startAgent } from '../helpers/agent.js';
import { LABELS } from '../../src/runtime/index.js';

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

  t.test('an engine that never answers /version is waited for once at start, not once per step', async (t) => {
    // A hung engine (its socket accepts, its API never replies): the refusal check before recovery
    // and the connection of start() must not each wait out the 10 s /version timeout.
    const hung = join(sockets, 'hung.sock');
    let versions = 0;
    const held = new Set<ServerResponse>();
    const server = createHttpServer((req, res) => {
      if (/\/version$/.test(req.url ?? '')) versions++;
      held.add(res);
    });
    await new Promise<void>((r) => server.listen(hung, r));
    t.teardown(() => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }));
    const started = Date.now();
    const d = await startAgent(t, { runtime: 'docker', containerSocket: hung });
    const took = Date.now() - started;
    t.equal(versions, 1, 'the engine was asked for /version once before flashd served');
    t.ok(took < 20_000, `served ${took} ms after the start (one 10 s wait, not two)`);
    t.ok(d.logs.some((l) => /container engine unreachable/.test(l)), 'the outage is logged');
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

  t.test('a worker stopped while the engine is unreachable is stopped once it answers again', async (t) => {
    // The idle stop finds the engine gone (its API down; the container runs on): it is sent again
    // when the engine is back, so the container does not run for good holding its vCPUs.
    const { relaySocket, cut, restore } = await engineRelay(join(sockets, 'back.sock'));
    const d = await startAgent(t, { runtime: 'docker', containerSocket: relaySocket, takeHoldMs: 1000, workerStopGraceMs: 1000, leaseMs: 6000 });
    const instance = instanceOf(d.dir);
    const mine = () => containersOf([`${LABELS.instance}=${instance}`]);
    t.teardown(async () => {
      for (const c of await mine()) await docker.removeContainer(c.Id, { force: true }).catch(() => undefined);
      cut();
    });
    const ep = await endpoint(d, { workers: { min: 0, max: 1, idleTimeout: 5 } });
    const done = (await d.req('POST', `/v2/${ep}/runsync?wait=120000`, { body: { input: { n: 1 } } })).json;
    t.equal(done.status, 'COMPLETED', 'a worker ran the job');
    cut();
    await until('the idle stop to fail on the missing engine', async () => d.logs.some((l) => /cannot stop container/.test(l)), 60_000);
    t.ok(d.logs.some((l) => /container engine unreachable/.test(l)), 'the outage is logged');
    t.equal((await mine()).filter((c) => c.State === 'running').length, 1, 'its container still runs');
    await restore();
    await until('the container stopped and removed once the engine answers', async () => (await mine()).length === 0)
      .catch((e: Error) => { t.comment(d.logs.join('\n')); throw e; });
    const h = await until('the worker gone', async () => {
      const x = await health(d, ep);
      return x.workers.idle + x.workers.running + x.workers.initializing === 0 && x;
    }, 30_000);
    t.equal(h.workers.unhealthy, 0, 'a stop, not a crash');
    t.ok(d.logs.some((l) => /stop sent again/.test(l)), 'the stop sent again is logged');
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
