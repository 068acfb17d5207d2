import t from 'tap';
import { request } from 'node:http';
import { ADMIN_KEY, queueBody, startAgent } from '../helpers/agent.js';

/** One request with the Host header given (fetch does not let a caller set it). */
function viaHost(url: string, method: string, path: string, host: string, body?: string): Promise<{ status: number; type: string; json: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const headers: Record<string, string> = { host, authorization: `Bearer ${ADMIN_KEY}` };
    if (body !== undefined) headers['content-type'] = 'application/json';
    const req = request({ host: u.hostname, port: u.port, path, method, headers }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: String(res.headers['content-type']), json: text ? JSON.parse(text) as Record<string, unknown> : {} }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const LB = (env: Record<string, string> = {}) =>
  queueBody({ type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, env });

t.test("a load-balancing endpoint's requestUrls reach none of flashd's own routes: a 404 that names the endpoint", async (t) => {
  const a = await startAgent(t);
  const lb = (await a.req('POST', '/v2/serverless', { body: LB({ HEALTH_CHECK_PATH: '/healthz' }) })).json;
  const base = new URL(lb.requestUrls.base as string);
  const health = new URL(lb.requestUrls.health as string);
  t.equal(health.pathname, '/healthz', "README's example: the health path is flashd's own /healthz");
  const lbHost = base.host;

  const check = async (what: string, method: string, path: string, host: string, body?: string, id = lb.id as string) => {
    const r = await viaHost(a.url, method, path, host, body);
    t.equal(r.status, 404, `${what}: 404`);
    t.match(r.type, /^application\/problem\+json/, `${what}: problem+json`);
    t.equal(r.json['code'], 'ROUTE_NOT_FOUND', `${what}: ROUTE_NOT_FOUND`);
    t.match(r.json['detail'], new RegExp(`load-balancing endpoint ${id}\\b.*does not route .*load-balancing workers yet`), `${what}: the detail names the endpoint and says why`);
  };
  // A health check on requestUrls.health must not report an endpoint with no worker healthy.
  await check('GET health URL', 'GET', health.pathname, lbHost);
  await check('GET base', 'GET', '/', lbHost);
  await check('the management API under base', 'GET', '/v2/serverless', lbHost);
  await check('the job API under base', 'POST', `/v2/${lb.id}/run`, lbHost, '{"input":{}}');
  await check('the host in capitals', 'GET', '/healthz', lbHost.toUpperCase());
  await check('without the port', 'GET', '/healthz', base.hostname);
  await check('an absolute name (trailing dot)', 'GET', '/healthz', `${base.hostname}.:${base.port}`);

  // Any other label gets the 404 too, but the detail does not call it a load-balancing endpoint.
  const other = async (what: string, host: string, detail: RegExp) => {
    const r = await viaHost(a.url, 'GET', '/healthz', host);
    t.equal(r.status, 404, `${what}: 404`);
    t.equal(r.json['code'], 'ROUTE_NOT_FOUND', `${what}: ROUTE_NOT_FOUND`);
    t.match(r.json['detail'], detail, `${what}: the detail says what the label is`);
    t.notMatch(r.json['detail'], /address of load-balancing endpoint/, `${what}: not named a load-balancing endpoint`);
  };
  await other('an id no endpoint has', `nosuchid.lb.localhost:${base.port}`, /: there is no endpoint nosuchid\b/);
  await other('another label in front of the id', `x.${lb.id}.lb.localhost:${base.port}`, new RegExp(`: there is no endpoint x\\.${lb.id} \\(an endpoint id is one label`));
  const queue = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json;
  await other("a queue endpoint's id", `${queue.id}.lb.localhost:${base.port}`, new RegExp(`: endpoint ${queue.id} is a queue endpoint, not a load-balancing one.*/v2/${queue.id}/run`));

  // flashd's own host names are served as before.
  for (const host of [new URL(a.url).host, `localhost:${base.port}`, `lb.localhost:${base.port}`, `x-lb.localhost:${base.port}`]) {
    const r = await viaHost(a.url, 'GET', '/healthz', host);
    t.equal(r.status, 200, `Host ${host}: /healthz answers`);
  }
  t.equal((await viaHost(a.url, 'GET', '/v2/serverless', new URL(a.url).host)).status, 200, 'the management API answers on its own host');
});

t.test('--endpoint-host without a port, and a --public-url host that falls under it', async (t) => {
  const a = await startAgent(t, { publicUrl: 'http://api.example.test:8000', endpointHost: 'Example.TEST' });
  const lb = (await a.req('POST', '/v2/serverless', { body: LB() })).json;
  // Written in lower case (the configuration lowers --endpoint-host).
  t.equal(lb.requestUrls.base, `http://${lb.id}.example.test`);
  for (const host of [`${lb.id}.example.test`, `${lb.id}.example.test:443`, `${lb.id}.EXAMPLE.test:8000`]) {
    const r = await viaHost(a.url, 'GET', '/healthz', host);
    t.equal(r.status, 404, `Host ${host}: 404`);
  }
  // The API's own host is not taken for an endpoint's, though it has the same form.
  t.equal((await viaHost(a.url, 'GET', '/healthz', 'api.example.test:8000')).status, 200, 'the --public-url host is served');
  t.equal((await viaHost(a.url, 'GET', '/healthz', 'API.example.test')).status, 200, 'in any case, with any port');
});

t.test("the load-balancing host's 404 cuts a long path and id like every other problem detail", async (t) => {
  const a = await startAgent(t);
  const port = new URL(a.url).port;
  const longPath = `/${'a'.repeat(100_000)}`;
  const byPath = await viaHost(a.url, 'GET', longPath, `x.lb.localhost:${port}`);
  t.equal(byPath.status, 404);
  t.ok(JSON.stringify(byPath.json).length < 1000, `a 100,000-character path: a short reply (${JSON.stringify(byPath.json).length} characters)`);
  t.match(byPath.json['detail'], `/${'a'.repeat(255)}… at`, 'the path is cut to 256 characters and marked');
  const longId = 'b'.repeat(3000);
  const byId = await viaHost(a.url, 'GET', '/x', `${longId}.lb.localhost:${port}`);
  t.equal(byId.status, 404);
  t.ok(JSON.stringify(byId.json).length < 1000, `a 3,000-character id in Host: a short reply (${JSON.stringify(byId.json).length} characters)`);
  t.notMatch(byId.json['detail'], 'b'.repeat(65), 'the id is cut to 64 characters wherever it is repeated');
});
