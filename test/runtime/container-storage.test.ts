/**
 * The container runtime's disks and volumes, and registry credentials (issue 4 §1, §5).
 * A real flashd with `runtime: docker` on the Docker Engine API served by podman (see
 * test/helpers/containers.ts), QUEUE endpoints on CPU hardware, jobs through the public API.
 * Deadlines are generous and every wait polls: CI has 2 loaded cores.
 */
import { SOCKET, IMAGE, until, docker, instanceOf, containersOf, start, endpoint, runsync, logLines } from '../helpers/containers.js';
import { testDataDir } from '../helpers/data-dir.js';
import t from 'tap';
import { startAgent } from '../helpers/agent.js';
import { makeNetworkVolume, makeRegistry } from '../helpers/expect.js';
import { LABELS, createBody, volumeName } from '../../src/runtime/index.js';

t.test('disk: a container disk limit where the engine has one, else a launch without it', async (t) => {
  const a = await start(t);
  const ep = await endpoint(a, { disk: 7, workers: { min: 0, max: 1, idleTimeout: 30 } });
  const r = await runsync(a, ep, {});
  t.equal(r.status, 'COMPLETED', JSON.stringify(r));
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  const size = (await docker.inspectContainer(c?.Id as string)).HostConfig.StorageOpt?.['size'];
  const refused = a.logs.some((l) => /cannot limit container disk size/.test(l));
  t.ok(refused !== (size !== undefined), `either StorageOpt.size (${size ?? 'none'}) or the logged refusal (${refused}), not both`);
  if (size !== undefined) t.match(size, /^7G/, 'the endpoint\'s disk in GB');
});

t.test('a network volume is visible at /vendor-volume and outlives its workers', async (t) => {
  const a = await start(t);
  const nv = await makeNetworkVolume(t, a, { name: 'models' });
  t.teardown(async () => {
    await a.agent.close();
    await docker.removeVolume(volumeName(nv.id), { force: true });
  });
  const body = { mounts: { network: [{ volumeId: nv.id }] }, workers: { min: 0, max: 1, idleTimeout: 1 } };
  const writer = await endpoint(a, body);
  const reader = await endpoint(a, body);
  const w = await runsync(a, writer, { writeVolume: { name: 'weights.txt', content: 'shared bytes' } });
  t.equal(w.status, 'COMPLETED', JSON.stringify(w));
  const r = await runsync(a, reader, { readVolume: 'weights.txt' });
  t.equal(r.output.volume, 'shared bytes', 'another endpoint\'s worker reads what the first wrote');
  t.equal(r.output.volumeIsMount, true, '/vendor-volume is a mount');
  const vol = await docker.inspectVolume(volumeName(nv.id));
  t.equal(vol?.Labels?.[LABELS.volume], nv.id, `a flashd-managed named volume: ${volumeName(nv.id)}`);
  t.equal(vol?.Labels?.[LABELS.instance], instanceOf(a.dir), 'labelled with the flashd that made it');
  const [c] = await containersOf([`${LABELS.endpoint}=${reader}`]);
  const mounts = (await docker.inspectContainer(c?.Id as string)).Mounts ?? [];
  t.same(mounts.map((m) => [m.Type, m.Name, m.Destination]), [['volume', volumeName(nv.id), '/vendor-volume']], 'the only mount');
});

t.test('deleting a network volume removes its engine volume, once no worker mounts it any more', async (t) => {
  const a = await start(t);
  const nv = await makeNetworkVolume(t, a, { name: 'scratch' });
  t.teardown(() => docker.removeVolume(volumeName(nv.id), { force: true }));
  const ep = await endpoint(a, { mounts: { network: [{ volumeId: nv.id }] }, workers: { min: 1, max: 1 } });
  const w = await runsync(a, ep, { writeVolume: { name: 'data.txt', content: 'bytes to delete' } });
  t.equal(w.status, 'COMPLETED', JSON.stringify(w));
  t.ok(await docker.inspectVolume(volumeName(nv.id)), 'the engine volume exists');
  const refused = await a.req('DELETE', `/v2/network-volumes/${nv.id}`);
  t.equal(refused.status, 409, 'refused while an endpoint mounts it');
  t.match(refused.json.detail, ep, 'naming the endpoint');
  t.ok(await docker.inspectVolume(volumeName(nv.id)), 'the engine volume is kept');

  // Detached: the warm worker (workers.min 1) still has it mounted until it is replaced.
  t.equal((await a.req('PATCH', `/v2/serverless/${ep}`, { body: { mounts: { network: [] } } })).status, 200);
  t.equal((await a.req('DELETE', `/v2/network-volumes/${nv.id}`)).status, 204, 'deletable once detached');
  await until('the engine volume removed with its data', async () => (await docker.inspectVolume(volumeName(nv.id))) === null);
  t.pass(`${volumeName(nv.id)} is gone`);
  t.comment(a.logs.some((l) => /still in use/.test(l)) ? 'it was still in use at the DELETE' : 'no worker used it any more at the DELETE');
});

