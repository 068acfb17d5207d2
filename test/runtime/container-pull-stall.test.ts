/**
 * An image pull that stalls (the registry answers `/v2/` and never the manifest, as a hung or
 * black-holed registry or proxy does) must not hold its worker's place for good: it fails after
 * `--image-pull-idle-timeout-ms` without progress, as a failed start, and stopping the worker
 * (its endpoint deleted, a PATCH of its image) ends its launch and frees the host's vCPUs at once.
 * A real flashd with `runtime: docker` on podman (test/helpers/containers.ts); the registry is a
 * Node HTTP server on an address `.ci/run` lists as insecure (FLASHD_TEST_STALL_REGISTRY).
 */
import { IMAGE, SOCKET, docker, until, start, endpoint, runsync, health, logLines } from '../helpers/containers.js';
import { createHash } from 'node:crypto';
import { createServer, type ServerResponse } from 'node:http';
import t, { type Test } from 'tap';
import type { TestAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { createLogger } from '../../src/core/logger.js';
import { ContainerRuntime, type LaunchSpec } from '../../src/runtime/index.js';

const STALL = process.env['FLASHD_TEST_STALL_REGISTRY'] as string;
if (!STALL) {
  t.plan(0, 'needs FLASHD_TEST_STALL_REGISTRY (an insecure registry address podman accepts; set by .ci/run)');
  process.exit(0);
}

/** A tar of one file (ustar), `size` zero bytes named `name`. */
function tarOfOne(name: string, size: number): Buffer {
  const header = Buffer.alloc(512);
  const field = (off: number, len: number, text: string): void => void header.write(text.padEnd(len, '\0').slice(0, len), off, 'latin1');
  field(0, 100, name);
  field(100, 8, '0000644');
  field(108, 8, '0000000');
  field(116, 8, '0000000');
  field(124, 12, size.toString(8).padStart(11, '0'));
  field(136, 12, '00000000000');
  field(148, 8, '        ');
  field(156, 1, '0');
  field(257, 8, 'ustar\x0000');
  const sum = header.reduce((a, b) => a + b, 0);
  field(148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
  return Buffer.concat([header, Buffer.alloc(Math.ceil(size / 512) * 512), Buffer.alloc(1024)]);
}

/**
 * A slow image, under `flashd/slow`: one layer of about 512 KiB (a file named for this run, so
 * the engine has none of it yet) sent 32 KiB every 200 ms, so its pull takes about 3 s and the
 * engine reports its bytes as they come.
 */
const sha = (b: Buffer): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const slowLayer = tarOfOne(`flashd-pull-${process.pid}-${Date.now()}`, 511 * 1024);
const slowConfig = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [sha(slowLayer)] }, config: {} }));
const slowManifest = Buffer.from(JSON.stringify({
  schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
  config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha(slowConfig), size: slowConfig.length },
  layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', digest: sha(slowLayer), size: slowLayer.length }],
}));
function serveSlow(url: string, head: boolean, res: ServerResponse): void {
  const body = /\/manifests\//.test(url) ? slowManifest : url.endsWith(sha(slowConfig)) ? slowConfig : url.endsWith(sha(slowLayer)) ? slowLayer : null;
  if (!body) {
    res.writeHead(404, { 'content-length': '0' }).end();
    return;
  }
  const type = body === slowManifest ? 'application/vnd.oci.image.manifest.v1+json' : 'application/octet-stream';
  res.writeHead(200, { 'content-type': type, 'content-length': String(body.length), 'docker-content-digest': sha(body) });
  if (head || body !== slowLayer) {
    res.end(head ? undefined : body);
    return;
  }
  let sent = 0;
  const drip = setInterval(() => {
    res.write(body.subarray(sent, (sent += 32 * 1024)));
    if (sent >= body.length) {
      clearInterval(drip);
      res.end();
    }
  }, 200);
  res.on('close', () => clearInterval(drip));
}

