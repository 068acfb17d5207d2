/**
 * `templateId` on create (spec, create rule 7): resolved once into image, args, disk, ports, env and
 * registry; body fields win and env merges per key; CUDA seeding only for a GPU create that omits
 * allowedCudaVersions and sets no floor; pod-only flags ignored; own or public templates only.
 */
import t from 'tap';
import { assertProblem, cpuBody, queueBody, startAgent } from '../helpers/agent.js';
import { assertErrorAt, createEndpoint, makeRegistry, makeTemplate, makeUser, mustCreate } from '../helpers/expect.js';

const fromTemplate = (templateId: string, extra: Record<string, unknown> = {}) => {
  const { image: _image, ...body } = queueBody({ templateId, ...extra });
  return body;
};

t.test('a template fills image, args, disk, ports, env and registry', async (t) => {
  const a = await startAgent(t);
  const reg = await makeRegistry(t, a);
  const tpl = await makeTemplate(t, a, {
    name: 'full', image: 'ghcr.io/acme/llm:3', args: '{"entrypoint": ["python", "-u"], "cmd": ["serve.py"]}', disk: 25,
    ports: ['8000/http'], env: { MODEL: 'llama', LOG: 'info' }, registry: reg.id,
  });
  const e = await mustCreate(t, a, fromTemplate(tpl.id));
  t.equal(e.image, 'ghcr.io/acme/llm:3');
  t.equal(e.args, '{"entrypoint": ["python", "-u"], "cmd": ["serve.py"]}', 'args as stored in the template');
  t.same([e.entrypoint, e.cmd], [['python', '-u'], ['serve.py']], 'and deconstructed');
  t.equal(e.disk, 25);
  t.same(e.ports, ['8000/http']);
  t.same(e.env, { MODEL: 'llama', LOG: 'info' });
  t.equal(e.registry, reg.id);
  t.equal(e.templateId, tpl.id, 'the template is recorded for reference');

  const bare = await makeTemplate(t, a, { name: 'bare-args', args: 'python handler.py --fast' });
  const b = await mustCreate(t, a, fromTemplate(bare.id));
  t.same([b.args, b.entrypoint, b.cmd], ['python handler.py --fast', [], ['python', 'handler.py', '--fast']], 'a bare template args string becomes cmd');
  const none = await makeTemplate(t, a, { name: 'minimal' });
  const n = await mustCreate(t, a, fromTemplate(none.id));
  t.same([n.image, n.args, n.ports, n.env, n.registry], ['registry.local/tpl:1', '', [], {}, null], 'an image-only template');
  t.notOk('disk' in n);
});

