/**
 * Templates, network volumes, global volumes and registry credentials: the same five operations
 * for each (POST 201 with id, GET list, GET/PATCH/DELETE one), their rules, and the write-only
 * registry password (never returned by any route, never logged, not in clear in the data dir).
 */
import t from 'tap';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { assertProblem, queueBody, startAgent } from '../helpers/agent.js';
import { assertErrorAt, makeRegistry, mustCreate, mustPost } from '../helpers/expect.js';

const KINDS = [
  { base: '/v2/templates', create: { name: 'tpl', image: 'registry.local/x:1' }, patch: { name: 'tpl-2' } },
  { base: '/v2/network-volumes', create: { name: 'nv', size: 5 }, patch: { name: 'nv-2' } },
  { base: '/v2/global-volumes', create: { name: 'gv', size: 5 }, patch: { name: 'gv-2' } },
  { base: '/v2/registry-credentials', create: { name: 'reg', username: 'u', password: 'p' }, patch: { name: 'reg-2' } },
];

t.test('the same five operations for every referenced resource', async (t) => {
  const a = await startAgent(t);
  for (const k of KINDS) {
    const created = await a.req('POST', k.base, { body: k.create });
    t.equal(created.status, 201, `POST ${k.base} is 201`);
    t.type(created.json.id, 'string', 'with its id');
    t.equal(created.json.name, k.create.name, 'and the record');
    t.ok(Number.isFinite(Date.parse(created.json.createdAt)), 'createdAt');
    const list = await a.req('GET', k.base);
    t.equal(list.status, 200);
    t.ok(Array.isArray(list.json), `GET ${k.base} is a bare array`);
    t.same(list.json.map((x: { id: string }) => x.id), [created.json.id]);
    const one = await a.req('GET', `${k.base}/${created.json.id}`);
    t.same(one.json, created.json, `GET ${k.base}/{id}`);
    const patched = await a.req('PATCH', `${k.base}/${created.json.id}`, { body: k.patch });
    t.equal(patched.status, 200);
    t.equal(patched.json.name, k.patch.name, `PATCH ${k.base}/{id}`);
    t.equal(patched.json.id, created.json.id);
    assertErrorAt(t, await a.req('POST', k.base, { body: { ...k.create, color: 'blue' } }), 400, '/color', `unknown property on ${k.base}`);
    assertErrorAt(t, await a.req('PATCH', `${k.base}/${created.json.id}`, { body: { color: 'blue' } }), 400, '/color');
    assertErrorAt(t, await a.req('POST', k.base, { body: { ...k.create, name: '' } }), 400, '/name');
    assertProblem(t, await a.req('POST', k.base, { raw: JSON.stringify(k.create) }), 415);
    const del = await a.req('DELETE', `${k.base}/${created.json.id}`);
    t.equal(del.status, 204, `DELETE ${k.base}/{id}`);
    assertProblem(t, await a.req('GET', `${k.base}/${created.json.id}`), 404, 'gone');
    assertProblem(t, await a.req('DELETE', `${k.base}/${created.json.id}`), 404, 'a second delete is a 404');
    assertProblem(t, await a.req('PATCH', `${k.base}/${created.json.id}`, { body: k.patch }), 404);
  }
});

