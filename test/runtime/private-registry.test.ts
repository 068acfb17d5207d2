/**
 * Pull when missing, from a private registry, with the endpoint's registry credential
 * (issue 4 §1): a registry on 127.0.0.1 in this test, which requires HTTP basic auth and
 * serves the test worker image (exported from the engine). The credential must reach the
 * registry (through the engine's X-Registry-Auth) and nothing else: not the container, its
 * labels, flashd's log, the endpoint log or an API response.
 *
 * `.ci/run` lists the registry's address as insecure (plain HTTP) in podman's registries.conf
 * and sets FLASHD_TEST_REGISTRY to it.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import t from 'tap';
import { startAgent } from '../helpers/agent.js';
import { cpuBody } from '../helpers/agent.js';
import { makeRegistry } from '../helpers/expect.js';
import { DockerClient, LABELS } from '../../src/runtime/index.js';

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'] as string;
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'] as string;
const REGISTRY = process.env['FLASHD_TEST_REGISTRY'] as string;
if (!SOCKET || !IMAGE || !REGISTRY) {
  t.plan(0, 'needs FLASHD_TEST_CONTAINER_SOCKET, FLASHD_TEST_WORKER_IMAGE and FLASHD_TEST_REGISTRY (an insecure registry address podman accepts; set by .ci/run)');
  process.exit(0);
}

/** The files of a tarball (ustar: 512-byte headers, sizes in octal). */
function untar(buf: Buffer): Map<string, Buffer> {
  const files = new Map<string, Buffer>();
  for (let off = 0; off + 512 <= buf.length;) {
    const header = buf.subarray(off, off + 512);
    if (header.every((b) => b === 0)) break;
    const name = header.subarray(0, 100).toString('utf8').replace(/\0.*$/s, '');
    const size = parseInt(header.subarray(124, 136).toString('utf8').replace(/\0.*$/s, '').trim() || '0', 8);
    if (String.fromCharCode(header[156] ?? 48) === '0' || header[156] === 0) files.set(name, buf.subarray(off + 512, off + 512 + size));
    off += 512 + Math.ceil(size / 512) * 512;
  }
  return files;
}

async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

const sha = (b: Buffer): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

t.test('an image pulled from a private registry with the endpoint credential', async (t) => {
  const docker = new DockerClient({ socketPath: SOCKET });
  t.teardown(() => docker.close());
  await docker.negotiate();

  // The registry: the test image as one OCI manifest, its config and its one layer.
  const saved = untar(await readAll(await docker.exportImage(IMAGE)));
  const manifest = JSON.parse((saved.get('manifest.json') as Buffer).toString()) as { Config: string; Layers: string[] }[];
  const config = saved.get(manifest[0]?.Config as string) as Buffer;
  const layers = (manifest[0]?.Layers ?? []).map((l) => saved.get(l) as Buffer);
  const blobs = new Map<string, Buffer>([[sha(config), config], ...layers.map((l) => [sha(l), l] as [string, Buffer])]);
  const ociManifest = Buffer.from(JSON.stringify({
    schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha(config), size: config.length },
    layers: layers.map((l) => ({ mediaType: 'application/vnd.oci.image.layer.v1.tar', digest: sha(l), size: l.length })),
  }));
  const username = 'robot';
  const password = `s3cret-${process.pid}-never-shown`;
  const good = `Basic ${Buffer.from(`${username}:${password}`).toString('base64')}`;
  const seen: string[] = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    seen.push(`${req.method} ${req.url} ${req.headers.authorization ?? '-'}`);
    if (req.headers.authorization !== good) {
      res.writeHead(401, { 'www-authenticate': 'Basic realm="flashd-test"', 'content-length': '0' }).end();
      return;
    }
    const url = req.url ?? '';
    let body: Buffer | undefined;
    let type = 'application/octet-stream';
    if (url === '/v2/' || url === '/v2') body = Buffer.from('{}');
    else if (/^\/v2\/flashd\/worker\/manifests\//.test(url)) {
      body = ociManifest;
      type = 'application/vnd.oci.image.manifest.v1+json';
    } else {
      const m = /^\/v2\/flashd\/worker\/blobs\/(sha256:[0-9a-f]{64})$/.exec(url);
      body = m ? blobs.get(m[1] as string) : undefined;
    }
    if (!body) {
      res.writeHead(404, { 'content-length': '0' }).end();
      return;
    }
    res.writeHead(200, { 'content-type': type, 'content-length': String(body.length), 'docker-content-digest': sha(body) });
    res.end(req.method === 'HEAD' ? undefined : body);
  });
  const [host, port] = REGISTRY.split(':') as [string, string];
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(Number(port), host, resolve));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));

  const image = `${REGISTRY}/flashd/worker:t${process.pid}`;
  t.equal(await docker.inspectImage(image), null, 'the image is not on the engine yet');
  t.teardown(() => docker.removeImage(image).catch(() => undefined));

  const a = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET, takeHoldMs: 1000 });
  const reg = await makeRegistry(t, a, { username, password });
  const created = await a.req('POST', '/v2/serverless', { body: cpuBody({ image, registry: reg.id, workers: { min: 0, max: 1, idleTimeout: 30 } }) });
  t.equal(created.status, 201, created.text);
  const ep = created.json.id as string;
  const r = (await a.req('POST', `/v2/${ep}/runsync?wait=180000`, { body: { input: { inspect: true } } })).json;
  t.equal(r.status, 'COMPLETED', `pulled, started, ran: ${JSON.stringify(r).slice(0, 300)}`);

  t.ok(seen.some((s) => / \/v2\/flashd\/worker\/manifests\/.* Basic /.test(s) && s.endsWith(good)), 'the registry got the credential (from the engine)');
  t.ok(await docker.inspectImage(image), 'the image is on the engine now');
  t.ok(a.logs.some((l) => /pulling image .*authenticated=true/.test(l)), 'the pull is logged, credential-free');

  const [c] = await docker.listContainers({ labels: [`${LABELS.endpoint}=${ep}`] });
  const inspect = await docker.inspectContainer(c?.Id as string);
  for (const [what, text] of [
    ['Config.Env', JSON.stringify(inspect.Config.Env)],
    ['labels', JSON.stringify(inspect.Config.Labels)],
    ['the environment inside', JSON.stringify(r.output.environ)],
    ['flashd\'s log', a.logs.join('')],
    ['the endpoint log', (await a.req('GET', `/v2/serverless/${ep}/logs`)).text],
    ['the endpoint view', (await a.req('GET', `/v2/serverless/${ep}`)).text],
    ['the credential view', (await a.req('GET', `/v2/registry-credentials/${reg.id}`)).text],
  ] as const) {
    t.notOk(text.includes(password), `the password is not in ${what}`);
    t.notOk(text.includes(good.slice(6)), `nor its basic-auth form in ${what}`);
  }
  await a.agent.close();
});
