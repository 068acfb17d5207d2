/**
 * Mounts (spec, "Mounts" and the update semantics): `{volumeId}` only, each network volume once and
 * one per data center, at most one global volume and only on GPU endpoints, never both kinds, the deprecated
 * `networkVolumes` agreeing exactly with `mounts.network` and mirrored in responses.
 */
import t from 'tap';
import { cpuBody, queueBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { assertErrorAt, createEndpoint, makeGlobalVolume, makeNetworkVolume, makeUser, mustCreate } from '../helpers/expect.js';
import { testDataDir } from '../helpers/data-dir.js';

const net = (...ids: string[]) => ids.map((volumeId) => ({ volumeId }));
const patch = (a: TestAgent, id: string, body: unknown) => a.req('PATCH', `/v2/serverless/${id}`, { body });

t.test('network and global mounts on create', async (t) => {
  const a = await startAgent(t);
  const nv = await makeNetworkVolume(t, a, { name: 'models' });
  const nv2 = await makeNetworkVolume(t, a, { name: 'more-models' });
  const gv = await makeGlobalVolume(t, a, { name: 'shared' });
  const gv2 = await makeGlobalVolume(t, a, { name: 'shared-2' });
  t.equal(nv.dataCenterId, 'LOCAL-1', 'a network volume defaults to this installation\'s data center');

  const n = await mustCreate(t, a, queueBody({ mounts: { network: net(nv.id) } }));
  t.same(n.mounts, { network: [{ volumeId: nv.id }], global: [] });
  t.same(n.networkVolumes, [nv.id], 'networkVolumes mirrors mounts.network');

  const legacy = await mustCreate(t, a, queueBody({ networkVolumes: [nv.id] }));
  t.same(legacy.mounts, { network: [{ volumeId: nv.id }], global: [] }, 'the deprecated field alone fills mounts.network');
  t.same(legacy.networkVolumes, [nv.id]);

  const agree = await mustCreate(t, a, queueBody({ networkVolumes: [nv.id], mounts: { network: net(nv.id) } }));
  t.same(agree.networkVolumes, [nv.id], 'both may be sent when they agree exactly');
  t.same((await mustCreate(t, a, queueBody({ networkVolumes: [], mounts: { network: [] } }))).mounts, { network: [], global: [] }, 'two empty lists agree');

  const g = await mustCreate(t, a, queueBody({ mounts: { global: net(gv.id) } }));
  t.same(g.mounts, { network: [], global: [{ volumeId: gv.id }] }, 'one global volume on a GPU endpoint');
  t.same(g.networkVolumes, []);
  t.same((await mustCreate(t, a, queueBody({ mounts: { network: [], global: net(gv.id) } }))).mounts.global, [{ volumeId: gv.id }], 'an empty list of the other kind is not "both"');

  const cases: [string, Record<string, unknown>, number, string][] = [
    ['networkVolumes disagreeing with mounts.network', queueBody({ networkVolumes: [nv2.id], mounts: { network: net(nv.id) } }), 400, '/networkVolumes'],
    ['networkVolumes empty but mounts.network not', queueBody({ networkVolumes: [], mounts: { network: net(nv.id) } }), 400, '/networkVolumes'],
    ['networkVolumes longer than mounts.network', queueBody({ networkVolumes: [nv.id, nv2.id], mounts: { network: net(nv.id) } }), 400, '/networkVolumes'],
    ['two network volumes in one data center', queueBody({ mounts: { network: net(nv.id, nv2.id) } }), 400, '/mounts/network/1'],
    ['two network volumes in one data center, deprecated field', queueBody({ networkVolumes: [nv.id, nv2.id] }), 400, '/networkVolumes/1'],
    ['the same network volume twice', queueBody({ mounts: { network: net(nv.id, nv.id) } }), 400, '/mounts/network/1'],
    ['two global volumes', queueBody({ mounts: { global: net(gv.id, gv2.id) } }), 400, '/mounts/global'],
    ['a global volume on a CPU endpoint', cpuBody({ mounts: { global: net(gv.id) } }), 400, '/mounts/global'],
    ['network and global together', queueBody({ mounts: { network: net(nv.id), global: net(gv.id) } }), 400, '/mounts'],
    ['deprecated network with global', queueBody({ networkVolumes: [nv.id], mounts: { global: net(gv.id) } }), 400, '/mounts'],
    ['empty volumeId', queueBody({ mounts: { network: [{ volumeId: '' }] } }), 400, '/mounts/network/0/volumeId'],
    ['missing volumeId', queueBody({ mounts: { global: [{}] } }), 400, '/mounts/global/0/volumeId'],
    ['a bare id instead of {volumeId}', queueBody({ mounts: { network: [nv.id] } }), 400, '/mounts/network/0'],
    ['network not a list', queueBody({ mounts: { network: { volumeId: nv.id } } }), 400, '/mounts/network'],
    ['networkVolumes duplicate ids', queueBody({ networkVolumes: [nv.id, nv.id] }), 400, '/networkVolumes'],
    ['unknown network volume', queueBody({ mounts: { network: net('nv_unknown00000000000000') } }), 404, '/mounts/network/0'],
    ['unknown network volume, deprecated field', queueBody({ networkVolumes: ['nv_unknown00000000000000'] }), 404, '/networkVolumes/0'],
    ['unknown global volume', queueBody({ mounts: { global: net('gv_unknown00000000000000') } }), 404, '/mounts/global/0'],
    ['a global volume id as network volume', queueBody({ mounts: { network: net(gv.id) } }), 404, '/mounts/network/0'],
  ];
  for (const [label, body, status, pointer] of cases) {
    const r = await createEndpoint(a, body);
    assertErrorAt(t, r, status, pointer, `${label}: ${r.text.slice(0, 200)}`);
  }
  t.equal((await createEndpoint(a, cpuBody({ mounts: { network: net(nv.id) } }))).status, 201, 'network volumes are fine on CPU endpoints');
  t.equal((await createEndpoint(a, queueBody({ mounts: { network: net(nv.id) }, dataCenterIds: ['LOCAL-1'] }))).status, 201, 'a volume in one of dataCenterIds');
});

t.test('a network volume listed twice is a 400 that says so, on create and PATCH', async (t) => {
  const a = await startAgent(t);
  const nv = await makeNetworkVolume(t, a, { name: 'twice' });
  const e = await mustCreate(t, a, queueBody());
  const dup = (r: Awaited<ReturnType<typeof createEndpoint>>, pointer: string, first: string, id: string, label: string) => {
    assertErrorAt(t, r, 400, pointer, `${label}: ${r.text.slice(0, 300)}`);
    const want = `${pointer}: duplicate of ${first} (network volume ${id} is listed more than once)`;
    t.same(r.json.errors, [want], `${label}: the one error names the repeat and the first listing`);
    t.equal(r.json.detail, want, `${label}: the detail says it is a duplicate`);
    t.notMatch(r.text, /data center/, `${label}: nothing about data centers`);
  };
  dup(await createEndpoint(a, queueBody({ mounts: { network: net(nv.id, nv.id) } })), '/mounts/network/1', '/mounts/network/0', nv.id, 'create');
  dup(await patch(a, e.id, { mounts: { network: net(nv.id, nv.id) } }), '/mounts/network/1', '/mounts/network/0', nv.id, 'PATCH');
  // An unknown id listed twice is a duplicate (400), not two missing volumes (404).
  dup(await createEndpoint(a, queueBody({ mounts: { network: net('nv_unknown00000000000000', 'nv_unknown00000000000000') } })), '/mounts/network/1', '/mounts/network/0', 'nv_unknown00000000000000', 'an unknown id twice');
  t.same((await a.req('GET', `/v2/serverless/${e.id}`)).json.mounts, { network: [], global: [] }, 'the refused PATCH changed nothing');
});

t.test('another account\'s volumes are a 404', async (t) => {
  const a = await startAgent(t);
  const nv = await makeNetworkVolume(t, a);
  const gv = await makeGlobalVolume(t, a);
  const other = await makeUser(t, a, 'mount-other');
  assertErrorAt(t, await createEndpoint(a, queueBody({ mounts: { network: net(nv.id) } }), other.key), 404, '/mounts/network/0');
  assertErrorAt(t, await createEndpoint(a, queueBody({ mounts: { global: net(gv.id) } }), other.key), 404, '/mounts/global/0');
});

t.test('data centers: one network volume per data center, and within dataCenterIds', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { dataCenterId: 'DC-A' }, { dir });
  const inA = await makeNetworkVolume(t, first, { name: 'in-a' });
  t.equal(inA.dataCenterId, 'DC-A');
  await first.agent.close();

  // The site is renamed: the old volume stays in DC-A, new ones go to DC-B.
  const a = await startAgent(t, { dataCenterId: 'DC-B' }, { dir });
  const inB = await makeNetworkVolume(t, a, { name: 'in-b' });
  t.equal(inB.dataCenterId, 'DC-B');
  const both = await mustCreate(t, a, queueBody({ mounts: { network: net(inA.id, inB.id) } }));
  t.same(both.networkVolumes, [inA.id, inB.id], 'one volume in each of two data centers is fine, in order');
  assertErrorAt(t, await createEndpoint(a, queueBody({ mounts: { network: net(inA.id) }, dataCenterIds: ['DC-B'] })), 400, '/mounts/network/0', 'a volume outside a non-empty dataCenterIds');
  t.equal((await createEndpoint(a, queueBody({ mounts: { network: net(inB.id) }, dataCenterIds: ['DC-B'] }))).status, 201, 'a volume inside dataCenterIds');
  const e = await mustCreate(t, a, queueBody({ mounts: { network: net(inB.id) } }));
  assertErrorAt(t, await patch(a, e.id, { dataCenterIds: ['DC-B'], mounts: { network: net(inA.id) } }), 400, '/mounts/network/0', 'checked on PATCH too');
});

