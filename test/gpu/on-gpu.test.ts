/**
 * test/gpu/on-gpu.py, the end-to-end check for GPU hosts, run here against the fake nvidia-smi
 * (the RTX 4090 recording) so that it cannot rot between runs on real GPUs: every check it
 * makes must pass on flashd as built, PyTorch's checks skipped where it is not installed.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cleanEnv, freePort, REPO_ROOT } from '../helpers/spawn-flashd.js';

t.test('on-gpu.py passes every check against a recorded RTX 4090 host', async (t) => {
  const out = mkdtempSync(join(tmpdir(), 'flashd-on-gpu-'));
  t.teardown(() => rmSync(out, { recursive: true, force: true }));
  const env = cleanEnv({
    PATH: `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`,
    FAKE_NVIDIA_SMI_SCENARIO: 'rtx4090-single',
  });
  const child = spawn('python3', ['test/gpu/on-gpu.py', '--out', out, '--port', String(await freePort())], { cwd: REPO_ROOT, env });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c));
  child.stderr.on('data', (c: Buffer) => (output += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  clearTimeout(timer);
  t.equal(code, 0, 'exit 0');
  if (code !== 0) t.comment(output);
  const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8')) as { passed: boolean; checks: { name: string; ok: boolean; detail: unknown }[] };
  t.equal(report.passed, true);
  const names = report.checks.map((c) => c.name);
  for (const must of [
    'the worker gets one GPU, by UUID, in CUDA_VISIBLE_DEVICES',
    'once the first worker idles out, the waiting endpoint gets the GPU',
    'SIGTERM stops flashd with exit 0',
    'a driver that answers only after start is picked up by rediscovery',
  ]) t.ok(names.includes(must), `checked: ${must}`);
  t.equal(report.checks.filter((c) => c.name.startsWith('an endpoint that cannot get its GPU waits')).length, 2, 'both held-back endpoints checked');
  t.equal(readFileSync(join(out, 'recording/query-gpu.csv'), 'utf8'), readFileSync(join(REPO_ROOT, 'test/fixtures/nvidia-smi/rtx4090-single/query-gpu.csv'), 'utf8'), 'it records what nvidia-smi printed');
});
