/**
 * GET /v2/openapi.json: an OpenAPI 3.1 document generated from the route table and the schema/
 * files. Fails when a served route is missing, when a $ref dangles or when a schema does not
 * compile.
 */
import t from 'tap';
import { compileAllSchemas, SCHEMA_DOCUMENTS } from '../../src/core/schemas.js';
import { cpuBody, startAgent } from '../helpers/agent.js';

const METHODS = ['get', 'post', 'patch', 'put', 'delete'];

function resolvePointer(doc: unknown, ref: string): unknown {
  if (!ref.startsWith('#/')) return undefined;
  let node: unknown = doc;
  for (const raw of ref.slice(2).split('/')) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (node === null || typeof node !== 'object' || !(key in (node as Record<string, unknown>))) return undefined;
    node = (node as Record<string, unknown>)[key];
  }
  return node;
}

function collectRefs(value: unknown, at: string, out: [string, string][]): void {
  if (Array.isArray(value)) value.forEach((v, i) => collectRefs(v, `${at}/${i}`, out));
  else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (k === '$ref' && typeof v === 'string') out.push([at, v]);
      else collectRefs(v, `${at}/${k}`, out);
    }
  }
}

t.test('the document is public, OpenAPI 3.1 and version 2.0.0', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('GET', '/v2/openapi.json', { key: null });
  t.equal(r.status, 200, 'no auth needed');
  t.match(r.headers.get('content-type'), /^application\/json/);
  t.equal(r.json.openapi, '3.1.0');
  t.equal(r.json.info.version, '2.0.0', 'the management API declares version 2.0.0');
  t.equal(r.json.jsonSchemaDialect, 'https://json-schema.org/draft/2020-12/schema');
  t.match(r.json.components.securitySchemes.bearerAuth, { type: 'http', scheme: 'bearer' });
  t.same((await a.req('GET', '/v2/openapi.json')).json, r.json, 'the same with a key');
});

t.test('every served route is in the document, and nothing else', async (t) => {
  const a = await startAgent(t);
  const doc = (await a.req('GET', '/v2/openapi.json', { key: null })).json;
  const routes = a.agent.api.routes;
  t.ok(routes.length > 40, `${routes.length} routes`);
  const seen = new Set<string>();
  for (const r of routes) {
    const op = doc.paths?.[r.path]?.[r.method.toLowerCase()];
    t.ok(op, `${r.method} ${r.path} is documented`);
    if (!op) continue;
    seen.add(`${r.method} ${r.path}`);
    t.equal(op.operationId, r.operationId);
    t.ok(op.responses?.[String(r.successStatus)], `${r.operationId}: success status ${r.successStatus}`);
    for (const status of r.problems) {
      t.equal(op.responses?.[String(status)]?.content?.['application/problem+json']?.schema?.$ref, '#/components/schemas/Problem', `${r.operationId}: ${status} is a Problem`);
    }
    // Any route that reads a body refuses a compressed one (415) and one over its limit (413).
    if (r.body !== undefined) for (const status of [413, 415]) t.ok(r.problems.includes(status), `${r.operationId} reads a body: ${status} documented`);
    t.same(op.security, r.auth === 'none' ? [] : [{ bearerAuth: [] }], `${r.operationId}: security`);
    const params = [...r.path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
    t.same(op.parameters.filter((p: { in: string }) => p.in === 'path').map((p: { name: string }) => p.name), params, `${r.operationId}: path parameters`);
    if (r.requestSchema) t.equal(op.requestBody?.content?.['application/json']?.schema?.$ref, `#/components/schemas/${r.requestSchema}`);
  }
  const documented: string[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, unknown>>)) {
    for (const m of Object.keys(item)) if (METHODS.includes(m)) documented.push(`${m.toUpperCase()} ${path}`);
  }
  t.same(documented.filter((d) => !seen.has(d)), [], 'the document lists no route that is not served');
  const ids = routes.map((r) => r.operationId);
  t.equal(new Set(ids).size, ids.length, 'operationIds are unique');
  for (const [method, path] of [
    ['POST', '/v2/serverless'], ['GET', '/v2/serverless'], ['GET', '/v2/serverless/{endpointId}'], ['PATCH', '/v2/serverless/{endpointId}'],
    ['DELETE', '/v2/serverless/{endpointId}'], ['POST', '/v1/endpoints'], ['GET', '/v2/catalog/gpus'], ['GET', '/v2/catalog/cpus'],
    ['GET', '/v2/catalog/data-centers'], ['GET', '/v2/catalog/templates'], ['POST', '/v2/api-keys'], ['POST', '/v2/sessions'],
    ['POST', '/v2/templates'], ['POST', '/v2/network-volumes'], ['POST', '/v2/global-volumes'], ['POST', '/v2/registry-credentials'],
  ] as const) {
    t.ok(doc.paths[path]?.[method.toLowerCase()], `${method} ${path} is documented`);
  }
  t.equal(doc.paths['/v2/serverless'].post.operationId, 'createEndpoint', 'the spec operation name');
  t.same(doc.paths['/v2/catalog/gpus'].get.parameters.map((p: { name: string }) => p.name).sort(), ['include', 'product']);
});

t.test('every $ref resolves and every schema compiles', async (t) => {
  const a = await startAgent(t);
  const doc = (await a.req('GET', '/v2/openapi.json', { key: null })).json;
  const refs: [string, string][] = [];
  collectRefs(doc, '#', refs);
  t.ok(refs.length > 100, `${refs.length} $refs`);
  const dangling = refs.filter(([, ref]) => resolvePointer(doc, ref) === undefined);
  t.same(dangling, [], 'no dangling $ref');
  t.ok(refs.every(([, ref]) => ref.startsWith('#/components/schemas/')), 'every $ref is local to the document');

  const names = compileAllSchemas();
  const defs = Object.values(SCHEMA_DOCUMENTS).flatMap((d) => Object.keys(d.$defs));
  t.same([...names].sort(), [...defs].sort(), 'compileAllSchemas compiles every $def');
  t.same(Object.keys(doc.components.schemas).sort(), [...defs].sort(), 'every schema file definition is a component');
});