t.test('mount lists on PATCH: replace, detach with [], unchanged when omitted, switch kinds', async (t) => {
  const a = await startAgent(t);
  const nv = await makeNetworkVolume(t, a, { name: 'one' });
  const nv2 = await makeNetworkVolume(t, a, { name: 'two' });
  const gv = await makeGlobalVolume(t, a);
  const e = await mustCreate(t, a, queueBody({ mounts: { network: net(nv.id) } }));
  const ok = async (body: unknown) => {
    const r = await patch(a, e.id, body);
    t.equal(r.status, 200, `PATCH ${JSON.stringify(body)}: ${r.text.slice(0, 300)}`);
    t.same(r.json.networkVolumes, r.json.mounts.network.map((m: { volumeId: string }) => m.volumeId), 'networkVolumes stays in sync');
    return r.json;
  };

  t.same((await ok({ name: 'no-mount-change' })).mounts, { network: [{ volumeId: nv.id }], global: [] }, 'mounts omitted: unchanged');
  t.same((await ok({ mounts: {} })).mounts, { network: [{ volumeId: nv.id }], global: [] }, 'both lists omitted: unchanged');
  const replaced = await ok({ mounts: { network: net(nv2.id) } });
  t.same(replaced.mounts.network, [{ volumeId: nv2.id }], 'a present list replaces that kind');
  t.same(replaced.restartReasons, ['mounts'], 'a mount change replaces running workers (a container cannot change its mounts)');
  t.same((await ok({ mounts: { network: [] } })).mounts, { network: [], global: [] }, '[] detaches');
  t.same((await ok({ networkVolumes: [nv.id] })).mounts.network, [{ volumeId: nv.id }], 'the deprecated field replaces too');

  const r = await patch(a, e.id, { mounts: { global: net(gv.id) } });
  assertErrorAt(t, r, 400, '/mounts', 'adding global while network stays mounted is "both"');
  const switched = await ok({ mounts: { network: [], global: net(gv.id) } });
  t.same(switched.mounts, { network: [], global: [{ volumeId: gv.id }] }, 'switch kinds in one request: [] for one, the new list for the other');
  t.same(switched.networkVolumes, []);
  assertErrorAt(t, await patch(a, e.id, { networkVolumes: [nv.id] }), 400, '/mounts', 'the deprecated field cannot add network next to global');
  const back = await ok({ mounts: { network: net(nv.id), global: [] } });
  t.same(back.mounts, { network: [{ volumeId: nv.id }], global: [] }, 'and back');

  assertErrorAt(t, await patch(a, e.id, { networkVolumes: [nv2.id], mounts: { network: net(nv.id) } }), 400, '/networkVolumes', 'both fields must agree on PATCH');
  t.equal((await patch(a, e.id, { networkVolumes: [nv2.id], mounts: { network: net(nv2.id) } })).status, 200, 'and may come together when they do');
  assertErrorAt(t, await patch(a, e.id, { mounts: { network: net(nv.id, nv2.id) } }), 400, '/mounts/network/1', 'one per data center on PATCH');
  assertErrorAt(t, await patch(a, e.id, { mounts: { network: net('nv_gone0000000000000000') } }), 404, '/mounts/network/0');
  assertErrorAt(t, await patch(a, e.id, { mounts: { network: [{ volumeId: nv.id, readOnly: true }] } }), 400, '/mounts/network/0/readOnly');
  t.same((await a.req('GET', `/v2/serverless/${e.id}`)).json.mounts, { network: [{ volumeId: nv2.id }], global: [] }, 'refused PATCHes changed nothing');
});

