import t from 'tap';
import { execFile } from 'node:child_process';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { chmodSync, mkdirSync, statSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { networkInterfaces } from 'node:os';
import { assertProblem, startAgent, ADMIN_KEY, queueBody } from '../helpers/agent.js';
import { generateApiKey } from '../../src/auth/tokens.js';
import { testDataDir } from '../helpers/data-dir.js';

t.test('healthz answers without auth', async (t) => {
  const a = await startAgent(t);
  const r = await a.req('GET', '/healthz', { key: null });
  t.equal(r.status, 200);
  t.equal(r.json.status, 'ok');
});

t.test('unknown routes, wrong methods, bad JSON and wrong content type are problem+json', async (t) => {
  const a = await startAgent(t);
  assertProblem(t, await a.req('GET', '/nope/nothing'), 404);
  const m = await a.req('PUT', '/v2/serverless');
  assertProblem(t, m, 405);
  t.match(m.headers.get('allow'), /GET/);
  t.match(m.headers.get('allow'), /POST/);
  assertProblem(t, await a.req('POST', '/v2/serverless', { raw: '{"name": ', headers: { 'content-type': 'application/json' } }), 400);
  const ct = await a.req('POST', '/v2/serverless', { raw: JSON.stringify(queueBody()), headers: { 'content-type': 'text/plain' } });
  assertProblem(t, ct, 415);
  const none = await a.req('POST', '/v2/serverless', { raw: JSON.stringify(queueBody()) });
  assertProblem(t, none, 415, 'no content type is refused too');
  assertProblem(t, await a.req('POST', '/v2/serverless', { raw: '', headers: { 'content-type': 'application/json' } }), 400);
  t.equal((await a.req('POST', '/v2/serverless', { body: queueBody(), headers: { 'content-type': 'application/json; charset=utf-8' } })).status, 201);
});

t.test('a 500 is problem+json without a stack trace', async (t) => {
  const a = await startAgent(t);
  const created = await a.req('POST', '/v2/serverless', { body: queueBody() });
  // Corrupt the stored row so reading it throws inside the handler.
  a.agent.db.prepare('UPDATE endpoints SET data = ? WHERE id = ?').run('{not json', created.json.id);
  const r = await a.req('GET', `/v2/serverless/${created.json.id}`);
  assertProblem(t, r, 500);
  t.notMatch(r.text, /SyntaxError|at JSON|\.ts:|\.mjs:/);
  t.ok(a.logs.some((l) => l.includes('request failed')), 'the failure is logged');
});

function rawPost(url: string, path: string, headers: Record<string, string>, chunks: Buffer[]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = request({ host: u.hostname, port: u.port, path, method: 'POST', headers }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', (err) => ((err as NodeJS.ErrnoException).code === 'EPIPE' || (err as NodeJS.ErrnoException).code === 'ECONNRESET' ? undefined : reject(err)));
    for (const c of chunks) req.write(c);
    req.end();
  });
}

t.test('bodies over the limit get 413 before being buffered', async (t) => {
  const a = await startAgent(t, { maxBodyBytes: 4096 });
  const big = Buffer.alloc(10_000, 'a');
  const declared = await rawPost(a.url, '/v2/serverless', { 'content-type': 'application/json', authorization: `Bearer ${ADMIN_KEY}`, 'content-length': String(big.length) }, [big]);
  t.equal(declared.status, 413);
  t.equal(JSON.parse(declared.body).status, 413);
  const chunked = await rawPost(a.url, '/v2/serverless', { 'content-type': 'application/json', authorization: `Bearer ${ADMIN_KEY}`, 'transfer-encoding': 'chunked' }, [big.subarray(0, 3000), big.subarray(3000)]);
  t.equal(chunked.status, 413, 'chunked bodies are counted as they arrive');
  const ok = await a.req('POST', '/v2/serverless', { body: queueBody() });
  t.equal(ok.status, 201, 'the server still works');
});

