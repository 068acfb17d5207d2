/**
 * Webhook targets that are loopback, private or link-local by their spelling alone (an IP
 * address in any form, `localhost`) are refused at submit with a 400 unless the operator
 * allowed private targets; names are judged again at connect time, as are URLs stored before.
 */
import t from 'tap';
import { createServer } from 'node:http';
import { startAgent, assertProblem, cpuBody } from '../helpers/agent.js';
import { WebhookSender } from '../../src/queue/webhook.js';
import { createLogger } from '../../src/core/logger.js';
import { until } from '../helpers/wait.js';

const SPELLINGS = [
  '127.0.0.1', '127.1', '2130706433', '0x7f000001', '0177.0.0.1', '0', '[::1]', '[::]', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]',
  '[0:0:0:0:0:ffff:7f00:1]', '169.254.169.254', '[::ffff:10.0.0.1]', '10.0.0.1', '192.168.1.1', 'localhost', 'LOCALHOST', 'a.localhost', 'localhost.',
];

t.test('a private target written as an address or as localhost is refused at submit', async (t) => {
  const a = await startAgent(t, {});
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (const host of SPELLINGS) {
    for (const path of ['run', 'runsync']) {
      const r = await a.req('POST', `/v2/${ep}/${path}${path === 'runsync' ? '?wait=1000' : ''}`, { body: { input: {}, webhook: `http://${host}:9/hook` } });
      assertProblem(t, r, 400, `${host} (${path}): ${r.status}`);
      t.match(r.json?.detail, /private/, 'the detail says why');
      t.match(r.json?.errors, [/^\/webhook: /], 'the errors name the member');
    }
  }
  // A public address and a name pass; so does a private one when allowed.
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: 'http://93.184.216.34/hook' } })).status, 200);
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: 'https://hooks.example.com/x' } })).status, 200);
  const open = await startAgent(t, { webhookAllowPrivate: true });
  const ep2 = (await open.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  t.equal((await open.req('POST', `/v2/${ep2}/run`, { body: { input: {}, webhook: 'http://127.0.0.1:9/hook' } })).status, 200);
});

t.test('at connect time every spelling is refused too (URLs stored before, names)', async (t) => {
  let hits = 0;
  const canary = createServer((req, res) => {
    hits++;
    req.resume();
    res.end();
  });
  await new Promise<void>((resolve) => canary.listen(0, '127.0.0.1', resolve));
  t.teardown(() => canary.close());
  const port = (canary.address() as { port: number }).port;
  const settled: string[] = [];
  const lines: string[] = [];
  const w = new WebhookSender({
    allowPrivate: false, retryDelayMs: 0, attempts: 1, timeoutMs: 1000, deadlineMs: 2000, maxInFlight: 64, maxInFlightPerHost: 32,
    log: createLogger({ level: 'warn', sink: { write: (line) => lines.push(line) } }),
    bodyOf: () => '{}',
    onSettled: (jobId) => settled.push(jobId),
  });
  t.teardown(() => w.close());
  const hosts = SPELLINGS.filter((h) => h !== 'localhost.' && h !== 'a.localhost');
  for (const host of hosts) w.send(`http://${host}:${port}/hook`, host);
  await until('every delivery to end', async () => settled.length === hosts.length, 5000);
  t.equal(hits, 0, 'the loopback canary saw nothing');
  t.equal(lines.filter((l) => l.includes('refused private address')).length, hosts.length, 'each refused as private');
});

t.test('a failure no try can change gives up at the first try with one log line; port 0 is refused at submit', async (t) => {
  const hits: string[] = [];
  const receiver = createServer((req, res) => {
    hits.push(req.url ?? '');
    req.resume();
    res.writeHead(req.url === '/moved' ? 302 : 500, { location: 'https://elsewhere.example/' }).end();
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  t.teardown(() => receiver.close());
  const port = (receiver.address() as { port: number }).port;
  const settled: string[] = [];
  const lines: string[] = [];
  const sender = (allowPrivate: boolean) => new WebhookSender({
    allowPrivate, retryDelayMs: 10, attempts: 3, timeoutMs: 1000, deadlineMs: 2000, maxInFlight: 64, maxInFlightPerHost: 32,
    log: createLogger({ level: 'info', sink: { write: (line) => lines.push(line) } }),
    bodyOf: () => '{}',
    onSettled: (jobId) => settled.push(jobId),
  });
  const strict = sender(false);
  const open = sender(true);
  t.teardown(() => strict.close());
  t.teardown(() => open.close());
  strict.send(`http://localhost:${port}/private`, 'private');
  open.send(`http://127.0.0.1:${port}/moved`, 'moved');
  open.send(`http://127.0.0.1:${port}/failing`, 'failing');
  await until('every delivery to end', async () => settled.length === 3, 5000);
  t.same(hits.filter((h) => h === '/moved'), ['/moved'], 'a 3xx is asked once');
  t.same(hits.filter((h) => h === '/failing'), ['/failing', '/failing', '/failing'], 'a 500 may pass: it gets its 3 tries');
  const of = (job: string) => lines.filter((l) => l.includes(job));
  t.equal(of('private').length, 1, `the refused address: one line: ${of('private').join('\n')}`);
  t.match(of('private')[0], /webhook gave up.*refused private address 127\.0\.0\.1 \(this server was started without --webhook-allow-private\): no other try can change that/);
  t.equal(of('moved').length, 1, `the 3xx: one line: ${of('moved').join('\n')}`);
  t.match(of('moved')[0], /webhook gave up.*status 302, a redirect, which is not followed: no other try can change that/);
  t.equal(of('failing').length, 3, 'a 500: two "trying again" lines, then "gave up"');

  const a = await startAgent(t, {});
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (const webhook of ['http://example.com:0/hook', 'https://example.com:00/hook']) {
    const r = await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook } });
    assertProblem(t, r, 400, `${webhook}: ${r.status}`);
    t.same(r.json?.errors, ['/webhook: webhook must not use port 0']);
  }
  t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: {}, webhook: 'http://example.com:8080/hook' } })).status, 200, 'another port passes');
});
