/**
 * An image pull that stalls (the registry answers `/v2/` and never the manifest, as a hung or
 * black-holed registry or proxy does) must not hold its worker's place for good: it fails after
 * `--image-pull-idle-timeout-ms` without progress, as a failed start, and stopping the worker
 * (its endpoint deleted, a PATCH of its image) ends its launch and frees the host's vCPUs at once.
 * A real flashd with `runtime: docker` on podman (test/helpers/containers.ts); the registry is a
 * Node HTTP server on an address `.ci/run` lists as insecure (FLASHD_TEST_STALL_REGISTRY).
 */
import { IMAGE, until, start, endpoint, runsync, health, logLines } from '../helpers/containers.js';
import { createServer } from 'node:http';
import t, { type Test } from 'tap';
import type { TestAgent } from '../helpers/agent.js';

const STALL = process.env['FLASHD_TEST_STALL_REGISTRY'] as string;
if (!STALL) {
  t.plan(0, 'needs FLASHD_TEST_STALL_REGISTRY (an insecure registry address podman accepts; set by .ci/run)');
  process.exit(0);
}

/** Requests for a manifest the registry has seen (each a pull that now hangs). */
const manifests: string[] = [];
const server = createServer((req, res) => {
  if (req.url === '/v2/' || req.url === '/v2') {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '2' }).end('{}');
    return;
  }
  // Anything else (the manifest): never answered.
  if (/\/manifests\//.test(req.url ?? '')) manifests.push(req.url ?? '');
});
const [host, port] = STALL.split(':') as [string, string];
await new Promise<void>((resolve, reject) => server.once('error', reject).listen(Number(port), host, resolve));
t.teardown(() => new Promise<void>((r) => {
  server.closeAllConnections();
  server.close(() => r());
}));

let n = 0;
const stalledImage = (): string => `${STALL}/flashd/stalled:t${process.pid}-${++n}`;

/** The host's vCPUs as flashd found them: an endpoint asking for the largest cpu3c size that fits leaves no room for a second worker. */
function wholeHost(a: TestAgent): { id: string; vcpuCount: number }[] {
  const vcpus = Number(/hardware .*vcpus=(\d+)/.exec(a.logs.join('\n'))?.[1]);
  const vcpuCount = [32, 16, 8, 4, 2].find((c) => c <= vcpus) ?? 2;
  return [{ id: 'cpu3c', vcpuCount }];
}

/** Submits a job to `ep` and waits until its worker's pull is stuck at the registry. */
async function stuckPull(t: Test, a: TestAgent, ep: string, image: string): Promise<string> {
  const before = manifests.length;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 1 } } })).json.id as string;
  const path = `/v2/${image.slice(STALL.length + 1).replace(/:[^:]*$/, '')}/manifests/`;
  await until('the pull to reach the registry', async () => manifests.slice(before).some((u) => u.startsWith(path)));
  t.equal((await health(a, ep)).workers.initializing, 1, 'its worker is initializing, pulling');
  return job;
}

t.test('a pull with no progress fails after --image-pull-idle-timeout-ms, as a failed start', async (t) => {
  const a = await start(t, { imagePullIdleTimeoutMs: 2000 });
  const image = stalledImage();
  const ep = await endpoint(a, { image, workers: { min: 0, max: 1, idleTimeout: 5 } });
  const job = await stuckPull(t, a, ep, image);
  const failed = await until('the start to fail', async () => (await logLines(a, ep)).find((l) => /failed to start: .*no progress/.test(l.line)));
  t.match(failed.line, new RegExp(`worker wkr_\\w+ failed to start: pull of ${image.replace(/[.:/]/g, '\\$&')}: no progress from the engine for 2 s`), 'the endpoint log says why');
  t.equal(failed.stream, 'system');
  await until('a crash backoff after three such starts', async () => (await logLines(a, ep)).some((l) => /3 workers crashed in a row: no new worker for \d+ s \(crash backoff\)/.test(l.line)), 120_000);
  t.pass('each timed-out pull counts as a crash');
  t.equal((await a.req('GET', `/v2/${ep}/status/${job}`)).json.status, 'IN_QUEUE', 'the job waits for a worker that can start');
});

t.test('deleting an endpoint whose worker pulls frees its vCPUs for another endpoint at once', async (t) => {
  const a = await start(t);
  const cpu = wholeHost(a);
  const image = stalledImage();
  const stalled = await endpoint(a, { name: 'stalled', image, cpu, workers: { min: 0, max: 1, idleTimeout: 5 } });
  await stuckPull(t, a, stalled, image);
  const other = await endpoint(a, { name: 'other', cpu, workers: { min: 0, max: 1, idleTimeout: 5 } });
  t.equal((await a.req('DELETE', `/v2/serverless/${stalled}`)).status, 204);
  const r = (await a.req('POST', `/v2/${other}/runsync?wait=60000`, { body: { input: { n: 2 } } })).json;
  t.equal(r.status, 'COMPLETED', `the other endpoint's worker gets the host's vCPUs: ${JSON.stringify(r).slice(0, 300)}`);
  t.ok(a.logs.some((l) => /worker stopping .*reason="?endpoint deleted/.test(l)), 'the pulling worker was stopped');
});

t.test('a PATCH of the image ends the stalled launch; the new image runs under workers.max 1', async (t) => {
  const a = await start(t);
  const image = stalledImage();
  const ep = await endpoint(a, { image, cpu: wholeHost(a), workers: { min: 0, max: 1, idleTimeout: 5 } });
  const job = await stuckPull(t, a, ep, image);
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { image: IMAGE } })).status, 200);
  const done = await until('the job to complete on the new image', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${job}`)).json;
    return s.status === 'COMPLETED' && s;
  }, 120_000);
  t.same(done.output.echo, { n: 1 });
  const lines = (await logLines(a, ep)).map((l) => l.line);
  t.ok(lines.some((l) => /worker wkr_\w+ stopped before it started: .*pull/.test(l)), "the old worker's end is said, as a stop");
  t.notOk(lines.some((l) => /crashed in a row|exited unexpectedly/.test(l)), 'and is no crash');
  t.equal((await runsync(a, ep, { n: 3 })).status, 'COMPLETED');
});