t.test('explicit body fields override the template; env merges per key', async (t) => {
  const a = await startAgent(t);
  const reg = await makeRegistry(t, a, { name: 'tpl-reg' });
  const reg2 = await makeRegistry(t, a, { name: 'body-reg' });
  const tpl = await makeTemplate(t, a, {
    image: 'ghcr.io/acme/llm:3', args: '{"entrypoint": ["python"], "cmd": ["serve.py"]}', disk: 25,
    ports: ['8000/http'], env: { MODEL: 'llama', LOG: 'info' }, registry: reg.id,
  });
  const e = await mustCreate(t, a, queueBody({
    templateId: tpl.id, image: 'ghcr.io/acme/llm:4', disk: 50, ports: ['9000/http'], env: { LOG: 'debug', EXTRA: '1' }, registry: reg2.id,
  }));
  t.equal(e.image, 'ghcr.io/acme/llm:4', 'body image wins');
  t.equal(e.disk, 50, 'body disk wins');
  t.same(e.ports, ['9000/http'], 'body ports win');
  t.same(e.env, { MODEL: 'llama', LOG: 'debug', EXTRA: '1' }, 'env merged per key, body values winning');
  t.equal(e.registry, reg2.id, 'body registry wins');
  t.same([e.entrypoint, e.cmd], [['python'], ['serve.py']], 'the template command when the body has none');

  t.equal((await mustCreate(t, a, fromTemplate(tpl.id, { registry: null }))).registry, null, 'an explicit null registry wins too');
  t.same((await mustCreate(t, a, fromTemplate(tpl.id, { ports: [] }))).ports, [], 'an explicit empty list wins');
  t.same((await mustCreate(t, a, fromTemplate(tpl.id, { env: {} }))).env, { MODEL: 'llama', LOG: 'info' }, 'an empty env adds nothing');

  const args = await mustCreate(t, a, fromTemplate(tpl.id, { args: 'node index.js' }));
  t.same([args.args, args.entrypoint, args.cmd], ['node index.js', [], ['node', 'index.js']], 'body args replace the whole command');
  const cleared = await mustCreate(t, a, fromTemplate(tpl.id, { args: '' }));
  t.same([cleared.args, cleared.entrypoint, cleared.cmd], ['', [], []], 'body args "" means no command');
  const cmd = await mustCreate(t, a, fromTemplate(tpl.id, { cmd: ['other.py', '--port', '80'] }));
  t.same([cmd.entrypoint, cmd.cmd], [['python'], ['other.py', '--port', '80']], 'body cmd overrides only cmd: the template entrypoint stays');
  const ep = await mustCreate(t, a, fromTemplate(tpl.id, { entrypoint: ['/bin/sh', '-c'] }));
  t.same([ep.entrypoint, ep.cmd], [['/bin/sh', '-c'], ['serve.py']], 'body entrypoint overrides only the entrypoint');
  assertErrorAt(t, await createEndpoint(a, fromTemplate(tpl.id, { args: 'python a.py', cmd: ['python', 'b.py'] })), 400, '/cmd', 'body args and cmd must still agree');
});

t.test('template CUDA versions seed gpu.allowedCudaVersions only for a GPU create that omits it and sets no floor', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { allowedCudaVersions: ['12.4', '12.8'] });
  const seeded = await mustCreate(t, a, fromTemplate(tpl.id));
  t.same([seeded.gpu.allowedCudaVersions, seeded.gpu.minCudaVersion], [['12.4', '12.8'], null], 'seeded when omitted');
  const nullFloor = await mustCreate(t, a, fromTemplate(tpl.id, { gpu: { pools: ['ADA_24'], minCudaVersion: null } }));
  t.same(nullFloor.gpu.allowedCudaVersions, ['12.4', '12.8'], 'a null floor is no floor: still seeded');
  const explicit = await mustCreate(t, a, fromTemplate(tpl.id, { gpu: { pools: ['ADA_24'], allowedCudaVersions: ['12.1'] } }));
  t.same(explicit.gpu.allowedCudaVersions, ['12.1'], 'the body list wins');
  const empty = await mustCreate(t, a, fromTemplate(tpl.id, { gpu: { pools: ['ADA_24'], allowedCudaVersions: [] } }));
  t.same(empty.gpu.allowedCudaVersions, [], 'an explicit empty list is kept, not seeded');
  const floor = await mustCreate(t, a, fromTemplate(tpl.id, { gpu: { pools: ['ADA_24'], minCudaVersion: '12.2' } }));
  t.same([floor.gpu.allowedCudaVersions, floor.gpu.minCudaVersion], [[], '12.2'], 'not seeded when the body sets a floor (so no 400)');
  const cpu = await createEndpoint(a, { ...cpuBody({ templateId: tpl.id }), image: undefined });
  t.equal(cpu.status, 201, `a CPU create from a template with CUDA versions is fine: ${cpu.text.slice(0, 200)}`);
  t.notOk('gpu' in cpu.json, 'and gets no CUDA constraints');
});