t.test('the documented shapes carry the spec rules', async (t) => {
  const a = await startAgent(t);
  const s = (await a.req('GET', '/v2/openapi.json', { key: null })).json.components.schemas;
  t.same(s.EndpointCreate.required, ['name', 'type', 'scaling']);
  t.equal(s.EndpointCreate.additionalProperties, false, 'unknown body properties are rejected');
  for (const name of ['GpuCreate', 'CpuItem', 'Workers', 'ScalingQueueDelay', 'ScalingRequestCount', 'MountsInput', 'Mount']) {
    t.equal(s[name].additionalProperties, false, `${name}: no other properties`);
  }
  for (const f of ['id', 'name', 'workers', 'scaling', 'dataCenterIds', 'networkVolumes', 'mounts', 'timeout', 'flashboot', 'createdAt']) {
    t.ok(s.Endpoint.required.includes(f), `Endpoint requires ${f}`);
  }
  t.same(s.Gpu.required, ['pools', 'excludedTypes', 'count', 'allowedCudaVersions', 'minCudaVersion']);
  t.equal(s.ExcludedType.pattern, '^\\s*[^-\\s]');
  t.equal(s.CudaVersion.pattern, '^\\d+\\.\\d+$');
  t.equal(s.ScalingQueueDelay.properties.queueDelay.minimum, 0.5);
  t.same([s.ScalingRequestCount.properties.requestCount.type, s.ScalingRequestCount.properties.requestCount.minimum], ['integer', 1]);
  t.same([s.Workers.properties.idleTimeout.minimum, s.Workers.properties.idleTimeout.maximum], [1, 3600]);
  t.equal(s.CpuItem.properties.vcpuCount.minimum, 2);
  t.equal(s.MountsInput.properties.global.maxItems, 1);
  t.equal(s.EndpointCreate.properties.networkVolumes.deprecated, true, 'networkVolumes is deprecated');
  t.same(s.Problem.required, ['type', 'title', 'status', 'detail', 'errors']);
  t.equal(s.RegistryCredentialCreate.properties.password.writeOnly, true);
  t.notOk('password' in s.RegistryCredential.properties, 'the credential view has no password');
  t.notOk('key' in s.ApiKey.properties, 'a listed key has no secret');
});

t.test('uniqueItems only on arrays of scalars', async (t) => {
  // ajv compares non-scalar items with a recursive deep equality: a body of two deeply nested
  // items then exhausts the stack (a 500). Arrays of objects check uniqueness in code instead.
  const found: string[] = [];
  const walk = (node: unknown, at: string): void => {
    if (Array.isArray(node)) node.forEach((v, i) => walk(v, `${at}/${i}`));
    else if (node && typeof node === 'object') {
      const o = node as Record<string, unknown>;
      if (o['uniqueItems'] === true) {
        const type = (o['items'] as { type?: unknown } | undefined)?.type;
        const types = Array.isArray(type) ? type : [type];
        const scalar = types.length > 0 && types.every((x) => x === 'string' || x === 'integer' || x === 'number' || x === 'boolean');
        found.push(at);
        t.ok(scalar, `${at}: uniqueItems with items of scalar type (got ${JSON.stringify(type)})`);
      }
      for (const [k, v] of Object.entries(o)) walk(v, `${at}/${k}`);
    }
  };
  for (const [file, doc] of Object.entries(SCHEMA_DOCUMENTS)) walk(doc, file);
  t.ok(found.length > 10, `${found.length} uniqueItems arrays checked`);
});

t.test('the documented bounds of ?wait and ?ttl are the ones the job routes enforce', async (t) => {
  const a = await startAgent(t);
  const doc = (await a.req('GET', '/v2/openapi.json', { key: null })).json;
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const cases: [string, string, string, string][] = [
    // No such endpoint: ?wait is checked first, so a valid one gets its 404 without waiting.
    ['/v2/{endpointId}/runsync', 'post', 'wait', '/v2/no-such-endpoint/runsync'],
    ['/v2/{endpointId}/status/{jobId}', 'get', 'ttl', `/v2/${ep}/status/no-such-job`],
  ];
  for (const [path, method, name, url] of cases) {
    const p = (doc.paths[path][method].parameters as { name: string; schema: { minimum?: number; maximum?: number } }[]).find((x) => x.name === name);
    const { minimum, maximum } = p?.schema ?? {};
    t.type(minimum, 'number', `?${name} documents a minimum`);
    t.type(maximum, 'number', `?${name} documents a maximum`);
    if (typeof minimum !== 'number' || typeof maximum !== 'number') continue;
    // Out of the documented range: 400; at its ends: accepted (404 once the query passed).
    const call = (v: number) => a.req(method.toUpperCase(), `${url}?${name}=${v}`, method === 'post' ? { body: { input: {} } } : {});
    t.equal((await call(minimum - 1)).status, 400, `?${name}=${minimum - 1} refused`);
    t.equal((await call(maximum + 1)).status, 400, `?${name}=${maximum + 1} refused`);
    t.equal((await call(minimum)).status, 404, `?${name}=${minimum} accepted`);
    t.equal((await call(maximum)).status, 404, `?${name}=${maximum} accepted`);
  }
});