// What requests (and so the runpod SDK) does: send the whole body, then read the answer.
const PY_POST = `
import http.client, json, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
body = b'{"input": "' + b'a' * int(sys.argv[3]) + b'"}'
try:
    headers = {'content-type': 'application/json', 'authorization': sys.argv[2]}
    if len(sys.argv) > 4:
        headers['expect'] = '100-continue'  # uWS answers 100 Continue itself: the body follows
    c.request('POST', u.path, body=body, headers=headers)
    r = c.getresponse()
    print(json.dumps({'status': r.status, 'type': r.getheader('content-type'), 'body': r.read().decode()}))
except Exception as e:
    print(json.dumps({'error': type(e).__name__ + ': ' + str(e)}))
`;

t.test('a client that sends its whole body before reading gets the 413, not a broken pipe', async (t) => {
  const a = await startAgent(t, { maxBodyBytes: 4096 });
  const post = (path: string, bytes: number, expect = false) => new Promise<Record<string, unknown>>((resolve, reject) => {
    execFile('python3', ['-c', PY_POST, `${a.url}${path}`, ADMIN_KEY, String(bytes), ...(expect ? ['expect'] : [])], (err, stdout) => (err ? reject(err) : resolve(JSON.parse(stdout))));
  });
  const mgmt = await post('/v2/serverless', 4 * 1024 * 1024);
  t.equal(mgmt.status, 413, JSON.stringify(mgmt).slice(0, 300));
  t.equal(mgmt.type, 'application/problem+json');
  t.match(JSON.parse(mgmt.body as string), { status: 413, detail: /4096 bytes/ });
  const expect = await post('/v2/serverless', 4 * 1024 * 1024, true);
  t.equal(expect.status, 413, `with Expect: 100-continue too: ${JSON.stringify(expect).slice(0, 300)}`);
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody() })).json.id as string;
  const run = await post(`/v2/${ep}/run`, 11 * 1024 * 1024);
  t.equal(run.status, 413, `/run over 10 MB: ${JSON.stringify(run).slice(0, 300)}`);
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json.jobs.inQueue, 0, 'nothing was queued');
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: { ok: 1 } } })).status, 200, 'the server still takes jobs');
});

t.test('first start creates an admin key, prints it once and saves it 0600', async (t) => {
  const dir = testDataDir(t);
  const first = await startAgent(t, { adminApiKey: null }, { dir });
  const file = join(dir, 'admin-api-key');
  const key = readFileSync(file, 'utf8').trim();
  t.match(key, /^fd_usr_[A-Za-z0-9]{36}$/);
  t.equal(statSync(file).mode & 0o777, 0o600);
  t.ok(first.logs.some((l) => l.includes(key)), 'printed on first start');
  t.equal((await first.req('GET', '/v2/serverless', { key })).status, 200, 'the key works');
  t.notOk(first.logs.slice(1).some((l) => l.includes(key) && !l.includes('First start')), 'not in the log lines');
  await first.agent.close();
  const second = await startAgent(t, { adminApiKey: null }, { dir });
  t.notOk(second.logs.some((l) => l.includes(key)), 'not printed again');
  t.equal(second.agent.generatedAdminKey, null);
  t.equal((await second.req('GET', '/v2/serverless', { key })).status, 200, 'still valid after restart');
  const db = readFileSync(join(dir, 'flashd.db'));
  t.equal(db.indexOf(Buffer.from(key)), -1, 'the key is not stored in clear');
});

t.test('the database files are owner-only even in a data directory made beforehand with mode 0755', async (t) => {
  const dir = join(testDataDir(t), 'var-lib-flashd');
  mkdirSync(dir);
  chmodSync(dir, 0o755);
  const files = ['flashd.db', 'flashd.db-wal', 'flashd.db-shm', 'secret.key'];
  const first = await startAgent(t, {}, { dir });
  t.same(files.map((f) => [f, statSync(join(dir, f)).mode & 0o777]), files.map((f) => [f, 0o600]), 'the session secret and key hashes are not readable by others');
  await first.agent.close();
  // A clean close removes the WAL; the next open makes it again.
  await startAgent(t, {}, { dir });
  t.same(files.map((f) => [f, statSync(join(dir, f)).mode & 0o777]), files.map((f) => [f, 0o600]), 'and after a restart');
});

