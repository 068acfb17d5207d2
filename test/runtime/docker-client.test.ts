/**
 * The Docker Engine API client against a real engine (podman's service in CI): version
 * negotiation, typed errors with their cause, volumes, and a container's whole life (create,
 * attach, start, logs, list by label, stop with the grace period, kill, wait, remove).
 */
import t from 'tap';
import { DockerClient, DockerError, MAX_API_VERSION, compareApiVersions, isDockerError } from '../../src/runtime/index.js';

t.test('an unreachable socket is DOCKER_UNREACHABLE with the socket error as cause', async (t) => {
  const c = new DockerClient({ socketPath: `${t.testdir()}/no.sock` });
  const err = await c.ping().then(() => null, (e: unknown) => e);
  t.ok(err instanceof DockerError, 'a DockerError');
  t.equal((err as DockerError).code, 'DOCKER_UNREACHABLE');
  t.equal(((err as DockerError).cause as NodeJS.ErrnoException).code, 'ENOENT', 'cause: the socket error');
  t.equal((err as DockerError).request, 'GET /_ping');
  c.close();
});

t.test('compareApiVersions', async (t) => {
  t.ok(compareApiVersions('1.9', '1.41') < 0);
  t.ok(compareApiVersions('1.47', '1.41') > 0);
  t.equal(compareApiVersions('1.41', '1.41.0'), 0);
});

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'];
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'];
const skip = SOCKET && IMAGE ? false : 'needs FLASHD_TEST_CONTAINER_SOCKET and FLASHD_TEST_WORKER_IMAGE (set by .ci/run)';

const label = `dev.flashd.test-client=${process.pid}`;

t.test('against the engine', { skip }, async (t) => {
  const c = new DockerClient({ socketPath: SOCKET as string });
  t.teardown(async () => {
    for (const x of await c.listContainers({ all: true, labels: [label] })) await c.removeContainer(x.Id, { force: true });
    c.close();
  });
  await c.ping();
  const v = await c.negotiate();
  t.ok(v.Version, `engine ${v.Version}, API ${v.ApiVersion}`);
  t.ok(c.apiVersion !== null && compareApiVersions(c.apiVersion, MAX_API_VERSION) <= 0, `speaks ${c.apiVersion}`);

  t.test('images and typed errors', async (t) => {
    t.ok((await c.inspectImage(IMAGE as string))?.Id, 'the test image is there');
    t.equal(await c.inspectImage('localhost/flashd-no-such-image:0'), null, 'a missing image is null');
    const nf = await c.inspectContainer('flashd-no-such-container').then(() => null, (e: unknown) => e);
    t.ok(isDockerError(nf, 'DOCKER_NOT_FOUND'), 'a missing container is DOCKER_NOT_FOUND');
    t.equal((nf as DockerError).status, 404);
    t.ok((nf as DockerError).cause, 'the engine reply is the cause');
    const pull = await c.pullImage('127.0.0.1:1/flashd/none:1').then(() => null, (e: unknown) => e);
    t.ok(isDockerError(pull, 'DOCKER_API'), `a failed pull rejects: ${(pull as Error).message}`);
  });

  t.test('volumes by name', async (t) => {
    const name = `flashd-test-client-${process.pid}`;
    t.equal(await c.inspectVolume(name), null);
    await c.createVolume(name, { 'dev.flashd.managed': 'true' });
    const vol = await c.inspectVolume(name);
    t.equal(vol?.Name, name);
    t.equal(vol?.Labels?.['dev.flashd.managed'], 'true', 'labels kept');
    await c.removeVolume(name);
    t.equal(await c.inspectVolume(name), null, 'removed');
    await c.removeVolume(name);
    t.pass('removing a missing volume is fine');
  });

  t.test('a container from create to remove', async (t) => {
    const script = [
      'import signal,sys,time',
      'signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(7)))',
      'print("to stdout", flush=True)',
      'print("to stderr", file=sys.stderr, flush=True)',
      'time.sleep(300)',
    ].join('\n');
    const body = {
      Image: IMAGE as string, Entrypoint: ['python3', '-c', script], Cmd: [], Env: ['A=1'], Labels: { [label.split('=')[0] as string]: String(process.pid) },
      Tty: false as const, OpenStdin: false as const, AttachStdin: false as const, AttachStdout: true as const, AttachStderr: true as const,
      HostConfig: { RestartPolicy: { Name: 'no' as const }, CapDrop: ['ALL'] },
    };
    const name = `flashd-test-client-${process.pid}`;
    const { Id } = await c.createContainer(body, name);
    const dup = await c.createContainer(body, name).then(() => null, (e: unknown) => e);
    // Docker answers 409 (DOCKER_CONFLICT); Podman 4 answers 500 "that name is already in use".
    t.ok(isDockerError(dup) && (dup.code === 'DOCKER_CONFLICT' || /already in use/.test(dup.message)), `the same name again is refused: ${(dup as Error).message}`);

    const frames: string[] = [];
    const attached = await c.attach(Id, (stream, p) => frames.push(`${stream}:${p.toString()}`));
    await c.startContainer(Id);
    await c.startContainer(Id);
    t.pass('starting a running container is fine (304)');
    const deadline = Date.now() + 60_000;
    while (frames.join('').split('\n').length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    t.ok(frames.some((f) => f.startsWith('stdout:') && f.includes('to stdout')), 'attach: stdout frames');
    t.ok(frames.some((f) => f.startsWith('stderr:') && f.includes('to stderr')), 'attach: stderr frames, told apart');

    const listed = await c.listContainers({ labels: [label] });
    t.same(listed.map((x) => x.Id), [Id], 'listed by label');
    t.equal((await c.inspectContainer(Id)).State.Running, true);

    const logged: string[] = [];
    await c.logs(Id, (stream, p) => logged.push(`${stream}:${p.toString().trim()}`));
    t.ok(logged.includes('stdout:to stdout') && logged.includes('stderr:to stderr'), `logs, demultiplexed: ${JSON.stringify(logged)}`);

    const waited = c.wait(Id);
    await c.stopContainer(Id, 20);
    t.equal((await waited).StatusCode, 7, 'stop sends SIGTERM first: the handler exited 7');
    await attached.ended;
    t.ok(frames.join('').includes('got SIGTERM'), 'attach saw the last line');
    await c.stopContainer(Id, 1);
    t.pass('stopping a stopped container is fine (304)');
    t.equal((await c.wait(Id, 'not-running')).StatusCode, 7, 'not-running answers at once for a stopped container');

    await c.startContainer(Id);
    t.equal((await c.inspectContainer(Id)).State.Running, true, 'a stopped container starts again');
    await c.killContainer(Id);
    t.equal((await c.wait(Id)).StatusCode, 137, 'kill: SIGKILL, 128 + 9');

    await c.removeContainer(Id, { force: true, volumes: true });
    const gone = await c.inspectContainer(Id).then(() => null, (e: unknown) => e);
    t.ok(isDockerError(gone, 'DOCKER_NOT_FOUND'), 'removed');
    t.same(await c.listContainers({ all: true, labels: [label] }), []);
  });
});

t.test('a pull whose progress stream does not end is cut by its abort signal (shutdown during a long pull)', async (t) => {
  const { createServer } = await import('node:http');
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  // A short path: a unix socket's is limited to about 100 bytes.
  const dir = mkdtempSync(`${tmpdir()}/flashd-engine-`);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const socketPath = `${dir}/engine.sock`;
  // An engine answering the pull at once and then streaming progress for as long as the registry takes.
  const server = createServer((req, res) => {
    if (req.url?.includes('/images/create')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"status":"Pulling from example/big"}\n');
      return;
    }
    res.writeHead(404).end('{"message":"no"}');
  });
  await new Promise<void>((r) => server.listen(socketPath, r));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const c = new DockerClient({ socketPath });
  t.teardown(() => c.close());
  const ac = new AbortController();
  const progress: string[] = [];
  const pull = c.pullImage('example/big:1', { signal: ac.signal, onProgress: (p) => progress.push(p.status ?? '') }).then(() => null, (e: unknown) => e);
  while (progress.length === 0) await new Promise((r) => setTimeout(r, 10));
  const started = Date.now();
  ac.abort();
  const err = await pull;
  t.ok(err instanceof DockerError, `the pull fails: ${String(err)}`);
  t.ok(Date.now() - started < 2000, 'at once, not when the stream ends');
});