t.test('templates', async (t) => {
  const a = await startAgent(t);
  const reg = await makeRegistry(t, a);
  const minimal = await mustPost(t, a, '/v2/templates', { name: 'minimal', image: 'registry.local/m:1' });
  t.match(minimal, {
    name: 'minimal', image: 'registry.local/m:1', args: '', ports: [], env: {}, registry: null, isServerless: false,
    allowedCudaVersions: [], startSsh: false, startJupyter: false, isPublic: false,
  }, 'defaults');
  const full = await mustPost(t, a, '/v2/templates', {
    name: 'full', image: 'registry.local/f:1', args: 'python a.py', disk: 12, ports: ['8000/http'], env: { A: '1' }, registry: reg.id,
    isServerless: true, allowedCudaVersions: ['12.4', '12.10'], startSsh: true, startJupyter: true, isPublic: true, readme: '# hi',
  });
  t.match(full, { args: 'python a.py', disk: 12, ports: ['8000/http'], env: { A: '1' }, registry: reg.id, isServerless: true, allowedCudaVersions: ['12.4', '12.10'], startSsh: true, startJupyter: true, isPublic: true });
  const patched = await a.req('PATCH', `/v2/templates/${full.id}`, { body: { env: { B: '2' }, isPublic: false } });
  t.match(patched.json, { env: { B: '2' }, isPublic: false, image: 'registry.local/f:1', disk: 12 }, 'PATCH merges fields');
  const cases: [string, Record<string, unknown>, number, string][] = [
    ['no image', { name: 'x' }, 400, '/image'],
    ['bad args', { name: 'x', image: 'i', args: 'python "a.py' }, 400, '/args'],
    ['bad JSON args', { name: 'x', image: 'i', args: '{"cmd": 1}' }, 400, '/args'],
    ['JSON array args (Docker exec form)', { name: 'x', image: 'i', args: '["python", "a.py"]' }, 400, '/args'],
    ['bad CUDA version', { name: 'x', image: 'i', allowedCudaVersions: ['12'] }, 400, '/allowedCudaVersions/0'],
    ['bad port', { name: 'x', image: 'i', ports: ['80'] }, 400, '/ports/0'],
    ['disk 0', { name: 'x', image: 'i', disk: 0 }, 400, '/disk'],
    ['isServerless not boolean', { name: 'x', image: 'i', isServerless: 'yes' }, 400, '/isServerless'],
  ];
  for (const [label, body, status, pointer] of cases) assertErrorAt(t, await a.req('POST', '/v2/templates', { body }), status, pointer, label);
  const unknownReg = await a.req('POST', '/v2/templates', { body: { name: 'x', image: 'i', registry: 'reg_unknown000000000000' } });
  assertProblem(t, unknownReg, 404, 'an unknown registry credential is a 404');
  assertErrorAt(t, await a.req('PATCH', `/v2/templates/${full.id}`, { body: { args: '{"cmd": [' } }), 400, '/args');
});

t.test('network and global volumes', async (t) => {
  const a = await startAgent(t, { dataCenterId: 'SITE-9' });
  const nv = await mustPost(t, a, '/v2/network-volumes', { name: 'models', size: 100 });
  t.match(nv, { name: 'models', size: 100, dataCenterId: 'SITE-9' }, 'the data center defaults to the configured site');
  t.equal((await a.req('POST', '/v2/network-volumes', { body: { name: 'x', size: 1, dataCenterId: 'SITE-9' } })).status, 201, 'or is named');
  assertErrorAt(t, await a.req('POST', '/v2/network-volumes', { body: { name: 'x', size: 1, dataCenterId: 'EU-RO-1' } }), 400, '/dataCenterId', 'an unknown data center');
  assertErrorAt(t, await a.req('POST', '/v2/network-volumes', { body: { name: 'x', size: 0 } }), 400, '/size');
  assertErrorAt(t, await a.req('POST', '/v2/network-volumes', { body: { name: 'x' } }), 400, '/size');
  assertErrorAt(t, await a.req('POST', '/v2/network-volumes', { body: { name: 'x', size: 1.5 } }), 400, '/size');
  t.equal((await a.req('PATCH', `/v2/network-volumes/${nv.id}`, { body: { size: 200 } })).json.size, 200, 'volumes grow');
  assertErrorAt(t, await a.req('PATCH', `/v2/network-volumes/${nv.id}`, { body: { size: 150 } }), 400, '/size', 'but do not shrink');
  assertErrorAt(t, await a.req('PATCH', `/v2/network-volumes/${nv.id}`, { body: { dataCenterId: 'SITE-9' } }), 400, '/dataCenterId', 'a volume does not move');

  const gv = await mustPost(t, a, '/v2/global-volumes', { name: 'shared', size: 10 });
  t.match(gv, { name: 'shared', size: 10 });
  t.notOk('dataCenterId' in gv, 'global volumes have no data center');
  assertErrorAt(t, await a.req('POST', '/v2/global-volumes', { body: { name: 'x', size: 1, dataCenterId: 'SITE-9' } }), 400, '/dataCenterId');
  t.equal((await a.req('PATCH', `/v2/global-volumes/${gv.id}`, { body: { size: 20 } })).json.size, 20);
  assertErrorAt(t, await a.req('PATCH', `/v2/global-volumes/${gv.id}`, { body: { size: 5 } }), 400, '/size');
});

