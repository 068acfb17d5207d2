/**
 * GPU rediscovery (`--gpu-rediscover-ms`): flashd started before the NVIDIA driver loaded picks
 * the GPU up once nvidia-smi answers, and the job that waited for it runs; a later failed run of
 * nvidia-smi keeps the GPU; a different card replaces it. The fake nvidia-smi reads its scenario
 * from the environment at each call, so the test changes the host by changing the scenario.
 */
import t from 'tap';
import { join } from 'node:path';
import { queueBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';

process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`;
const scenario = (name: string) => void (process.env['FAKE_NVIDIA_SMI_SCENARIO'] = name);

const total = async (a: TestAgent, id: string) =>
  ((await a.req('GET', '/v2/catalog/gpus?include=AVAILABILITY')).json as { id: string; availability: { total: number } }[]).find((g) => g.id === id)?.availability.total;

t.test('a driver loaded after start, a failed run, a new card', async (t) => {
  scenario('no-driver');
  const a = await startAgent(t, { runtime: 'process', processWorkdir: REPO_ROOT, gpuRediscoverMs: 1000, takeHoldMs: 1000, leaseMs: 3000 });
  t.equal(await total(a, 'NVIDIA GeForce RTX 4090'), 0, 'no GPU at start: the driver is not loaded');
  const ep = (await a.req('POST', '/v2/serverless', {
    body: queueBody({ gpu: { pools: ['ADA_24'] }, args: 'python3 -u test/fixtures/workers/env.py', workers: { min: 0, max: 1, idleTimeout: 60 } }),
  })).json.id as string;
  const job = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { vars: ['CUDA_VISIBLE_DEVICES'] } } })).json.id as string;
  const said = await until('the held-back line', async () => {
    const lines = ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string }[]).map((l) => l.line);
    return lines.find((l) => l.startsWith('no worker can start'));
  });
  t.match(said, /this installation has no GPUs \(GPU discovery: driver-not-loaded, NVIDIA-SMI has failed/, 'the log says why, from discovery');

  scenario('rtx4090-single');
  const done = await until('the job, once the driver answers', async () => {
    const s = (await a.req('GET', `/v2/${ep}/status/${job}`)).json;
    return s.status === 'COMPLETED' && s;
  }, 30_000);
  t.equal(done.output.CUDA_VISIBLE_DEVICES, 'GPU-8ee5f1e0-e705-aac5-6d6e-b97ad59601ef', 'the worker got the GPU found later');
  t.ok(a.logs.some((l) => /gpus changed .*count=1.*added="?NVIDIA GeForce RTX 4090 GPU-8ee5f1e0/.test(l)), 'flashd logs the change');

  scenario('no-driver');
  await until('the failed run noticed', async () => a.logs.some((l) => l.includes('gpu rediscovery failed; keeping the GPUs found before')));
  t.equal(await total(a, 'NVIDIA GeForce RTX 4090'), 1, 'a failed run keeps the GPU');
  await new Promise((r) => setTimeout(r, 2500)); // two more runs at the 1000 ms floor
  t.equal(a.logs.filter((l) => l.includes('gpu rediscovery failed')).length, 1, 'warned once, not at every run');

  scenario('h100-x1');
  await until('the new card', async () => (await total(a, 'NVIDIA H100 80GB HBM3')) === 1);
  t.equal(await total(a, 'NVIDIA GeForce RTX 4090'), 0, 'the old card is gone from the catalog');
  t.ok(a.logs.some((l) => /gpus changed .*removed="?NVIDIA GeForce RTX 4090/.test(l)));
});

t.test('0 turns rediscovery off', async (t) => {
  scenario('no-driver');
  const a = await startAgent(t, { gpuRediscoverMs: 0 });
  scenario('rtx4090-single');
  await new Promise((r) => setTimeout(r, 1500));
  t.equal(await total(a, 'NVIDIA GeForce RTX 4090'), 0, 'only the discovery at start counts');
});

t.test('the first rediscovery does not repeat what the start said about a model only pool OTHER reaches', async (t) => {
  scenario('old-driver-cuda11');
  const a = await startAgent(t, { gpuRediscoverMs: 1000 });
  const said = () => a.logs.filter((l) => l.includes('gpu model not in the catalog') && l.includes('GeForce RTX 2070'));
  t.equal(said().length, 1, 'the start says it');
  await new Promise((r) => setTimeout(r, 3500)); // three runs at the 1000 ms floor
  t.equal(said().length, 1, 'once, not again at the first rediscovery');
});