t.test('pod-only startSsh/startJupyter are ignored', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { startSsh: true, startJupyter: true });
  t.same([tpl.startSsh, tpl.startJupyter], [true, true], 'kept on the template');
  const e = await mustCreate(t, a, fromTemplate(tpl.id));
  t.notOk('startSsh' in e || 'startJupyter' in e, 'not on the endpoint');
  t.same(e.ports, [], 'no ssh or jupyter ports added');
  t.same(e.env, {}, 'no env added');
});

t.test('later template edits or deletion do not touch the endpoint', async (t) => {
  const a = await startAgent(t);
  const tpl = await makeTemplate(t, a, { image: 'registry.local/app:1', args: 'python a.py', env: { V: '1' }, allowedCudaVersions: ['12.4'], disk: 5 });
  const e = await mustCreate(t, a, fromTemplate(tpl.id));
  const edit = await a.req('PATCH', `/v2/templates/${tpl.id}`, { body: { image: 'registry.local/app:2', args: 'python b.py', env: { V: '2' }, allowedCudaVersions: ['12.8'], disk: 9, isServerless: false } });
  t.equal(edit.status, 200);
  t.equal(edit.json.image, 'registry.local/app:2');
  const after = (await a.req('GET', `/v2/serverless/${e.id}`)).json;
  t.same(after, e, 'the endpoint is unchanged');
  const patched = await a.req('PATCH', `/v2/serverless/${e.id}`, { body: { name: 'still-v1' } });
  t.same([patched.json.image, patched.json.cmd, patched.json.env, patched.json.disk], ['registry.local/app:1', ['python', 'a.py'], { V: '1' }, 5], 'a PATCH of the endpoint does not re-read the template');
  t.equal((await a.req('DELETE', `/v2/templates/${tpl.id}`)).status, 204, 'a template in use can be deleted');
  t.equal((await a.req('GET', `/v2/serverless/${e.id}`)).json.image, 'registry.local/app:1', 'the endpoint keeps its copy');
});

t.test('own or public templates only; unknown is 404, non-serverless is 422', async (t) => {
  const a = await startAgent(t);
  const owner = await makeUser(t, a, 'tpl-owner');
  const caller = await makeUser(t, a, 'tpl-caller');
  const pub = await makeTemplate(t, a, { name: 'public', image: 'registry.local/public:1', isPublic: true, env: { P: '1' } }, owner.key);
  const priv = await makeTemplate(t, a, { name: 'private', image: 'registry.local/private:1' }, owner.key);
  const podOnly = await makeTemplate(t, a, { name: 'pod', isServerless: false }, caller.key);
  const defaulted = await mustCreate(t, a, fromTemplate(pub.id), caller.key);
  t.same([defaulted.image, defaulted.env], ['registry.local/public:1', { P: '1' }], "another account's public template is usable");
  t.equal((await createEndpoint(a, fromTemplate(priv.id), owner.key)).status, 201, 'the owner can use a private template');
  assertErrorAt(t, await createEndpoint(a, fromTemplate(priv.id), caller.key), 404, '/templateId', "another account's private template is a 404");
  assertErrorAt(t, await createEndpoint(a, fromTemplate('tpl_doesnotexist000000000')), 404, '/templateId', 'an unknown template is a 404');
  assertErrorAt(t, await createEndpoint(a, queueBody({ templateId: 'tpl_doesnotexist000000000' })), 404, '/templateId', 'also with an image in the body');
  const nonServerless = await createEndpoint(a, fromTemplate(podOnly.id), caller.key);
  assertErrorAt(t, nonServerless, 422, '/templateId', 'a non-serverless template is a 422');
  t.equal(nonServerless.json.code, 'UNPROCESSABLE');
  const plain = await makeTemplate(t, a, { name: 'unflagged', isServerless: undefined }, caller.key);
  t.equal(plain.isServerless, false, 'templates are not serverless unless flagged');
  assertErrorAt(t, await createEndpoint(a, fromTemplate(plain.id), caller.key), 422, '/templateId');

  const ownerReg = await makeRegistry(t, a, { name: 'owner-reg' }, owner.key);
  const pubWithReg = await makeTemplate(t, a, { name: 'public-private-image', isPublic: true, registry: ownerReg.id }, owner.key);
  t.equal((await mustCreate(t, a, fromTemplate(pubWithReg.id), owner.key)).registry, ownerReg.id, "the owner gets the template's credential");
  assertErrorAt(t, await createEndpoint(a, fromTemplate(pubWithReg.id), caller.key), 404, '/templateId', "another account cannot use the owner's credential through a public template");
  const ownCred = await makeRegistry(t, a, { name: 'caller-reg' }, caller.key);
  t.equal((await mustCreate(t, a, fromTemplate(pubWithReg.id, { registry: ownCred.id }), caller.key)).registry, ownCred.id, 'but may name its own');
  t.equal((await mustCreate(t, a, fromTemplate(pubWithReg.id, { registry: null }), caller.key)).registry, null, 'or none');

  t.equal((await a.req('PATCH', `/v2/templates/${pub.id}`, { body: { isPublic: false }, key: owner.key })).status, 200);
  assertErrorAt(t, await createEndpoint(a, fromTemplate(pub.id), caller.key), 404, '/templateId', 'once made private it is a 404 for others');
  t.equal((await a.req('GET', `/v2/serverless/${defaulted.id}`, { key: caller.key })).json.image, 'registry.local/public:1', 'endpoints made from it keep working');
});

