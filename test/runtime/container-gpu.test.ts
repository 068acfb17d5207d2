/**
 * GPU workers on a real container engine that cannot attach GPUs. Podman before 5.4 accepts a
 * container create with `HostConfig.DeviceRequests` and drops them (checked on podman 4.3.1:
 * the inspect shows no device and no request, for the `nvidia` and the `cdi` driver alike), so
 * the worker would run without the GPU flashd counted as its own. flashd must not start it: the
 * endpoint's jobs wait, and its log says why. The host's GPU comes from the fake nvidia-smi
 * (the RTX 4090 recording). On an engine that can attach GPUs this file has nothing to check
 * without a real GPU and the NVIDIA toolkit, and says so. On a host with no GPU (the no-driver
 * recording) the engine's lack is an info line at start, not the warning a GPU host gets.
 */
import t, { type Test } from 'tap';
import { join } from 'node:path';
import { queueBody, startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { DockerClient, gpuAttachFor } from '../../src/runtime/index.js';

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'] as string;
if (!SOCKET) {
  t.plan(0, 'needs a container engine: FLASHD_TEST_CONTAINER_SOCKET (set by .ci/run)');
  process.exit(0);
}
process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`;

/** How the engine under test attaches GPUs, and its name for a comment. */
async function engineGpuAttach(t: Test): Promise<{ attach: ReturnType<typeof gpuAttachFor>; engine: string }> {
  const docker = new DockerClient({ socketPath: SOCKET });
  t.teardown(() => docker.close());
  const v = await docker.version();
  const engine = v.Components?.find((c) => /engine/i.test(c.Name));
  const attach = gpuAttachFor({ name: engine?.Name ?? 'Docker Engine', version: engine?.Version ?? v.Version ?? '' }, 'auto');
  return { attach, engine: `${engine?.Name} ${engine?.Version}` };
}

t.test('an engine that would drop the GPU request starts no GPU worker, and says why', async (t) => {
  process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'rtx4090-single';
  const { attach, engine } = await engineGpuAttach(t);
  if (attach.driver !== null) {
    t.comment(`${engine} attaches GPUs (${attach.driver}); checking that needs a real GPU`);
    return;
  }
  const a = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET, takeHoldMs: 1000, leaseMs: 6000 });
  const ep = (await a.req('POST', '/v2/serverless', {
    body: queueBody({ image: 'localhost/never-pulled:1', gpu: { pools: ['ADA_24'] }, workers: { min: 0, max: 1, idleTimeout: 5 } }),
  })).json.id as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  const said = await until('the held-back line', async () => {
    const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string }[]).map((l) => l.line);
    return lines.find((l) => l.startsWith('no worker can start'));
  }, 60_000);
  t.equal(said, `no worker can start: ${attach.reason}; jobs wait in the queue (throttled)`);
  const h = (await a.req('GET', `/v2/${ep}/health`)).json;
  t.equal(h.workers.throttled, 1, 'counted throttled');
  t.equal(h.workers.initializing + h.workers.idle + h.workers.running + h.workers.unhealthy, 0, 'no worker was started');
  t.equal((await a.req('GET', `/v2/${ep}/status/${job}`)).json.status, 'IN_QUEUE', 'the job waits, not failed');
  const gpus = (await a.req('GET', '/v2/catalog/gpus?include=AVAILABILITY')).json as { id: string; availability: { available: number } }[];
  t.equal(gpus.find((g) => g.id === 'NVIDIA GeForce RTX 4090')?.availability.available, 1, 'the GPU stays free');
  t.ok(a.logs.some((l) => l.includes('GPU workers cannot start on this engine')), 'flashd says so at start');
});

// A CPU-only box: a warning at every start named a problem its user has no GPU to meet. The
// host's "no GPU" is the fake nvidia-smi's no-driver recording (NVIDIA-SMI has failed …).
t.test('no GPU on the host: the engine that cannot attach GPUs is an info line, not a warning', async (t) => {
  process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'no-driver';
  const { attach, engine } = await engineGpuAttach(t);
  if (attach.driver !== null) {
    t.comment(`${engine} attaches GPUs (${attach.driver}): nothing to say either way`);
    return;
  }
  const a = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET });
  t.ok(a.logs.some((l) => /\bhardware\b.*\bgpus=0\b/.test(l)), 'the host has no GPU');
  const lines = a.logs.filter((l) => l.includes('GPU workers cannot start on this engine'));
  t.equal(lines.length, 1, 'said once');
  t.match(lines[0], /\binfo\b/, 'at info level');
  t.notMatch(lines[0], /\bwarn\b/, 'not as a warning');
  t.match(lines[0], /hostGpus=0/, 'saying the host has none');
});
