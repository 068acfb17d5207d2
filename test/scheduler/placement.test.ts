/**
 * Placement through the whole agent on a host that the fake nvidia-smi (output recorded from
 * a real RTX 4090 machine, CUDA 12.4) describes: the catalogs show the GPU, a GPU endpoint
 * whose pools or CUDA constraints this host cannot meet waits throttled, and one that fits
 * gets the GPU, which it holds alone. A held-back endpoint's log says why, once per reason.
 */
import t from 'tap';
import { join } from 'node:path';
import { startAgent, queueBody, cpuBody, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`;
process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'rtx4090-single';
const UUID = 'GPU-8ee5f1e0-e705-aac5-6d6e-b97ad59601ef';

const systemLines = async (a: TestAgent, ep: string) =>
  ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string }[]).filter((l) => l.stream === 'system').map((l) => l.line);

const gpuEndpoint = async (a: TestAgent, gpu: Record<string, unknown>) => {
  const r = await a.req('POST', '/v2/serverless', {
    body: queueBody({ gpu, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 60 } }),
  });
  if (r.status !== 201) throw new Error(r.text);
  return r.json.id as string;
};

t.test('GPU inventory, throttling and exclusive placement', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const gpus = (await a.req('GET', '/v2/catalog/gpus?include=AVAILABILITY')).json as { id: string; cudaVersions: string[]; availability: { available: number; total: number } }[];
  const rtx = gpus.find((g) => g.id === 'NVIDIA GeForce RTX 4090');
  t.match(rtx, { availability: { available: 1, total: 1 }, cudaVersions: ['12.4'] }, 'the discovered GPU, with the host CUDA version');
  t.equal(gpus.find((g) => g.id === 'NVIDIA H100 80GB HBM3')?.availability.total, 0);
  const dcs = (await a.req('GET', '/v2/catalog/data-centers?include=GPU_AVAILABILITY')).json;
  t.match(dcs[0].gpuAvailability, [{ gpuTypeId: 'NVIDIA GeForce RTX 4090', available: 1, total: 1 }]);

  const h100 = await gpuEndpoint(a, { pools: ['ADA_80_PRO'] });
  const wrongCuda = await gpuEndpoint(a, { pools: ['ADA_24'], minCudaVersion: '12.8' });
  const exactCuda = await gpuEndpoint(a, { pools: ['ADA_24'], allowedCudaVersions: ['12.1'] });
  const waiting = [];
  for (const ep of [h100, wrongCuda, exactCuda]) waiting.push({ ep, id: (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id });
  for (const { ep, id } of waiting) {
    const h = await until(`throttled on ${ep}`, async () => {
      const body = (await a.req('GET', `/v2/${ep}/health`)).json;
      return body.workers.throttled >= 1 && body;
    });
    t.equal(h.jobs.inQueue, 1, 'the job waits in the queue');
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_QUEUE', 'never failed');
  }
  // Each says why in its log, once, though the loop decided again every second since.
  const why = {
    [h100]: /^no worker can start: no GPU of an allowed type \(NVIDIA H100 80GB HBM3, .*\); this host has 1× NVIDIA GeForce RTX 4090; jobs wait in the queue \(throttled\)$/,
    [wrongCuda]: /^no worker can start: host CUDA 12\.4, endpoint needs >= 12\.8; jobs wait/,
    [exactCuda]: /^no worker can start: host CUDA 12\.4, endpoint needs one of 12\.1; jobs wait/,
  };
  await new Promise((r) => setTimeout(r, 2100));
  for (const { ep } of waiting) {
    const said = (await systemLines(a, ep)).filter((l) => l.startsWith('no worker can start'));
    t.equal(said.length, 1, `one line for ${ep}: ${JSON.stringify(said)}`);
    t.match(said[0], why[ep]!);
  }

  const fits = await gpuEndpoint(a, { pools: ['ADA_24'], minCudaVersion: '12.2' });
  const r = await a.req('POST', `/v2/${fits}/runsync`, { body: { input: { vars: ['CUDA_VISIBLE_DEVICES', 'RUNPOD_WEBHOOK_GET_JOB'] } } });
  t.equal(r.json.status, 'COMPLETED', r.text);
  t.equal(r.json.output.CUDA_VISIBLE_DEVICES, UUID, 'the worker is given its GPU');
  t.match(r.json.output.RUNPOD_WEBHOOK_GET_JOB, /gpu=NVIDIA\+GeForce\+RTX\+4090/, 'and names it in its job URLs');
  const busy = (await a.req('GET', '/v2/catalog/gpus?include=AVAILABILITY')).json.find((g: { id: string }) => g.id === 'NVIDIA GeForce RTX 4090');
  t.same(busy.availability, { available: 0, total: 1, stockStatus: 'NONE' }, 'held while the worker lives');
  const second = await gpuEndpoint(a, { pools: ['ADA_24'] });
  await a.req('POST', `/v2/${second}/run`, { body: { input: {} } });
  const h = await until('the second endpoint throttled', async () => {
    const body = (await a.req('GET', `/v2/${second}/health`)).json;
    return body.workers.throttled >= 1 && body;
  });
  t.equal(h.workers.running + h.workers.idle, 0, 'a GPU belongs to one worker at a time');
  t.match(await systemLines(a, second), [`no worker can start: every matching GPU is held by another worker: 1 worker of endpoint ${fits} (1 GPU); jobs wait in the queue (throttled)`],
    'the log says the GPU is taken, and by whom');
});

t.test('a CPU process worker sees no GPU, a GPU one only its own, whatever the endpoint env says; RUNPOD_GPU_COUNT counts them', async (t) => {
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, takeHoldMs: 1000, leaseMs: 3000 });
  const vars = ['CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'RUNPOD_GPU_COUNT'];
  const env = { CUDA_VISIBLE_DEVICES: '0', NVIDIA_VISIBLE_DEVICES: 'all', RUNPOD_GPU_COUNT: '8' };
  const gpu = (await a.req('POST', '/v2/serverless', {
    body: queueBody({ gpu: { pools: ['ADA_24'] }, env, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const onGpu = await a.req('POST', `/v2/${gpu}/runsync`, { body: { input: { vars } } });
  t.equal(onGpu.json.status, 'COMPLETED', onGpu.text);
  t.same(onGpu.json.output, { CUDA_VISIBLE_DEVICES: UUID, NVIDIA_VISIBLE_DEVICES: UUID, RUNPOD_GPU_COUNT: '1' }, 'the GPU worker gets its own GPU, not the one its env names');

  // Started while the GPU worker holds the host's only GPU: CUDA must not hand it out twice.
  const cpu = (await a.req('POST', '/v2/serverless', {
    body: cpuBody({ env, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const onCpu = await a.req('POST', `/v2/${cpu}/runsync`, { body: { input: { vars } } });
  t.equal(onCpu.json.status, 'COMPLETED', onCpu.text);
  t.same(onCpu.json.output, { CUDA_VISIBLE_DEVICES: '', NVIDIA_VISIBLE_DEVICES: 'void', RUNPOD_GPU_COUNT: '0' }, 'an empty list: CUDA sees no device');
});
