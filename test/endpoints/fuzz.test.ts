/**
 * Fuzzing the create route (and its neighbours) with generated malformed bodies: mutations of
 * valid bodies, wrong types, deep nesting, huge numbers and `__proto__` keys. Pass criterion: no
 * 5xx, every non-2xx is problem+json, and every 2xx is a valid Endpoint. Set FUZZ_SEED to replay
 * a failure (fast-check prints the seed and path).
 */
import t, { type Test } from 'tap';
import fc from 'fast-check';
import { assertSchema } from '../../src/core/schemas.js';
import { cpuBody, queueBody, startAgent, type Reply, type TestAgent } from '../helpers/agent.js';
import { makeGlobalVolume, makeNetworkVolume, makeRegistry, makeTemplate, mustCreate } from '../helpers/expect.js';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const PROTO = '__FUZZ_PROTO_KEY__';
const DEEP = '__FUZZ_DEEP_VALUE__';
const SEED = process.env['FUZZ_SEED'] === undefined ? undefined : Number(process.env['FUZZ_SEED']);
const params = (numRuns: number) => ({ numRuns, ...(SEED === undefined ? {} : { seed: SEED }) });

/** Values that have broken JSON APIs before. */
const nasty = fc.constantFrom<Json>(
  1e308, -1e308, 2 ** 53 + 1, -(2 ** 53) - 1, 2 ** 31, 2 ** 32 + 2, -0, 0, -1, 0.5, 0.49, 1.5, 1e-300, 3601, 65536,
  '', ' ', '\u0000', '\ud800', 'x'.repeat(5000), '-NVIDIA L4', '  NVIDIA L4  ', '12.1', '12.10', '12', 'ADA_24', 'NVIDIA L4', 'cpu3c',
  'QUEUE', 'LOAD_BALANCER', 'QUEUE_DELAY', 'REQUEST_COUNT', '{"entrypoint": [1]}', '{"cmd":', 'python "a', '__proto__', 'constructor',
  [], {}, null, true, false, [null], [[]], [{}], { volumeId: '' }, { id: 'cpu3c', vcpuCount: 2 }, { type: 'QUEUE_DELAY' }, DEEP,
  { [PROTO]: { polluted: true } }, { constructor: { prototype: { polluted: true } } },
);
const junk: fc.Arbitrary<Json> = fc.oneof({ weight: 3, arbitrary: nasty }, { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 3 }) as fc.Arbitrary<Json> });
const key = fc.oneof(fc.constantFrom(PROTO, 'constructor', 'prototype', 'toString', 'hasOwnProperty', 'extra', ''), fc.string({ maxLength: 12 }));

/** Every path (array of keys/indexes) inside a JSON value, including the root. */
function paths(v: Json, at: (string | number)[] = []): (string | number)[][] {
  const out = [at];
  if (Array.isArray(v)) v.forEach((x, i) => out.push(...paths(x, [...at, i])));
  else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) out.push(...paths(x, [...at, k]));
  return out;
}

type Mutation =
  | { op: 'delete'; pick: number }
  | { op: 'set'; pick: number; value: Json }
  | { op: 'add'; pick: number; key: string; value: Json }
  | { op: 'wrap'; pick: number; asArray: boolean }
  | { op: 'dup'; pick: number }
  | { op: 'deepen'; pick: number };

const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ op: fc.constant('delete' as const), pick: fc.nat() }),
  fc.record({ op: fc.constant('set' as const), pick: fc.nat(), value: junk }),
  fc.record({ op: fc.constant('add' as const), pick: fc.nat(), key, value: junk }),
  fc.record({ op: fc.constant('wrap' as const), pick: fc.nat(), asArray: fc.boolean() }),
  fc.record({ op: fc.constant('dup' as const), pick: fc.nat() }),
  fc.record({ op: fc.constant('deepen' as const), pick: fc.nat() }),
);