t.test('an image name that is not an image reference never reaches the engine; a valid one goes in the path as it is', async (t) => {
  const { createServer } = await import('node:http');
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(`${tmpdir()}/flashd-engine-`);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const socketPath = `${dir}/engine.sock`;
  // An engine that records the raw request target and has no image.
  const seen: string[] = [];
  const server = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    res.writeHead(404, { 'content-type': 'application/json' }).end('{"message":"no such image"}');
  });
  await new Promise<void>((r) => server.listen(socketPath, r));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const c = new DockerClient({ socketPath });
  t.teardown(() => c.close());
  // Stored before the schema checked it, or handed in by a caller: refused here all the same.
  for (const name of ['../../containers/json', '--privileged', 'x/../../y', 'busybox?all=1', 'busybox#x', 'a%2F..', 'x/./y', '']) {
    for (const [what, call] of [
      ['inspect', () => c.inspectImage(name)], ['export', () => c.exportImage(name)], ['remove', () => c.removeImage(name)],
    ] as const) {
      const err = await (call as () => Promise<unknown>)().then(() => null, (e: unknown) => e);
      t.ok(isDockerError(err, 'DOCKER_BAD_REQUEST'), `${what} ${JSON.stringify(name)}: refused (${String(err)})`);
      t.match((err as Error).message, /not an image reference/);
    }
  }
  t.same(seen, [], 'no request was sent');
  for (const name of ['python:3.11', 'localhost:5000/a/b:c', `ghcr.io/o/r@sha256:${'a'.repeat(64)}`, 'registry.example.com:443/team/img_x:1.0']) {
    t.equal(await c.inspectImage(name), null, `${name}: asked, not found`);
  }
  t.same(seen, [
    'GET /images/python:3.11/json', 'GET /images/localhost:5000/a/b:c/json',
    `GET /images/ghcr.io/o/r@sha256:${'a'.repeat(64)}/json`, 'GET /images/registry.example.com:443/team/img_x:1.0/json',
  ], 'valid references go in the path as they are');
});