t.test('a template body with RunPod REST template names (imageName, containerDiskInGb, …) says where each one goes here', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('POST', '/v2/templates', { body: { name: 'rp', imageName: 'busybox', containerDiskInGb: 10, dockerStartCmd: ['python', 'h.py'], containerRegistryAuthId: 'x', volumeInGb: 0, volumeMountPath: '/workspace', isServerless: true } });
  assertProblem(t, r, 400);
  t.same(r.json.errors, [
    '/image: is required',
    "/imageName: unknown property (a field of RunPod's REST template body); here it is image",
    "/containerDiskInGb: unknown property (a field of RunPod's REST template body); here it is disk",
    "/dockerStartCmd: unknown property (a field of RunPod's REST template body); here it is args",
    "/containerRegistryAuthId: unknown property (a field of RunPod's REST template body); here it is registry",
    "/volumeInGb: unknown property (a field of RunPod's REST template body); workers have no volume of their own here (a RunPod serverless template takes 0): leave it out, and attach a network volume to the endpoint (mounts.network), mounted at /vendor-volume",
    "/volumeMountPath: unknown property (a field of RunPod's REST template body); volumes are mounted at the fixed path /vendor-volume (a network volume attached to the endpoint, mounts.network): leave it out",
  ]);
  const tpl = (await a.req('POST', '/v2/templates', { body: { name: 'ok', image: 'busybox', isServerless: true } })).json.id as string;
  const p = await a.req('PATCH', `/v2/templates/${tpl}`, { body: { imageName: 'alpine' } });
  t.same(p.json.errors, ["/imageName: unknown property (a field of RunPod's REST template body); here it is image"], 'a PATCH alike');
});

t.test('RunPod habits in a template body (disk as a string, ports as "8888/http,22/tcp", numeric env values) say what the field takes', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('POST', '/v2/templates', { body: { name: 't', image: 'busybox', disk: '20', ports: '8888/http,22/tcp', env: { N: 1 }, isServerless: 'true' } });
  assertProblem(t, r, 400);
  t.same([...r.json.errors].sort(), [
    '/disk: must be integer (a JSON number: 20, not the string "20")',
    '/ports: must be array (a JSON array of strings, not one comma-separated string)',
    '/env/N: must be string (every env value is a string: put numbers and booleans in quotes)',
    '/isServerless: must be boolean (true, not the string "true")',
  ].sort());
});
