/**
 * A host with no GPU on an engine that cannot attach GPUs (Podman before 5.4): flashd starts,
 * with a container runtime, saying at info level that GPU workers could not start on this
 * engine, not with a warning. The warning stays for a host that has a GPU
 * (test/runtime/container-gpu.test.ts): there it means GPU endpoints wait. On a CPU-only box
 * a warning at every start named a problem its user has no GPU to meet. The host's "no GPU" is
 * the fake nvidia-smi's no-driver recording (NVIDIA-SMI has failed …).
 */
import t from 'tap';
import { join } from 'node:path';
import { startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { DockerClient, gpuAttachFor } from '../../src/runtime/index.js';

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'] as string;
if (!SOCKET) {
  t.plan(0, 'needs a container engine: FLASHD_TEST_CONTAINER_SOCKET (set by .ci/run)');
  process.exit(0);
}
process.env['PATH'] = `${join(REPO_ROOT, 'test/fixtures/nvidia-smi/bin')}:${process.env['PATH'] ?? ''}`;
process.env['FAKE_NVIDIA_SMI_SCENARIO'] = 'no-driver';

t.test('no GPU on the host: the engine that cannot attach GPUs is an info line, not a warning', async (t) => {
  const docker = new DockerClient({ socketPath: SOCKET });
  t.teardown(() => docker.close());
  const v = await docker.version();
  const engine = v.Components?.find((c) => /engine/i.test(c.Name));
  const attach = gpuAttachFor({ name: engine?.Name ?? 'Docker Engine', version: engine?.Version ?? v.Version ?? '' }, 'auto');
  if (attach.driver !== null) {
    t.comment(`${engine?.Name} ${engine?.Version} attaches GPUs (${attach.driver}): nothing to say either way`);
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