t.test('the registry password is write-only', async (t) => {
  const a = await startAgent(t);
  const secret = 'S3cr3t-Pa55w0rd-7f1c9e4a';
  const secret2 = 'An0ther-S3cret-b81d2c55';
  const created = await a.req('POST', '/v2/registry-credentials', { body: { name: 'ghcr', username: 'robot', password: secret } });
  t.equal(created.status, 201);
  const id: string = created.json.id;
  t.same(Object.keys(created.json).sort(), ['createdAt', 'id', 'name', 'updatedAt', 'username'], 'create returns no password');
  const seen: string[] = [created.text];
  seen.push((await a.req('GET', '/v2/registry-credentials')).text);
  seen.push((await a.req('GET', `/v2/registry-credentials/${id}`)).text);
  const patched = await a.req('PATCH', `/v2/registry-credentials/${id}`, { body: { password: secret2 } });
  t.equal(patched.status, 200);
  seen.push(patched.text);
  seen.push((await a.req('PATCH', `/v2/registry-credentials/${id}`, { body: { username: 'robot2' } })).text);
  const e = await mustCreate(t, a, queueBody({ registry: id }));
  seen.push(JSON.stringify(e), (await a.req('GET', `/v2/serverless/${e.id}`)).text, (await a.req('GET', '/v2/serverless')).text);
  seen.push((await a.req('PATCH', `/v2/serverless/${e.id}`, { body: { name: 'uses-reg' } })).text);
  const tpl = await mustPost(t, a, '/v2/templates', { name: 'with-reg', image: 'ghcr.io/private/x:1', registry: id });
  seen.push(JSON.stringify(tpl), (await a.req('GET', '/v2/catalog/templates')).text);
  seen.push((await a.req('POST', '/v2/registry-credentials', { body: { name: 'bad', username: 'u', password: secret, extra: 1 } })).text);
  seen.push((await a.req('POST', '/v2/registry-credentials', { body: { name: '', username: 'u', password: secret } })).text);
  seen.push((await a.req('GET', '/v2/openapi.json', { key: null })).text);
  for (const [i, text] of seen.entries()) {
    t.notOk(text.includes(secret) || text.includes(secret2), `response ${i} has no password`);
    t.notOk(/"password"\s*:\s*"/.test(text), `response ${i} has no password member with a value`);
  }
  t.same(a.agent.endpoints.registryAuth('usr_admin', id), { username: 'robot2', password: secret2 }, 'the server still has it for image pulls (PATCH replaced it)');
  t.notOk(a.logs.some((l) => l.includes(secret) || l.includes(secret2)), 'never logged');

  a.agent.db.pragma('wal_checkpoint(PASSIVE)');
  const files = readdirSync(a.dir).filter((f) => statSync(join(a.dir, f)).isFile());
  t.ok(files.includes('flashd.db'), `data dir has ${files.join(', ')}`);
  for (const f of files) {
    const bytes = readFileSync(join(a.dir, f));
    t.equal(bytes.indexOf(Buffer.from(secret)), -1, `${f} does not hold the first password in clear`);
    t.equal(bytes.indexOf(Buffer.from(secret2)), -1, `${f} does not hold the second password in clear`);
  }
  const row = a.agent.db.prepare('SELECT data FROM registry_credentials WHERE id = ?').get(id) as { data: string };
  t.notOk(row.data.includes(secret2), 'the row holds only a sealed form');

  assertErrorAt(t, await a.req('POST', '/v2/registry-credentials', { body: { name: 'x', username: 'u' } }), 400, '/password', 'a password is required');
  assertErrorAt(t, await a.req('POST', '/v2/registry-credentials', { body: { name: 'x', username: 'u', password: '' } }), 400, '/password');
  const inUse = await a.req('DELETE', `/v2/registry-credentials/${id}`);
  t.equal(inUse.status, 409, 'a credential used by an endpoint cannot be deleted');
});

t.test('a 404 detail names the kind with a capital, alike on GET, PATCH and DELETE; so does the 409 of one in use', async (t) => {
  const a = await startAgent(t);
  const names: Record<string, string> = {
    '/v2/templates': 'Template', '/v2/network-volumes': 'Network volume', '/v2/global-volumes': 'Global volume', '/v2/registry-credentials': 'Registry credential',
  };
  for (const k of KINDS) {
    for (const [method, body] of [['GET', undefined], ['PATCH', k.patch], ['DELETE', undefined]] as const) {
      const r = await a.req(method, `${k.base}/nope123`, body === undefined ? {} : { body });
      assertProblem(t, r, 404, `${method} ${k.base}/nope123`);
      t.equal(r.json.detail, `${names[k.base]} nope123 not found.`, `${method} ${k.base}: ${r.json.detail}`);
    }
  }
  const reg = (await mustPost(t, a, '/v2/registry-credentials', { name: 'reg', username: 'u', password: 'p' })).id as string;
  await mustCreate(t, a, queueBody({ registry: reg }));
  const inUse = await a.req('DELETE', `/v2/registry-credentials/${reg}`);
  assertProblem(t, inUse, 409);
  t.match(inUse.json.detail, new RegExp(`^Registry credential ${reg} is used by endpoint `), inUse.json.detail);
});
