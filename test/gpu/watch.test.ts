/**
 * GpuWatch, one rediscovery run at a time (`check()`), against the real ledger and the fake
 * nvidia-smi (test/fixtures/nvidia-smi/bin) behind a small wrapper that can fail the summary call
 * (`nvidia-smi` without arguments, the one carrying `CUDA Version:`) or change the CUDA version it
 * prints, as a wedged GPU or a driver update would.
 */
import t, { type Test } from 'tap';
import { chmodSync, rmSync, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLogger } from '../../src/core/logger.js';
import { GpuWatch, probeHost, ResourceLedger, type WorkerRequirement } from '../../src/gpu/index.js';

const BIN = fileURLToPath(new URL('../fixtures/nvidia-smi/bin', import.meta.url));
const RTX4090 = 'NVIDIA GeForce RTX 4090';
const UUID = 'GPU-8ee5f1e0-e705-aac5-6d6e-b97ad59601ef';

/** A host whose nvidia-smi the test can break: `summary-fails` and `cuda` files beside the wrapper. */
async function host(t: Test, scenario: string) {
  const dir = t.testdir({
    'nvidia-smi': [
      '#!/bin/sh',
      'here=$(dirname "$0")',
      `fake="${join(BIN, 'nvidia-smi')}"`,
      'if [ "$#" -eq 0 ] && [ -f "$here/summary-fails" ]; then echo "Unable to determine the device handle for GPU0000:01:00.0: Unknown Error"; exit 15; fi',
      'if [ "$#" -eq 0 ] && [ -f "$here/cuda" ]; then "$fake" | sed "s/CUDA Version: [0-9.]*/CUDA Version: $(cat "$here/cuda")/"; exit 0; fi',
      'exec "$fake" "$@"',
      '',
    ].join('\n'),
  });
  chmodSync(join(dir, 'nvidia-smi'), 0o755);
  const env: NodeJS.ProcessEnv = { ...process.env, PATH: `${dir}${delimiter}${BIN}${delimiter}${process.env['PATH'] ?? ''}`, FAKE_NVIDIA_SMI_SCENARIO: scenario };
  const lines: Record<string, unknown>[] = [];
  const log = createLogger({ level: 'debug', format: 'json', sink: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) } });
  const ledger = new ResourceLedger(await probeHost({ env, dataCenterId: 'LOCAL-1' }));
  const watch = new GpuWatch({ ledger, intervalMs: 0, log, env });
  return {
    env, ledger, watch, lines,
    said: (msg: string, level?: string) => lines.filter((l) => l['msg'] === msg && (level === undefined || l['level'] === level)),
    summaryFails: (on: boolean) => (on ? writeFileSync(join(dir, 'summary-fails'), '') : rmSync(join(dir, 'summary-fails'), { force: true })),
    cuda: (version: string) => writeFileSync(join(dir, 'cuda'), version),
  };
}

const needsCuda = (minCudaVersion: string): WorkerRequirement => ({
  kind: 'gpu',
  gpu: { count: 1, allowedTypeIds: [RTX4090], allowedCudaVersions: [], minCudaVersion, dataCenterIds: [] },
});

t.test('a run whose summary call fails keeps the CUDA version found before, and warns once', async (t) => {
  const h = await host(t, 'rtx4090-single');
  t.equal(h.ledger.host.gpus[0]?.cudaVersion, '12.4', 'CUDA 12.4 at start');

  h.summaryFails(true);
  await h.watch.check();
  t.equal(h.ledger.host.gpus[0]?.cudaVersion, '12.4', 'the GPU keeps CUDA 12.4');
  const placed = h.ledger.reserve('w1', needsCuda('12.4'));
  t.equal(placed.ok, true, 'an endpoint that needs CUDA >= 12.4 still gets the GPU, not a throttle');
  h.ledger.release('w1');
  t.same(h.said('gpus changed'), [], 'nothing changed: no GPU listed as removed and added');
  t.match(h.said('gpu cuda version unknown', 'warn'), [{ detail: /Unable to determine the device handle/ }], 'discovery says why, on a rediscovery too');
  t.match(h.said('gpu rediscovery found no cuda version; keeping the one found before', 'warn'), [{ cuda: '12.4', gpus: 1 }]);

  await h.watch.check();
  await h.watch.check();
  t.equal(h.said('gpu cuda version unknown').length, 1, 'the cause once, not at every run');
  t.equal(h.said('gpu rediscovery found no cuda version; keeping the one found before').length, 1, 'the warning once, not at every run');
  t.equal(h.ledger.host.gpus[0]?.cudaVersion, '12.4');

  h.summaryFails(false);
  await h.watch.check();
  t.equal(h.ledger.host.gpus[0]?.cudaVersion, '12.4');
  t.same(h.said('gpus changed'), [], 'the summary back with the same version: nothing changed');
});

t.test('a GPU whose CUDA version changed is reported as changed, not as removed and added', async (t) => {
  const h = await host(t, 'rtx4090-single');
  h.cuda('12.8');
  await h.watch.check();
  t.equal(h.ledger.host.gpus[0]?.cudaVersion, '12.8');
  const [line, ...more] = h.said('gpus changed');
  t.same(more, [], 'one line');
  t.match(line, { level: 'info', count: 1, cuda: '12.8', changed: `${RTX4090} ${UUID} cuda 12.4 -> 12.8` });
  t.notOk(line && ('added' in line || 'removed' in line), `neither added nor removed: ${JSON.stringify(line)}`);
});

t.test('a rediscovery logs what discovery finds once, and not the lines every run would repeat', async (t) => {
  const h = await host(t, 'rtx4090-single');
  h.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'old-driver-cuda11';
  await h.watch.check();
  await h.watch.check();
  t.match(h.said('gpus changed'), [{ count: 1, cuda: '11.2', added: /GeForce RTX 2070/, removed: new RegExp(UUID) }]);
  t.match(h.said('gpu model not in the catalog'), [{ name: 'GeForce RTX 2070' }], 'the unknown model is named, once');
  t.same(h.said('gpus discovered', 'info'), [], 'no "gpus discovered" at info every run');
});

t.test('after a failed run, the first run that answers says so once', async (t) => {
  const h = await host(t, 'rtx4090-single');
  h.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'no-driver';
  await h.watch.check();
  await h.watch.check();
  t.match(h.said('gpu rediscovery failed; keeping the GPUs found before', 'warn'), [{ reason: 'driver-not-loaded', gpus: 1 }]);
  t.same(h.said('gpu rediscovery works again'), [], 'not while it fails');

  h.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'rtx4090-single';
  await h.watch.check();
  await h.watch.check();
  t.match(h.said('gpu rediscovery works again', 'info'), [{ gpus: 1 }], 'once, when nvidia-smi answers again');
  t.same(h.said('gpus changed'), [], 'the same GPU: nothing changed');

  // The summary call alone failing (the CUDA version kept) ends the same way.
  h.summaryFails(true);
  await h.watch.check();
  h.summaryFails(false);
  await h.watch.check();
  await h.watch.check();
  t.match(h.said('gpu rediscovery works again', 'info'), [{ gpus: 1 }, { gpus: 1, cuda: '12.4' }], 'and once after the CUDA version came back');
});