t.test('the engine volume of a volume deleted while a worker still used it goes at the next start, after a crash', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET }, { dir });
  const instance = instanceOf(dir);
  const gone = await makeNetworkVolume(t, first, { name: 'deleted' });
  const kept = await makeNetworkVolume(t, first, { name: 'kept' });
  const labels = (id: string, owner: string) => ({ [LABELS.managed]: 'true', [LABELS.volume]: id, [LABELS.instance]: owner, 'dev.flashd.volume-kind': 'network' });
  // Engine volumes: of a flashd volume deleted below, of one that still exists, of one this
  // database never knew (made after the backup it was restored from, or by a copy of this data
  // directory), and a deleted one of another flashd.
  const unknown = `nv_unknown${process.pid}`;
  const other = `nv_other${process.pid}`;
  for (const [id, owner] of [[gone.id, instance], [kept.id, instance], [unknown, instance], [other, 'another-flashd']] as const) {
    await docker.createVolume(volumeName(id), labels(id, owner));
    t.teardown(() => docker.removeVolume(volumeName(id), { force: true }));
  }
  // A container (a worker of an older configuration) still mounts the deleted one: the engine
  // refuses its removal, which is then pending in memory only, when this flashd stops.
  const user = await docker.createContainer(createBody({
    endpointId: 'volumeuser', workerId: `wkr_voluser${process.pid}`, entrypoint: ['true'], cmd: [], image: IMAGE, env: {}, ports: [], diskGb: null,
    volume: { id: gone.id, kind: 'network' }, gpuDeviceIds: [], cpu: null, registryAuth: null, flashboot: 'OFF', configHash: 'x',
  }, { instanceId: 'volume-user', diskLimit: false }), `flashd-wkr_voluser${process.pid}`);
  t.teardown(() => docker.removeContainer(user.Id, { force: true }).catch(() => undefined));
  t.equal((await first.req('DELETE', `/v2/network-volumes/${gone.id}`)).status, 204);
  await until('the removal refused', async () => first.logs.some((l) => /still in use/.test(l)));
  await first.agent.close();
  t.ok(await docker.inspectVolume(volumeName(gone.id)), 'the deleted volume\'s engine volume outlived that run');
  await docker.removeContainer(user.Id, { force: true });

  const a = await start(t, {}, dir);
  await until('the deleted volume\'s engine volume removed', async () => (await docker.inspectVolume(volumeName(gone.id))) === null);
  t.pass(`${volumeName(gone.id)} is gone with its data`);
  // The line follows the engine's answer to the removal, which the inspect above may see first.
  await until('the removal logged', async () => a.logs.some((l) => l.includes(`volume removed volume=${volumeName(gone.id)}`)));
  t.pass('and logged');
  // The other removals of that pass, had there been any, are done by now.
  await new Promise((r) => setTimeout(r, 2000));
  t.ok(await docker.inspectVolume(volumeName(kept.id)), 'the volume of a flashd volume that still exists is kept');
  t.ok(await docker.inspectVolume(volumeName(unknown)), 'a volume of this instance that the database does not know is kept');
  t.ok(await docker.inspectVolume(volumeName(other)), 'another flashd\'s volume is left alone');
  t.ok(a.logs.some((l) => l.includes('warn  [runtime] engine volumes of this instance whose flashd volume this database does not know are left in place')
    && l.includes(`volumes=${volumeName(unknown)} `) && l.includes(`command="docker volume rm ${volumeName(unknown)}"`)), 'said once, with the command that removes it');
  t.equal(a.agent.endpoints.deletedVolumes?.has(gone.id), false, 'the deletion record goes with the engine volume');
});

t.test("a deleted volume's engine volume that another flashd instance made is left, with the way to remove it", async (t) => {
  const a = await start(t);
  const nv = await makeNetworkVolume(t, a, { name: 'shared' });
  // As a copy of a data directory given an id of its own finds it: named as this flashd names
  // it, labelled with the original's instance.
  const name = volumeName(nv.id);
  await docker.createVolume(name, { [LABELS.managed]: 'true', [LABELS.volume]: nv.id, [LABELS.instance]: 'the-original', 'dev.flashd.volume-kind': 'network' });
  t.teardown(() => docker.removeVolume(name, { force: true }));
  t.equal((await a.req('DELETE', `/v2/network-volumes/${nv.id}`)).status, 204);
  await until('the volume left in place', async () => a.logs.some((l) => l.includes('volume of a deleted flashd volume left in place')));
  const line = a.logs.find((l) => l.includes('volume of a deleted flashd volume left in place')) ?? '';
  t.match(line, /^.*warn .*another flashd instance made it .*remove it by hand once no flashd of that instance uses it/, 'says what to do');
  t.match(line, `volume=${name} instance=the-original command="docker volume rm ${name}"`, 'with the command');
  t.ok(await docker.inspectVolume(name), 'and the volume is kept');
});

t.test('registry credentials reach the engine only: not the container, labels, logs or API', async (t) => {
  const a = await start(t);
  const password = `pw-${process.pid}-never-shown`;
  const reg = await makeRegistry(t, a, { username: 'robot', password });
  const ep = await endpoint(a, { registry: reg.id, workers: { min: 0, max: 1, idleTimeout: 5 } });
  const r = await runsync(a, ep, { inspect: true });
  t.equal(r.status, 'COMPLETED', JSON.stringify(r).slice(0, 300));
  const [c] = await containersOf([`${LABELS.endpoint}=${ep}`]);
  const inspect = await docker.inspectContainer(c?.Id as string);
  t.notMatch(JSON.stringify(inspect.Config.Env), password, 'not in Config.Env');
  t.notMatch(JSON.stringify(inspect.Config.Labels), password, 'not in the labels');
  t.notMatch(JSON.stringify(r.output.environ), password, 'not in the environment seen inside');
  t.notMatch(JSON.stringify(await logLines(a, ep)), password, 'not in the endpoint log');
  t.notMatch((await a.req('GET', `/v2/serverless/${ep}`)).text, password, 'not in the endpoint view');
  t.notMatch(a.logs.join(''), password, 'not in flashd\'s log');
});