function mutate(body: Json, m: Mutation): Json {
  const root: Json = structuredClone(body);
  const all = paths(root);
  const path = all[m.pick % all.length] as (string | number)[];
  if (path.length === 0) {
    if (m.op === 'set') return m.value;
    if (m.op === 'wrap') return m.asArray ? [root] : { body: root };
  }
  let parent: any = root;
  for (const p of path.slice(0, -1)) parent = parent[p];
  const last = path[path.length - 1] as string | number;
  const target = path.length ? parent[last] : root;
  switch (m.op) {
    case 'delete':
      if (Array.isArray(parent)) parent.splice(last as number, 1);
      else if (path.length) delete parent[last];
      break;
    case 'set':
      if (path.length) parent[last] = m.value;
      break;
    case 'add':
      if (target && typeof target === 'object' && !Array.isArray(target)) (target as Record<string, Json>)[m.key] = m.value;
      else if (Array.isArray(target)) target.push(m.value);
      break;
    case 'wrap':
      if (path.length) parent[last] = m.asArray ? [target] : { value: target };
      break;
    case 'dup':
      if (Array.isArray(target) && target.length) target.push(structuredClone(target[0] as Json));
      else if (Array.isArray(parent)) parent.push(structuredClone(target));
      break;
    case 'deepen':
      // Two deep siblings: what a deep-equality check (uniqueItems) walks recursively.
      if (!path.length) return [DEEP, DEEP];
      parent[last] = Array.isArray(target) ? [DEEP, DEEP] : DEEP;
      break;
  }
  return root;
}

/** JSON text with the markers turned into `__proto__` keys and deeply nested values. */
function serialize(body: Json, depth: number): string {
  const deep = '['.repeat(depth) + '{"a":1}' + ']'.repeat(depth);
  return JSON.stringify(body).replaceAll(`"${PROTO}"`, '"__proto__"').replaceAll(`"${DEEP}"`, deep);
}

function check(t: Test, r: Reply, label: string, onSuccess?: (json: any) => void): void {
  if (r.status >= 500) t.fail(`${label}: ${r.status} ${r.text.slice(0, 300)}`);
  if (r.status >= 300) {
    const ok = /^application\/problem\+json/.test(r.headers.get('content-type') ?? '')
      && r.json?.status === r.status && typeof r.json?.title === 'string' && typeof r.json?.detail === 'string'
      && (r.json.errors === undefined || (Array.isArray(r.json.errors) && r.json.errors.every((e: unknown) => typeof e === 'string')))
      && !/\n\s+at /.test(r.text);
    if (!ok) t.fail(`${label}: not problem+json: ${r.status} ${r.text.slice(0, 300)}`);
    if (![400, 404, 409, 413, 415, 422].includes(r.status)) t.fail(`${label}: unexpected status ${r.status}: ${r.text.slice(0, 200)}`);
  } else if (onSuccess) {
    onSuccess(r.json);
  }
  if (({} as Record<string, unknown>)['polluted'] !== undefined) t.fail(`${label}: Object.prototype polluted`);
}

async function fixtures(t: Test, a: TestAgent): Promise<Json[]> {
  const nv = await makeNetworkVolume(t, a);
  const gv = await makeGlobalVolume(t, a);
  const reg = await makeRegistry(t, a);
  const tpl = await makeTemplate(t, a, { allowedCudaVersions: ['12.4'], env: { A: '1' } });
  const { image: _image, ...fromTemplate } = queueBody({ templateId: tpl.id });
  return [
    queueBody(),
    cpuBody({ cpu: [{ id: 'cpu3c', vcpuCount: 2 }, { id: 'cpu3g', vcpuCount: 4 }] }),
    queueBody({
      type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, args: '{"entrypoint":["python"],"cmd":["a.py"]}',
      gpu: { pools: ['AMPERE_24', 'ADA_24'], excludedTypes: [' NVIDIA L4'], count: 2, allowedCudaVersions: [], minCudaVersion: '12.2' },
      workers: { min: 0, max: 2, idleTimeout: 30 }, env: { HEALTH_CHECK_PATH: '/ping' }, ports: ['8000/http'], disk: 10, registry: reg.id,
      dataCenterIds: ['LOCAL-1'], networkVolumes: [nv.id], mounts: { network: [{ volumeId: nv.id }] }, flashboot: 'FLASHBOOT', timeout: 5000,
    }),
    queueBody({ mounts: { global: [{ volumeId: gv.id }] }, cmd: ['python', 'x.py'], entrypoint: ['/init'] }),
    fromTemplate as Json,
  ] as Json[];
}

