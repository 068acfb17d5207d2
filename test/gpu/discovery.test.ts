/**
 * Discovery through the fake nvidia-smi (test/fixtures/nvidia-smi/bin), which prints recordings of
 * real machines (test/fixtures/nvidia-smi/SOURCE.md). Only the hardware is faked: the real
 * execFile, PATH lookup, exit codes and timeouts are exercised.
 */
import t from 'tap';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLogger } from '../../src/core/logger.js';
import { discoverGpus, parseQueryGpuCsv, parseSmiHeader, probeCpu, probeHost, type GpuDiscovery } from '../../src/gpu/index.js';

const BIN = fileURLToPath(new URL('../fixtures/nvidia-smi/bin', import.meta.url));

function fakeEnv(scenario: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { ...process.env, PATH: `${BIN}${delimiter}${process.env['PATH'] ?? ''}`, FAKE_NVIDIA_SMI_SCENARIO: scenario, ...extra };
}

function capture() {
  const lines: Record<string, unknown>[] = [];
  const log = createLogger({ level: 'debug', format: 'json', sink: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) } });
  return { log, lines };
}

const discover = (scenario: string, extra?: Record<string, string>): Promise<GpuDiscovery> => discoverGpus({ env: fakeEnv(scenario, extra) });

t.test('single RTX 4090', async (t) => {
  const d = await discover('rtx4090-single');
  t.equal(d.noGpuReason, null);
  t.equal(d.gpus.length, 1);
  t.same(d.gpus[0], {
    index: 0,
    uuid: 'GPU-8ee5f1e0-e705-aac5-6d6e-b97ad59601ef',
    name: 'NVIDIA GeForce RTX 4090',
    gpuTypeId: 'NVIDIA GeForce RTX 4090',
    pool: 'ADA_24',
    memoryMiB: 24564,
    driverVersion: '550.127.05',
    cudaVersion: '12.4',
  });
  t.equal(d.driverVersion, '550.127.05');
  t.equal(d.cudaVersion, '12.4');
});

t.test('8x H100 SXM', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: fakeEnv('h100-sxm-x8'), log });
  t.equal(d.gpus.length, 8);
  t.same(d.gpus.map((g) => g.index), [0, 1, 2, 3, 4, 5, 6, 7]);
  t.equal(new Set(d.gpus.map((g) => g.uuid)).size, 8, 'eight distinct UUIDs');
  t.equal(d.gpus[0]?.uuid, 'GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1');
  t.equal(d.gpus[7]?.uuid, 'GPU-33135771-a848-ece1-b61e-489e221d663c');
  for (const g of d.gpus) {
    t.equal(g.name, 'NVIDIA H100 80GB HBM3');
    t.equal(g.gpuTypeId, 'NVIDIA H100 80GB HBM3');
    t.equal(g.pool, 'ADA_80_PRO');
    t.equal(g.memoryMiB, 81559);
    t.equal(g.driverVersion, '565.57.01');
    t.equal(g.cudaVersion, '12.7');
  }
  t.match(lines.find((l) => l['msg'] === 'gpus discovered'), { count: 8, driverVersion: '565.57.01', cudaVersion: '12.7' });
});

t.test('1x H100 SXM, recorded by us (driver 580, CUDA 13.0)', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: fakeEnv('h100-x1'), log });
  t.equal(d.noGpuReason, null);
  t.same(d.gpus.map((g) => [g.index, g.uuid, g.name, g.gpuTypeId, g.pool, g.memoryMiB, g.driverVersion, g.cudaVersion]), [
    [0, 'GPU-0c0897e4-f928-b148-fe48-db553d9a9976', 'NVIDIA H100 80GB HBM3', 'NVIDIA H100 80GB HBM3', 'ADA_80_PRO', 81559, '580.159.04', '13.0'],
  ]);
  t.equal(d.cudaVersion, '13.0', 'the summary table of a 580 driver (CUDA 13) gives the CUDA version too');
  t.match(lines.find((l) => l['msg'] === 'gpus discovered'), { count: 1, driverVersion: '580.159.04', cudaVersion: '13.0' });
});

