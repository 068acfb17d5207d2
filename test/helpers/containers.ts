/**
 * Shared by the container runtime tests (test/runtime/container-*.test.ts): the engine podman
 * serves (`.ci/run` starts it and builds the worker image with build/worker-image.sh), a flashd
 * with the docker runtime that checks on teardown that none of its containers is left, and
 * engine stand-ins (a relay that can be cut, a proxy that can refuse or hold requests).
 */
import { readFileSync, rmSync } from 'node:fs';
import { createServer as createHttpServer, request, type IncomingHttpHeaders } from 'node:http';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { cpuBody, startAgent, type TestAgent } from './agent.js';
import { until as untilWithin } from './wait.js';
import { DockerClient, LABELS } from '../../src/runtime/index.js';

export const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'] as string;
export const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'] as string;
// Imported first by each container test file: without an engine the whole file is skipped.
if (!SOCKET || !IMAGE) {
  t.plan(0, 'needs a container engine: FLASHD_TEST_CONTAINER_SOCKET and FLASHD_TEST_WORKER_IMAGE (set by .ci/run)');
  process.exit(0);
}

/** The shared helper with these files' default: container starts on 2 loaded cores take a while. */
export const until = <T>(what: string, fn: () => Promise<T | undefined | false>, ms = 90_000): Promise<T> => untilWithin(what, fn, ms);

export const docker = new DockerClient({ socketPath: SOCKET });
t.teardown(() => docker.close());

export const instanceOf = (dir: string): string => readFileSync(join(dir, 'container-instance-id'), 'utf8').trim();
export const containersOf = (labels: string[]) => docker.listContainers({ all: true, labels: [`${LABELS.managed}=true`, ...labels] });

/** A flashd with the docker runtime; on teardown, after it closed, no container of it may remain. */
export async function start(t: Test, extra: Record<string, unknown> = {}, dir?: string): Promise<TestAgent> {
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

export async function endpoint(a: TestAgent, extra: Record<string, unknown>): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ image: IMAGE, ...extra }) });
  if (r.status !== 201) throw new Error(`create: ${r.status} ${r.text}`);
  return r.json.id as string;
}

export const runsync = async (a: TestAgent, ep: string, input: unknown) => (await a.req('POST', `/v2/${ep}/runsync?wait=120000`, { body: { input } })).json;
export const health = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/${ep}/health`)).json;
export const logLines = async (a: TestAgent, ep: string) => (await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string; workerId: string }[];
export const noWorkers = (h: any) => h.workers.idle + h.workers.running + h.workers.initializing === 0;

/**
 * A socket relayed to the real engine, which `cut()` takes away (the engine stopped, a daemon
 * restart) and `restore()` brings back on the same path (the engine started again).
 */
export async function engineRelay(relaySocket: string): Promise<{ relaySocket: string; cut(): void; restore(): Promise<void> }> {
  const open = new Set<Socket>();
  const listen = async (): Promise<Server> => {
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
    return relay;
  };
  let relay = await listen();
  return {
    relaySocket,
    cut: () => {
      relay.close();
      for (const c of open) c.destroy();
    },
    restore: async () => {
      rmSync(relaySocket, { force: true });
      relay = await listen();
    },
  };
}

export interface Proxied {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/**
 * The real engine behind an HTTP proxy. `before` sees each request first and may hold it (a
 * slow engine) or refuse it: a string is answered as the engine's 500 with that message.
 * `created` gets the id of each container created. Attach (an upgraded connection) is relayed as is.
 */
export async function engineProxy(path: string, o: {
  before?(r: Proxied): Promise<string | undefined> | string | undefined;
  created?(r: Proxied, id: string): void;
}): Promise<{ close(): Promise<void> }> {
  const server = createHttpServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => void (async () => {
      const r: Proxied = { method: req.method ?? 'GET', url: req.url ?? '/', headers: req.headers, body: Buffer.concat(chunks) };
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
export async function engineWithoutInit(path: string, refuses: 'create' | 'start'): Promise<{ creates: { init: boolean }[]; close(): Promise<void> }> {
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