t.test('fuzz POST /v2/serverless', async (t) => {
  const a = await startAgent(t, { rateLimitMinute: 1_000_000, rateLimitHour: 1_000_000, rateLimitDay: 1_000_000 });
  const valid = await fixtures(t, a);
  for (const body of valid) t.equal((await a.req('POST', '/v2/serverless', { body })).status, 201, 'the seeds are valid');
  const post0 = (raw: string) => a.req('POST', '/v2/serverless', { raw, headers: { 'content-type': 'application/json' } });
  for (const [i, body] of valid.entries()) {
    for (let pick = 0; pick < paths(body).length; pick++) {
      const deep = serialize(mutate(body, { op: 'deepen', pick }), 20000);
      check(t, await post0(deep), `seed ${i}: deep nesting at ${JSON.stringify(paths(body)[pick])}`);
    }
  }
  const validEndpoint = (json: any) => {
    try {
      assertSchema('Endpoint', json);
    } catch (err) {
      t.fail(`a 201 that is not an Endpoint: ${(err as Error).message}`);
    }
    if (('gpu' in json) === ('cpu' in json)) t.fail(`exactly one of gpu/cpu in a created endpoint: ${JSON.stringify(json).slice(0, 200)}`);
  };
  const post = (raw: string) => a.req('POST', '/v2/serverless', { raw, headers: { 'content-type': 'application/json' } });
  let statuses = new Map<number, number>();
  const count = (s: number) => statuses.set(s, (statuses.get(s) ?? 0) + 1);

  await fc.assert(fc.asyncProperty(
    fc.nat({ max: valid.length - 1 }), fc.array(mutation, { minLength: 1, maxLength: 3 }), fc.constantFrom(1, 50, 3000, 20000, 20000),
    async (seed, mutations, depth) => {
      const body = mutations.reduce(mutate, valid[seed] as Json);
      const r = await post(serialize(body, depth));
      count(r.status);
      check(t, r, `mutated ${serialize(body, 1).slice(0, 300)}`, validEndpoint);
      return r.status < 500;
    },
  ), params(400));
  t.ok((statuses.get(400) ?? 0) > 50, `mutations mostly fail validation: ${JSON.stringify([...statuses])}`);
  t.ok((statuses.get(201) ?? 0) > 0, 'and some still pass');

  statuses = new Map();
  await fc.assert(fc.asyncProperty(fc.jsonValue({ maxDepth: 4 }), async (value) => {
    const r = await post(JSON.stringify(value));
    count(r.status);
    check(t, r, `any JSON ${JSON.stringify(value).slice(0, 200)}`, validEndpoint);
    return r.status < 500;
  }), params(150));

  await fc.assert(fc.asyncProperty(fc.string({ maxLength: 200 }), async (text) => {
    const r = await post(text);
    check(t, r, `text ${JSON.stringify(text).slice(0, 200)}`, validEndpoint);
    return r.status < 500;
  }), params(100));

  const fixed = [
    '{"__proto__": {"admin": true}, "name": "x"}',
    `{"name":"x","type":"QUEUE","scaling":{"type":"QUEUE_DELAY","queueDelay":1},"image":"i","gpu":{"pools":["ADA_24"],"__proto__":{"count":0}}}`,
    `{"name":"x","type":"QUEUE","scaling":{"type":"QUEUE_DELAY","queueDelay":1},"image":"i","gpu":{"pools":["ADA_24"]},"workers":{"__proto__":{"min":9}}}`,
    `{"name":"x","type":"QUEUE","scaling":{"type":"QUEUE_DELAY","queueDelay":1},"image":"i","gpu":{"pools":["ADA_24"]},"env":{"__proto__":"x","constructor":"y"}}`,
    '[' .repeat(100000) + ']'.repeat(100000),
    '{"a":'.repeat(50000) + '1' + '}'.repeat(50000),
    '{"name": 1e999}',
    '{"name": "x", "name": "y"}',
    '\ufeff{}',
    'null',
  ];
  for (const raw of fixed) check(t, await post(raw), `fixed ${raw.slice(0, 80)}`, validEndpoint);
  t.equal(({} as Record<string, unknown>)['admin'], undefined, 'no prototype pollution in this process');
});