t.test('global volumes follow the hardware on PATCH', async (t) => {
  const a = await startAgent(t);
  const gv = await makeGlobalVolume(t, a);
  const e = await mustCreate(t, a, queueBody({ mounts: { global: net(gv.id) } }));
  assertErrorAt(t, await patch(a, e.id, { cpu: [{ id: 'cpu3c', vcpuCount: 2 }] }), 400, '/mounts/global', 'switching to CPU with a global volume mounted');
  const cpu = await patch(a, e.id, { cpu: [{ id: 'cpu3c', vcpuCount: 2 }], mounts: { global: [] } });
  t.equal(cpu.status, 200, 'switching to CPU while detaching it');
  t.same(cpu.json.mounts, { network: [], global: [] });
  assertErrorAt(t, await patch(a, e.id, { mounts: { global: net(gv.id) } }), 400, '/mounts/global', 'no global volume on a CPU endpoint');
});

t.test('a mounted volume cannot be deleted until detached', async (t) => {
  const a = await startAgent(t);
  const nv = await makeNetworkVolume(t, a);
  const gv = await makeGlobalVolume(t, a);
  const e1 = await mustCreate(t, a, queueBody({ mounts: { network: net(nv.id) } }));
  const e2 = await mustCreate(t, a, queueBody({ mounts: { global: net(gv.id) } }));
  const del = await a.req('DELETE', `/v2/network-volumes/${nv.id}`);
  t.equal(del.status, 409);
  t.match(del.json.detail, e1.id, 'the conflict names the endpoint');
  t.equal((await a.req('DELETE', `/v2/global-volumes/${gv.id}`)).status, 409);
  t.equal((await patch(a, e1.id, { mounts: { network: [] } })).status, 200);
  t.equal((await a.req('DELETE', `/v2/serverless/${e2.id}`)).status, 204);
  t.equal((await a.req('DELETE', `/v2/network-volumes/${nv.id}`)).status, 204, 'deletable once detached');
  t.equal((await a.req('DELETE', `/v2/global-volumes/${gv.id}`)).status, 204, 'deletable once its endpoint is gone');
});
