/**
 * A CPU worker's container limits come from the `cpu` entry placement gave it: entries are
 * tried in order and the first that fits on this host wins, so a worker placed on a later
 * entry runs with that entry's vCPUs and memory, not the first entry's.
 * A real flashd with `runtime: docker` on the Docker Engine API served by podman (see
 * test/helpers/containers.ts); the limits are read back through `GET /containers/{id}/json`.
 */
import { containersOf, docker, endpoint, runsync, start } from '../helpers/containers.js';
import t from 'tap';
import { cpuFlavor } from '../../src/catalog/index.js';
import { probeCpu } from '../../src/gpu/index.js';
import { LABELS } from '../../src/runtime/index.js';

const GIB = 1024 ** 3;

// A first entry this host cannot hold even empty (too many vCPUs or too much memory for it),
// then one it can.
const host = await probeCpu();
const general = cpuFlavor('cpu3g');
const tooLarge = general?.vcpuCounts.find((n) => n >= 8 && (n > host.vcpus || n * general.ramMultiplier > host.memoryGb));
const hostSays = `${host.vcpus} vCPU / ${host.memoryGb.toFixed(1)} GiB`;
const skip = tooLarge === undefined ? `no cpu3g entry is too large for this host (${hostSays})`
  : host.vcpus < 2 || host.memoryGb < 4 ? `this host cannot hold cpu3c x2 (${hostSays})` : false;

t.test('a worker placed on the second cpu entry gets that entry\'s NanoCpus and memory', { skip }, async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, {
    cpu: [{ id: 'cpu3g', vcpuCount: tooLarge }, { id: 'cpu3c', vcpuCount: 2 }],
    workers: { min: 0, max: 1, idleTimeout: 30 },
  });
  const done = await runsync(a, ep, { n: 1 });
  t.equal(done.status, 'COMPLETED', `a worker starts on the entry that fits: ${JSON.stringify(done)}`);

  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  t.ok(c, 'its container');
  const hc = (await docker.inspectContainer(c?.Id as string)).HostConfig;
  t.equal(hc.NanoCpus, 2e9, `NanoCpus of cpu3c x2 (2 vCPUs), not of cpu3g x${tooLarge}`);
  t.equal(hc.Memory, 4 * GIB, `memory of cpu3c x2 (4 GiB), not of cpu3g x${tooLarge} (${(tooLarge ?? 0) * 4} GiB)`);
});