t.test('fuzz PATCH /v2/serverless/{id} and the other create routes', async (t) => {
  const a = await startAgent(t, { rateLimitMinute: 1_000_000, rateLimitHour: 1_000_000, rateLimitDay: 1_000_000 });
  const valid = await fixtures(t, a);
  const target = await mustCreate(t, a, valid[2]);
  await fc.assert(fc.asyncProperty(
    fc.nat({ max: valid.length - 1 }), fc.array(mutation, { minLength: 1, maxLength: 3 }), fc.constantFrom(1, 3000),
    async (seed, mutations, depth) => {
      const body = mutations.reduce(mutate, valid[seed] as Json);
      const r = await a.req('PATCH', `/v2/serverless/${target.id}`, { raw: serialize(body, depth), headers: { 'content-type': 'application/json' } });
      check(t, r, `PATCH ${serialize(body, 1).slice(0, 300)}`, (json) => {
        try {
          assertSchema('Endpoint', json);
        } catch (err) {
          t.fail(`a 200 that is not an Endpoint: ${(err as Error).message}`);
        }
      });
      return r.status < 500;
    },
  ), params(150));

  const others: [string, Json][] = [
    ['/v1/endpoints', { name: 'v1', templateId: (valid[4] as Record<string, Json>)['templateId'] as string, gpuTypeIds: ['NVIDIA L4'], workersMin: 0, workersMax: 2, idleTimeout: 5 }],
    ['/v2/templates', { name: 't', image: 'i', args: 'python a.py', allowedCudaVersions: ['12.4'], env: { A: '1' }, ports: ['80/http'] }],
    ['/v2/network-volumes', { name: 'n', size: 5 }],
    ['/v2/global-volumes', { name: 'g', size: 5 }],
    ['/v2/registry-credentials', { name: 'r', username: 'u', password: 'p' }],
    ['/v2/api-keys', { name: 'k', scopes: ['endpoints:read'] }],
    ['/v2/teams', { name: 'team' }],
  ];
  for (const [path, seed] of others) {
    for (let pick = 0; pick < paths(seed).length; pick++) {
      const raw = serialize(mutate(seed, { op: 'deepen', pick }), 20000);
      check(t, await a.req('POST', path, { raw, headers: { 'content-type': 'application/json' } }), `POST ${path}: deep nesting at ${JSON.stringify(paths(seed)[pick])}`);
    }
  }
  for (const body of valid) {
    for (let pick = 0; pick < paths(body).length; pick++) {
      const raw = serialize(mutate(body, { op: 'deepen', pick }), 20000);
      check(t, await a.req('PATCH', `/v2/serverless/${target.id}`, { raw, headers: { 'content-type': 'application/json' } }), `PATCH: deep nesting at ${JSON.stringify(paths(body)[pick])}`);
    }
  }
  await fc.assert(fc.asyncProperty(
    fc.nat({ max: others.length - 1 }), fc.array(mutation, { minLength: 1, maxLength: 3 }), fc.constantFrom(1, 3000),
    async (which, mutations, depth) => {
      const [path, seed] = others[which] as [string, Json];
      const body = mutations.reduce(mutate, seed);
      const r = await a.req('POST', path, { raw: serialize(body, depth), headers: { 'content-type': 'application/json' } });
      check(t, r, `POST ${path} ${serialize(body, 1).slice(0, 300)}`);
      return r.status < 500;
    },
  ), params(250));
});
