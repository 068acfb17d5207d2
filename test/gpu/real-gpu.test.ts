/**
 * Discovery against the real nvidia-smi of this machine. Runs only with FLASHD_TEST_GPU=1 on a
 * host with an NVIDIA GPU and driver (beta9's GPU_INTEGRATION pattern); everything else runs
 * against recordings through the fake in test/fixtures/nvidia-smi.
 */
import t from 'tap';
import { discoverGpus } from '../../src/gpu/index.js';

const skip = process.env['FLASHD_TEST_GPU'] === '1' ? false : 'set FLASHD_TEST_GPU=1 on a machine with an NVIDIA GPU and driver to run discovery against the real nvidia-smi';

t.test('real nvidia-smi: at least one GPU with a CUDA version', { skip }, async (t) => {
  const d = await discoverGpus({ timeoutMs: 30_000 });
  t.equal(d.noGpuReason, null, `discovery failed: ${d.noGpuReason ?? ''} ${d.detail ?? ''}`);
  t.ok(d.gpus.length >= 1, `found ${d.gpus.length} GPU(s)`);
  t.match(d.cudaVersion, /^\d+\.\d+$/);
  for (const g of d.gpus) {
    t.match(g.uuid, /^GPU-[0-9a-f-]+$/i);
    t.ok(g.name.length > 0);
    t.ok(g.memoryMiB === null || g.memoryMiB > 0);
    t.equal(g.cudaVersion, d.cudaVersion);
  }
  t.comment(JSON.stringify(d, null, 2));
});
