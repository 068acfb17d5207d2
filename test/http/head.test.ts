/**
 * HEAD is answered like GET without the body (RFC 9110 §9.3.2): its reply carries the GET's
 * status, headers and Content-Length, and no body bytes, so the next response on a kept-alive
 * connection starts where the client expects it.
 */
import t from 'tap';
import { connect } from 'node:net';
import { Agent, request } from 'node:http';
import { ADMIN_KEY, cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

/** Writes `raw` and collects what comes back for `ms`. */
function collect(port: number, raw: string, ms = 500): Promise<string> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => undefined);
    s.on('connect', () => s.write(raw));
    setTimeout(() => {
      s.destroy();
      resolve(got);
    }, ms);
  });
}

t.test('HEAD replies carry no body, and the connection stays usable', async (t) => {
  const a = await startAgent(t);
  const port = Number(new URL(a.url).port);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const auth = `Authorization: Bearer ${ADMIN_KEY}\r\n`;
  const get = await a.req('GET', '/healthz');
  for (const [what, path] of [['a 200', '/healthz'], ['a 404 problem', '/nope'], ['a log follow', `/v2/serverless/${ep}/logs?follow=true`], ['a list', '/v2/serverless']]) {
    const got = await collect(port, `HEAD ${path} HTTP/1.1\r\nHost: x\r\n${auth}\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`);
    const head = got.slice(0, got.indexOf('\r\n\r\n') + 4);
    const rest = got.slice(head.length);
    t.match(head, /^HTTP\/1\.1 \d{3} /, `${what}: a status line`);
    t.match(rest, /^HTTP\/1\.1 200 OK\r\n/, `${what}: the next response follows the HEAD head directly (got ${JSON.stringify(rest.slice(0, 60))})`);
    t.ok(rest.endsWith(get.text), `${what}: and is whole`);
  }
  const headHealth = await collect(port, 'HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
  t.match(headHealth.toLowerCase(), new RegExp(`\\r\\ncontent-length: ${Buffer.byteLength(get.text)}\\r\\n`), 'Content-Length is the GET body\'s');

  // Node's own client with a kept-alive connection: a body after a HEAD reply was a parse error.
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  t.teardown(() => agent.destroy());
  const one = (method: string) => new Promise<string>((resolve) => {
    const r = request({ host: '127.0.0.1', port, path: '/healthz', method, agent }, (res) => {
      let b = '';
      res.on('data', (d: Buffer) => (b += d.toString()));
      res.on('end', () => resolve(`${res.statusCode} ${b}`));
    });
    r.on('error', (err) => resolve(`error ${err.message}`));
    r.end();
  });
  t.same([await one('HEAD'), await one('GET'), await one('HEAD'), await one('GET')], ['200 ', `200 ${get.text}`, '200 ', `200 ${get.text}`]);
});

t.test('HEAD on a GET that changes state gets 405 and changes nothing: no chunk, job or key is handed out', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const port = Number(new URL(a.url).port);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal(await w.stream(id, 'c1'), 200);
  const queued = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } })).json.id as string;
  const keyRows = (): number => a.agent.db.prepare('SELECT count(*) FROM api_keys').pluck().get() as number;
  const keys = keyRows();

  const head = async (path: string, key = ADMIN_KEY): Promise<string> =>
    collect(port, `HEAD ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`);
  const cases: [string, string, string][] = [
    [`/v2/${ep}/stream/${id}`, 'GET, POST', 'chunks'],
    [`/v2/${ep}/job-take/${w.workerId}`, 'GET', 'a job'],
    [`/v2/${ep}/job-take-batch/${w.workerId}?batch_size=4`, 'GET', 'jobs'],
    [`/v2/${ep}/job-stop/${w.workerId}`, 'GET', 'stop'],
    [`/v2/serverless/${ep}/worker-env`, 'GET', 'worker id and key'],
  ];
  for (const [path, allow, what] of cases) {
    const got = await head(path, path.includes('/job-') ? w.key : ADMIN_KEY);
    t.match(got, /^HTTP\/1\.1 405 /, `${path}: 405`);
    t.match(got.toLowerCase(), new RegExp(`\\r\\nallow: ${allow.toLowerCase()}\\r\\n`), `${path}: Allow: ${allow}`);
    t.notOk(got.includes(what) && got.includes('{'), `${path}: no body`);
  }
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'IN_PROGRESS', stream: [{ output: 'c1' }] }, 'the chunk is still there for a GET');
  t.equal((await a.req('GET', `/v2/${ep}/status/${queued}`)).json.status, 'IN_QUEUE', 'the queued job was handed to no one');
  t.equal(keyRows(), keys, 'no worker key was made');
  t.equal((await w.take())?.id, queued, 'a GET take still gets it');
  t.match(await head(`/v2/${ep}/status/${id}`), /^HTTP\/1\.1 200 /, 'HEAD on a GET without side effects is still answered');
});

t.test('a 405 lists HEAD in Allow wherever GET answers it, and not where HEAD is refused', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const cases: [string, string][] = [
    ['/healthz', 'GET, HEAD'],
    ['/v2/serverless', 'POST, GET, HEAD'],
    [`/v2/serverless/${ep}`, 'GET, PATCH, DELETE, HEAD'],
    [`/v2/${ep}/status/j1`, 'GET, POST, HEAD'],
    [`/v2/${ep}/run`, 'POST'],
    [`/v2/${ep}/stream/j1`, 'GET, POST'],
    [`/v2/serverless/${ep}/worker-env`, 'GET'],
  ];
  for (const [path, allow] of cases) {
    const r = await a.req('PUT', path, { body: {} });
    t.equal(r.status, 405, `${path}: 405`);
    t.equal(r.headers.get('allow'), allow, `${path}: Allow: ${allow}`);
    t.match(r.json.detail, `allowed: ${allow}.`, `${path}: the detail says the same`);
  }
});
