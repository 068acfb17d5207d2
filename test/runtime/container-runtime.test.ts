/**
 * The container runtime end to end (issue 4 §1, §2, §5): a real flashd with `runtime: docker`
 * on the Docker Engine API served by podman (`.ci/run` starts it and builds the worker image
 * with build/worker-image.sh), QUEUE endpoints on CPU hardware, jobs through the public API.
 */
import t, { type Test } from 'tap';
import { cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { DockerClient, LABELS } from '../../src/runtime/index.js';

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'];
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'];
if (!SOCKET || !IMAGE) {
  t.plan(0, 'needs a container engine: FLASHD_TEST_CONTAINER_SOCKET and FLASHD_TEST_WORKER_IMAGE (set by .ci/run)');
  process.exit(0);
}

async function until<T>(what: string, fn: () => Promise<T | undefined | false | null>, ms = 90_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const docker = new DockerClient({ socketPath: SOCKET as string });
t.teardown(() => docker.close());

async function start(t: Test, extra: Record<string, unknown> = {}): Promise<TestAgent> {
  return startAgent(t, { runtime: 'docker', containerSocket: SOCKET as string, takeHoldMs: 1000, leaseMs: 6000, ...extra });
}

async function endpoint(a: TestAgent, extra: Record<string, unknown>): Promise<string> {
  const r = await a.req('POST', '/v2/serverless', { body: cpuBody({ image: IMAGE, ...extra }) });
  if (r.status !== 201) throw new Error(`create: ${r.status} ${r.text}`);
  return r.json.id as string;
}

const containersOf = async (endpointId: string) =>
  docker.listContainers({ all: true, labels: [`${LABELS.endpoint}=${endpointId}`] });

t.test('smoke', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { env: { GREETING: 'hi' }, workers: { min: 0, max: 1, idleTimeout: 2 } });
  const r = await a.req('POST', `/v2/${ep}/runsync?wait=90000`, { body: { input: { n: 1 } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  console.log(r.text, (await containersOf(ep)).length);
  console.log(a.logs.join(''));
});