t.test('FLASHD_ADMIN_API_KEY makes a key with exactly that value', async (t) => {
  const a = await startAgent(t, { adminApiKey: 'my-automation-key-0000000000' });
  t.equal((await a.req('GET', '/v2/serverless', { key: 'my-automation-key-0000000000' })).status, 200);
  t.equal((await a.req('GET', '/v2/serverless', { key: 'my-automation-key-0000000001' })).status, 401);
  t.equal(a.agent.generatedAdminKey, null, 'no other key generated');
});

t.test('a FLASHD_ADMIN_API_KEY that starts with fd_ but is not a flashd key stops the start, instead of a key no request can use', async (t) => {
  // Every request with such a key is refused as malformed (bad format or checksum) before any lookup.
  // The second has a generated key's shape with a wrong checksum.
  for (const value of ['fd_my-own-admin-passphrase-2026', `fd_usr_${'A'.repeat(36)}`]) {
    await t.rejects(startAgent(t, { adminApiKey: value }), /FLASHD_ADMIN_API_KEY starts with fd_ but is not a key flashd generated/, value);
  }
  const generated = generateApiKey('usr');
  const a = await startAgent(t, { adminApiKey: generated });
  t.equal((await a.req('GET', '/v2/serverless', { key: generated })).status, 200, 'a key flashd generated (another install\'s) may be chosen');
});

t.test('a restart keeps everything', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, {}, { dir });
  const created = await a.req('POST', '/v2/serverless', { body: queueBody({ name: 'persist-me' }) });
  t.equal(created.status, 201);
  await a.agent.close();
  const b = await startAgent(t, {}, { dir });
  const got = await b.req('GET', `/v2/serverless/${created.json.id}`);
  t.equal(got.status, 200);
  t.same({ ...got.json, requestUrls: undefined }, { ...created.json, requestUrls: undefined });
  t.equal(b.agent.db.pragma('journal_mode', { simple: true }), 'wal');
  t.equal(b.agent.db.pragma('synchronous', { simple: true }), 2, 'synchronous=FULL by default');
});

t.test('a second flashd on a port already in use fails to start instead of sharing it', async (t) => {
  // A fixed port: uWS sets SO_REUSEPORT only when the port is not 0.
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
  const a = await startAgent(t, { port });
  // uWS gives no errno: the cause is found again with Node's net and said, not guessed.
  await t.rejects(startAgent(t, { port }), { message: `cannot listen on 127.0.0.1:${port}: address already in use (another flashd or program listens there; pick --port)` });
  // The first one still answers every request (with SO_REUSEPORT the kernel would split them).
  for (let i = 0; i < 8; i++) t.equal((await a.req('GET', '/v2/serverless')).status, 200);
});

t.test('a --host that is not an address of this machine says so, not "address in use or not permitted"', async (t) => {
  // 192.0.2.1 is TEST-NET-1 (RFC 5737): on no machine's interfaces.
  await t.rejects(startAgent(t, { host: '192.0.2.1', port: 0 }), { message: 'cannot listen on 192.0.2.1:0: 192.0.2.1 is not an address of this machine (pick --host)' });
});

t.test('the listening line names the bind address: with 0.0.0.0 the url alone said 127.0.0.1', async (t) => {
  for (const host of ['0.0.0.0', '127.0.0.1']) {
    const a = await startAgent(t, { host });
    const line = a.logs.find((l) => l.includes('flashd listening')) ?? '';
    t.match(line, `host=${host}`, `${host}: the bind address`);
    t.match(line, `url=http://127.0.0.1:${a.agent.port}`, `${host}: and the local URL`);
    await a.agent.close();
  }
});

// CI containers may run without IPv6.
const ipv6Loopback = Object.values(networkInterfaces()).some((l) => l?.some((i) => i.address === '::1'));
t.test('the listening line writes an IPv6 address in brackets, as a URL must', { skip: !ipv6Loopback && 'no IPv6 loopback here' }, async (t) => {
  const a = await startAgent(t, { host: '::1' });
  const line = a.logs.find((l) => l.includes('flashd listening')) ?? '';
  t.match(line, `url=http://[::1]:${a.agent.port} `, 'the url is one a client can use');
  t.match(line, 'host=::1', 'the bind address as given');
  t.equal(a.agent.url, `http://[::1]:${a.agent.port}`, "and so is the agent's url");
});