t.test('1x H200, recorded by us (driver 580, CUDA 13.0): its own type and pool', async (t) => {
  const d = await discover('h200-x1');
  t.equal(d.noGpuReason, null);
  t.same(d.gpus.map((g) => [g.index, g.uuid, g.name, g.gpuTypeId, g.pool, g.memoryMiB, g.driverVersion, g.cudaVersion]), [
    [0, 'GPU-a390aa2c-a2a5-cc48-50f9-f04911405dac', 'NVIDIA H200', 'NVIDIA H200', 'HOPPER_141', 143771, '580.159.04', '13.0'],
  ]);
  t.equal(d.cudaVersion, '13.0');
});

t.test('mixed A100 and L4', async (t) => {
  const d = await discover('a100-l4-mixed');
  t.same(
    d.gpus.map((g) => [g.index, g.name, g.gpuTypeId, g.pool, g.memoryMiB]),
    [
      [0, 'NVIDIA L4', 'NVIDIA L4', 'AMPERE_24', 23034],
      [1, 'NVIDIA A100-SXM4-80GB', 'NVIDIA A100-SXM4-80GB', 'AMPERE_80', 81920],
      [2, 'NVIDIA A100-SXM4-80GB', 'NVIDIA A100-SXM4-80GB', 'AMPERE_80', 81920],
    ],
  );
  t.same(d.gpus.map((g) => g.uuid), [
    'GPU-453f8851-d1a3-e72d-4d85-3ef04418205b',
    'GPU-31515c3d-1414-7c2c-004a-f86a898946ac',
    'GPU-72d87681-01db-370e-567d-41afcf20fad0',
  ]);
  t.equal(d.cudaVersion, '12.5');
  t.ok(d.gpus.every((g) => g.driverVersion === '555.42.02' && g.cudaVersion === '12.5'));
});

t.test('old driver: CUDA 11.2 from the 79-column table, an unknown model keeps its name with no type or pool', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: fakeEnv('old-driver-cuda11'), log });
  t.equal(d.gpus.length, 1);
  t.match(d.gpus[0], { name: 'GeForce RTX 2070', gpuTypeId: null, pool: null, memoryMiB: 7973, driverVersion: '460.39', cudaVersion: '11.2' });
  t.equal(d.cudaVersion, '11.2');
  t.match(lines.find((l) => l['msg'] === 'gpu model not in the catalog'), { name: 'GeForce RTX 2070', pool: 'OTHER' });
});

t.test('no GPU: nvidia-smi missing from PATH', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: { PATH: t.testdir() }, log });
  t.same(d, { gpus: [], driverVersion: null, cudaVersion: null, noGpuReason: 'nvidia-smi-not-found', detail: 'nvidia-smi is not on PATH' });
  t.match(lines.find((l) => l['msg'] === 'no gpus found'), { level: 'info', reason: 'nvidia-smi-not-found' }, 'a host without NVIDIA tools: info');
});

t.test('no GPU: driver not loaded (exit 9 and its message)', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: fakeEnv('no-driver'), log });
  t.equal(d.gpus.length, 0);
  t.equal(d.noGpuReason, 'driver-not-loaded');
  t.match(d.detail, /^NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver/);
  // An 8-GPU box whose driver did not load is not a CPU-only host: with --log-level warn it
  // must still say so at start.
  t.match(lines.find((l) => l['msg'] === 'no gpus found'), { level: 'warn', reason: 'driver-not-loaded' }, 'a driver that did not load: warn');
});

t.test('a hung nvidia-smi is killed at the timeout and reported, not awaited forever', async (t) => {
  const { log, lines } = capture();
  const started = Date.now();
  const d = await discoverGpus({ env: fakeEnv('rtx4090-single', { FAKE_NVIDIA_SMI_SLEEP: '5' }), timeoutMs: 300, log });
  t.equal(d.noGpuReason, 'timeout');
  t.match(lines.find((l) => l['msg'] === 'no gpus found'), { level: 'warn', reason: 'timeout' }, 'a hung nvidia-smi: warn');
  t.ok(Date.now() - started < 4000, 'returned long before the fake would have answered');
});