/** Requests for a manifest the registry has seen (each a pull that now hangs). */
const manifests: string[] = [];
const server = createServer((req, res) => {
  if (req.url === '/v2/' || req.url === '/v2') {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '2' }).end('{}');
    return;
  }
  if (req.url?.startsWith('/v2/flashd/slow/')) {
    serveSlow(req.url, req.method === 'HEAD', res);
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

/**
 * The container runtime alone, with its internal `pullProgressMs` short (flashd runs it at
 * DEFAULT_PULL_PROGRESS_MS, 15 s) and flashd's log lines collected.
 */
async function pullingRuntime(t: Test, pullIdleTimeoutMs = 60_000): Promise<{ runtime: ContainerRuntime; lines: string[] }> {
  const lines: string[] = [];
  const log = createLogger({ level: 'info', format: 'text', sink: { write: (l: string) => void lines.push(l) } });
  // No worker runs (the images have no command): a worker URL given, so no relay is listened on.
  const runtime = new ContainerRuntime({ socketPath: SOCKET, dataDir: testDataDir(t), log, workerUrl: 'http://127.0.0.1:9', pullIdleTimeoutMs, pullProgressMs: 300 });
  await runtime.start({ host: '127.0.0.1', port: 9 });
  t.teardown(() => runtime.close());
  if (!runtime.ready) throw new Error(`the engine did not answer: ${lines.join('')}`);
  return { runtime, lines };
}

const launchSpec = (image: string): LaunchSpec => ({
  endpointId: 'ep-pull', workerId: `wkr_pull${process.pid}${++n}`, entrypoint: [], cmd: [], image, env: {}, ports: [], diskGb: null, volume: null,
  gpuDeviceIds: [], cpu: { vcpuCount: 1, memoryGb: 1 }, registryAuth: null, flashboot: 'OFF', configHash: `h${n}`,
});
const noEvents = { log: () => undefined, exit: () => undefined };
const progressLines = (lines: string[]): string[] => lines.filter((l) => l.includes('still pulling image'));
const settle = (p: Promise<unknown>): Promise<unknown> => p.then(() => null, (err: unknown) => err);

t.test('a pull in flight is logged every pullProgressMs, and no more once it ended or was given up', async (t) => {
  // Stalled, then given up at the idle timeout: lines with the image and the time so far, nothing more after.
  const stall = await pullingRuntime(t, 2000);
  const image = stalledImage();
  const failed = await settle(stall.runtime.launch(launchSpec(image), noEvents));
  t.match(String(failed), /no progress from the engine for 2 s/);
  const said = progressLines(stall.lines);
  t.ok(said.length >= 2, `a line every 300 ms while it stalled: ${said.length}`);
  t.match(said[0], new RegExp(`info +still pulling image image=${image.replace(/[.:/]/g, '\\$&')} elapsedMs=\\d+`));
  t.notMatch(said.join('\n'), /layersDownloaded/, 'no layer counts before the engine reported a layer');
  await new Promise((r) => setTimeout(r, 1000));
  t.equal(progressLines(stall.lines).length, said.length, 'none after the pull failed');

  // Stopped while it pulls (the worker's endpoint deleted): the pull is given up, and so are its lines.
  const stop = await pullingRuntime(t);
  const spec = launchSpec(stalledImage());
  const launched = settle(stop.runtime.launch(spec, noEvents));
  await until('two progress lines', async () => progressLines(stop.lines).length >= 2, 30_000);
  await stop.runtime.stop(spec.workerId, 0);
  t.match(String(await launched), /was still being pulled/);
  const atStop = progressLines(stop.lines).length;
  await new Promise((r) => setTimeout(r, 1000));
  t.equal(progressLines(stop.lines).length, atStop, 'none after the pull was given up');

  // A slow pull that makes progress: the lines count its layers and bytes.
  const slow = await pullingRuntime(t);
  const slowImage = `${STALL}/flashd/slow:t${process.pid}`;
  t.teardown(() => docker.removeImage(slowImage).catch(() => undefined));
  // An image with no command: the pull succeeds, the create after it fails; only the pull matters here.
  await settle(slow.runtime.launch(launchSpec(slowImage), noEvents));
  t.ok(await docker.inspectImage(slowImage), 'the slow image was pulled');
  const slowSaid = progressLines(slow.lines);
  t.ok(slowSaid.some((l) => /layersDownloaded=\d\/\d downloadedMb=\d+(\.\d)? totalMb=0\.5\b/.test(l)), `bytes so far of the layer's 0.5 MB: ${slowSaid.join('\n')}`);
  const atEnd = slowSaid.length;
  await new Promise((r) => setTimeout(r, 1000));
  t.equal(progressLines(slow.lines).length, atEnd, 'none after the pull completed');
});