t.test('an unknown failure keeps its first line as the detail', async (t) => {
  const { log, lines } = capture();
  const d = await discoverGpus({ env: fakeEnv('no-such-scenario'), log });
  t.equal(d.noGpuReason, 'nvidia-smi-failed');
  t.match(d.detail, /unknown scenario/);
  t.match(lines.find((l) => l['msg'] === 'no gpus found'), { level: 'warn', reason: 'nvidia-smi-failed' }, 'an nvidia-smi that fails: warn');
});

t.test('parseQueryGpuCsv', async (t) => {
  t.same(parseQueryGpuCsv(''), []);
  t.same(parseQueryGpuCsv('No devices were found\n'), [], 'the no-device message is not a row');
  t.same(parseQueryGpuCsv('0, GPU-aa, NVIDIA A100-SXM4-80GB, [N/A], 555.42.02\r\n'), [
    { index: 0, uuid: 'GPU-aa', name: 'NVIDIA A100-SXM4-80GB', memoryMiB: null, driverVersion: '555.42.02' },
  ], 'CRLF and [N/A] memory');
  t.same(parseQueryGpuCsv('1, GPU-bb, Some, Odd Name, 1024, 1.2\n')[0]?.name, 'Some, Odd Name', 'a comma inside the name');
  t.same(parseQueryGpuCsv('x, GPU-aa, A, 1, 2\n0, not-a-uuid, A, 1, 2\n0, GPU-aa, , 1, 2\n0, GPU-aa, A, 1\n'), [], 'malformed rows are skipped');
});

t.test('parseSmiHeader', async (t) => {
  t.same(parseSmiHeader('| NVIDIA-SMI 580.126.09             Driver Version: 580.126.09     CUDA Version: 13.0     |'), { driverVersion: '580.126.09', cudaVersion: '13.0' });
  t.same(parseSmiHeader('| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03   CUDA Version: 12.11  |'), { driverVersion: '535.54.03', cudaVersion: '12.11' });
  t.same(parseSmiHeader('Driver Version: 470.42.01 CUDA Version: N/A'), { driverVersion: '470.42.01', cudaVersion: null });
  t.same(parseSmiHeader(''), { driverVersion: null, cudaVersion: null });
});

t.test('the summary table failing leaves the GPUs with an unknown CUDA version (and a warning)', async (t) => {
  // A wrapper that answers the CSV query from a recording and fails the summary call.
  const dir = t.testdir({
    'nvidia-smi': `#!/bin/sh\nif [ "$#" -eq 0 ]; then echo "Unable to determine the device handle" >&2; exit 15; fi\nexec "${join(BIN, 'nvidia-smi')}" "$@"\n`,
  });
  const { chmodSync } = await import('node:fs');
  chmodSync(join(dir, 'nvidia-smi'), 0o755);
  const { log, lines } = capture();
  const d = await discoverGpus({ env: { ...fakeEnv('rtx4090-single'), PATH: `${dir}${delimiter}${process.env['PATH'] ?? ''}` }, log });
  t.equal(d.gpus.length, 1);
  t.equal(d.cudaVersion, null);
  t.equal(d.gpus[0]?.cudaVersion, null);
  t.equal(d.driverVersion, '550.127.05', 'the driver comes from the CSV');
  t.match(lines.find((l) => l['msg'] === 'gpu cuda version unknown'), { detail: 'Unable to determine the device handle' });
});

t.test('probeCpu reads this machine through systeminformation', async (t) => {
  const cpu = await probeCpu();
  t.ok(Number.isInteger(cpu.vcpus) && cpu.vcpus >= 1, `vcpus ${cpu.vcpus}`);
  t.ok(cpu.memoryGb > 0.25, `memoryGb ${cpu.memoryGb}`);
});

t.test('probeHost: GPUs and CPU together, with the data center', async (t) => {
  const host = await probeHost({ env: fakeEnv('a100-l4-mixed'), dataCenterId: 'dc-1' });
  t.equal(host.hostId, 'local');
  t.equal(host.dataCenterId, 'dc-1');
  t.equal(host.gpus.length, 3);
  t.ok(host.cpu.vcpus >= 1);
  t.equal(host.discovery.noGpuReason, null);
});
