import t from 'tap';
import { connect } from 'node:net';
import { ADMIN_KEY, assertProblem, cpuBody, startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';

t.test('endpoint logs: tail, since, follow, and gone with the endpoint', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  for (let i = 0; i < 5; i++) a.agent.logs.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await new Promise((r) => setImmediate(r));
  const tail = (await a.req('GET', `/v2/serverless/${ep}/logs?limit=2`)).json;
  t.same(tail.map((l: { line: string }) => l.line), ['line 3', 'line 4'], 'the newest lines, oldest first');
  t.match(tail[0], { workerId: 'wkr_a', stream: 'stdout', at: /^\d{4}-/ });
  const since = (await a.req('GET', `/v2/serverless/${ep}/logs?since=${tail[0].seq}`)).json;
  t.same(since.map((l: { line: string }) => l.line), ['line 4']);
  const zero = await a.req('GET', `/v2/serverless/${ep}/logs?limit=0`);
  assertProblem(t, zero, 400);
  t.equal(zero.json.detail, '?limit: must be an integer from 1 to 10000.', 'the detail names the bad parameter only');
  const both = await a.req('GET', `/v2/serverless/${ep}/logs?limit=abc&since=-1`);
  t.same(both.json.errors, ['?since: must be a non-negative integer', '?limit: must be an integer from 1 to 10000'], 'each bad parameter named');
  t.equal(both.json.detail, '?since: must be a non-negative integer; ?limit: must be an integer from 1 to 10000.');
  // A misspelt follow must not quietly answer a snapshot to a caller that waits for a stream.
  // The error lists every value that is taken (1 and 0 are: follow=1 followed, follow=yes was told "true or false").
  for (const bad of ['yes', 'TRUE', '', '2']) {
    const r = await a.req('GET', `/v2/serverless/${ep}/logs?follow=${bad}`);
    assertProblem(t, r, 400);
    t.same(r.json.errors, ['?follow: must be true, false, 1 or 0'], `follow=${bad} refused`);
    t.equal(r.json.detail, '?follow: must be true, false, 1 or 0.');
  }
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?follow=false&limit=1`)).json.length, 1, 'follow=false: a snapshot');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?follow=0&limit=1`)).json.length, 1, 'follow=0: a snapshot');
  const one = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=1&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.match(one.headers.get('content-type'), /ndjson/, 'follow=1: a follow');
  await one.body?.cancel();
  // Given twice, which one counts is a guess: refused, as ?wait and ?ttl are.
  const twice = await a.req('GET', `/v2/serverless/${ep}/logs?follow=true&follow=false&limit=1&limit=2`);
  assertProblem(t, twice, 400);
  t.same(twice.json.errors, ['?limit: was given 2 times; give it once', '?follow: was given 2 times; give it once'], 'a repeated parameter is named');

  const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /ndjson/);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const readUntil = async (pred: (s: string) => boolean) => {
    while (!pred(text)) {
      const { value, done } = await reader.read();
      if (done) return true;
      text += decoder.decode(value, { stream: true });
    }
    return false;
  };
  await readUntil((s) => s.includes('line 4'));
  a.agent.logs.append(ep, 'wkr_b', 'stderr', 'fresh line');
  await readUntil((s) => s.includes('fresh line'));
  const lines = text.trim().split('\n').map((l) => JSON.parse(l));
  t.same(lines.map((l) => l.line), ['line 4', 'fresh line'], 'the backlog, then new lines as they come');
  t.equal(lines[1].stream, 'stderr');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  t.equal(await readUntil(() => false), true, 'the stream ends when the endpoint is deleted');
  assertProblem(t, await a.req('GET', `/v2/serverless/${ep}/logs`), 404);
});

t.test('an unknown query parameter is refused, naming it and the ones the logs take; the job API stays lenient', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (let i = 0; i < 3; i++) a.agent.logs.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await new Promise((r) => setImmediate(r));
  // Docker's ?tail, a filter flashd does not have, a typo: each answered the default 500 lines with no hint.
  const cases: [string, string][] = [
    ['tail=100', '?tail: unknown parameter (for the last N lines, give ?limit=N); this route takes since, limit and follow'],
    ['stream=stderr', '?stream: unknown parameter; this route takes since, limit and follow'],
    ['limt=5', '?limt: unknown parameter; this route takes since, limit and follow'],
  ];
  for (const [query, error] of cases) {
    const r = await a.req('GET', `/v2/serverless/${ep}/logs?${query}`);
    assertProblem(t, r, 400);
    t.same(r.json.errors, [error], `?${query} refused`);
    t.equal(r.json.detail, `${error}.`);
  }
  // Named with the other errors, each once, however often given; a name that is no plain word is quoted.
  const mixed = await a.req('GET', `/v2/serverless/${ep}/logs?limit=0&tail=1&tail=2&a%0Ab=1`);
  assertProblem(t, mixed, 400);
  t.same(mixed.json.errors, [
    '?limit: must be an integer from 1 to 10000',
    '?tail: unknown parameter (for the last N lines, give ?limit=N); this route takes since, limit and follow',
    '?"a\\nb": unknown parameter; this route takes since, limit and follow',
  ]);
  const many = await a.req('GET', `/v2/serverless/${ep}/logs?${['a', 'b', 'c', 'd', 'e', 'f', 'g'].map((n) => `${n}=1`).join('&')}`);
  t.same(many.json.errors.slice(4), ['?e: unknown parameter; this route takes since, limit and follow', '2 more unknown parameters; this route takes since, limit and follow'], 'five named, the rest counted');
  // A follow with a stray parameter does not open a stream.
  const stray = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&lines=10`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(stray.status, 400, 'a follow with ?lines: 400');
  t.match(stray.headers.get('content-type'), /^application\/problem\+json/);
  await stray.body?.cancel();
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?since=0&limit=2&follow=false`)).json.length, 2, 'the three it takes still work');
  // Not the endpoint's: 404 first, as with a bad ?limit.
  assertProblem(t, await a.req('GET', '/v2/serverless/no-such-endpoint/logs?tail=1'), 404);
  // RunPod clients may send parameters flashd does not know to the queue job API: ignored there.
  const run = await a.req('POST', `/v2/${ep}/run?priority=high`, { body: { input: {} } });
  t.equal(run.status, 200, 'run ignores an unknown parameter');
  t.equal((await a.req('GET', `/v2/${ep}/status/${run.json.id}?verbose=1`)).status, 200, 'status ignores one');
  t.equal((await a.req('GET', `/v2/${ep}/health?x=1`)).status, 200, 'health ignores one');
  // The document says which routes refuse them.
  const doc = (await a.req('GET', '/v2/openapi.json', { key: null })).json;
  t.match(doc.paths['/v2/serverless/{endpointId}/logs'].get.responses['400'].description, /query parameter other than since, limit, follow/);
});

t.test('a read with ?since past lines already deleted says so (X-Logs-Dropped-Through), also after a restart', async (t) => {
  // flashd keeps the newest 10,000 lines of an endpoint, trimming every 1,000 appended: the
  // 11,000th line drops the oldest 1,000. seq is global (every endpoint's lines share it), so a
  // client cannot tell a gap from lines deleted; without a word it just missed them.
  const dir = testDataDir(t);
  const a = await startAgent(t, {}, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  hub.append(ep, 'wkr_a', 'stdout', 'line 0');
  await a.agent.queue.durable();
  const first = hub.read(ep, undefined, 1)[0]!.seq;
  const untrimmed = await a.req('GET', `/v2/serverless/${ep}/logs?since=${first}&limit=1`);
  t.equal(untrimmed.headers.get('x-logs-dropped-through'), null, 'nothing deleted yet: no header');
  for (let i = 1; i < 11_000; i++) hub.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await a.agent.queue.durable();
  const through = String(first + 999);

  const behind = await a.req('GET', `/v2/serverless/${ep}/logs?since=${first}&limit=1`);
  t.equal(behind.headers.get('x-logs-dropped-through'), through, 'a client whose last line was line 0: lines up to line 999 are gone');
  t.same(behind.json.map((l: { line: string }) => l.line), ['line 1000'], 'it gets the oldest line kept');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?since=0&limit=1`)).headers.get('x-logs-dropped-through'), through, 'since=0 too');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?since=${first + 998}&limit=1`)).headers.get('x-logs-dropped-through'), through, 'one line missed is missed');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?since=${through}&limit=1`)).headers.get('x-logs-dropped-through'), null, 'a client that had every deleted line missed nothing');
  t.equal((await a.req('GET', `/v2/serverless/${ep}/logs?limit=1`)).headers.get('x-logs-dropped-through'), null, 'a tail read asks for no earlier line');
  const follow = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&since=${first}&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(follow.headers.get('x-logs-dropped-through'), through, 'a follow from there says so too');
  await follow.body?.cancel();
  const doc = (await a.req('GET', '/v2/openapi.json')).json;
  t.ok(doc.paths['/v2/serverless/{endpointId}/logs'].get.responses['200'].headers['X-Logs-Dropped-Through'], 'in the OpenAPI document');

  await a.agent.close();
  const b = await startAgent(t, {}, { dir });
  t.equal((await b.req('GET', `/v2/serverless/${ep}/logs?since=${first}&limit=1`)).headers.get('x-logs-dropped-through'), through, 'kept across a restart');
  t.equal((await b.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  t.equal(b.agent.db.prepare('SELECT COUNT(*) FROM endpoint_logs_pruned').pluck().get(), 0, 'gone with the endpoint');
});

t.test('an endpoint that prints fewer than 1,000 lines between restarts is still trimmed to 10,000 lines', async (t) => {
  // The count that trims every 1,000 lines starts at 0 at each start: nightly restarts, or an
  // endpoint that prints little, and its lines grew for good.
  const dir = testDataDir(t);
  const a = await startAgent(t, {}, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  for (let i = 0; i < 10_500; i++) a.agent.logs.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await a.agent.queue.durable();
  const count = (db: typeof a.agent.db): unknown => db.prepare('SELECT COUNT(*) FROM endpoint_logs WHERE endpoint_id = ?').pluck().get(ep);
  t.equal(count(a.agent.db), 10_500, 'trimmed every 1,000 lines: 10,500 kept until the 11,000th');
  const line500 = a.agent.logs.read(ep, undefined, 10_000)[0]!;
  t.equal(line500.line, 'line 500');
  await a.agent.close();

  const b = await startAgent(t, {}, { dir });
  b.agent.logs.append(ep, 'wkr_a', 'stdout', 'after the restart');
  await b.agent.queue.durable();
  t.equal(count(b.agent.db), 10_000, 'the first line after a restart trims to the newest 10,000');
  t.equal(b.agent.logs.read(ep, 0, 1)[0]!.line, 'line 501', 'the oldest kept');
  const behind = await b.req('GET', `/v2/serverless/${ep}/logs?since=0&limit=1`);
  t.equal(behind.headers.get('x-logs-dropped-through'), String(line500.seq), 'and the trim is noted: lines up to line 500 are gone');
});

t.test('following hands over from the snapshot to the stream without losing or repeating a line', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  hub.append(ep, 'wkr_a', 'stdout', 'committed');
  await a.agent.queue.durable();
  hub.append(ep, 'wkr_a', 'stdout', 'pending'); // appended, not committed yet
  const snapshot = hub.read(ep, undefined, 10);
  t.same(snapshot.map((l) => l.line), ['committed'], 'a read does not see the pending line');
  const got: string[] = [];
  const off = hub.follow(ep, snapshot[snapshot.length - 1]!.seq, (l) => got.push(l.line), () => undefined);
  hub.append(ep, 'wkr_a', 'stdout', 'after');
  await a.agent.queue.durable();
  await new Promise((r) => setImmediate(r));
  t.same(got, ['pending', 'after'], 'the pending line comes through the stream, once, in order');
  off();

  // The same over HTTP, with a worker printing all the time: every follow sees a contiguous run.
  let n = 0;
  const timer = setInterval(() => hub.append(ep, 'wkr_b', 'stdout', `n=${n++}`), 1);
  t.teardown(() => clearInterval(timer));
  for (let round = 0; round < 15; round++) {
    const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=3`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    while (text.split('\n').length < 40) text += decoder.decode((await reader.read()).value, { stream: true });
    await reader.cancel();
    const nums = text.split('\n').slice(0, 39).map((l) => JSON.parse(l).line as string).filter((l) => l.startsWith('n=')).map((l) => Number(l.slice(2)));
    const gaps = nums.slice(1).filter((v, i) => v !== (nums[i] as number) + 1);
    if (gaps.length) t.fail(`round ${round}: not contiguous: ${nums.join(',')}`);
  }
  t.pass('15 follows, each contiguous');
});

t.test('a follow stream ends cleanly when flashd stops (a complete response, not a cut one)', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  a.agent.logs.append(ep, 'wkr_a', 'stdout', 'before stop');
  const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('before stop')) text += decoder.decode((await reader.read()).value, { stream: true });
  const closing = a.agent.close();
  // A cut chunked response makes the reader throw ("terminated"); an ended one reports done.
  let ended = false;
  for (;;) {
    const { done } = await reader.read();
    if (done) {
      ended = true;
      break;
    }
  }
  await closing;
  t.ok(ended, 'the stream reached its end');
});

t.test('lines appended just before flashd stops reach followers before their streams end', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  const got: string[] = [];
  const ended = new Promise<void>((resolve) => hub.follow(ep, 0, (l) => got.push(l.line), resolve));
  await a.agent.queue.durable();
  // What a worker stopped during shutdown leaves: its last output and the exit line, then close().
  hub.append(ep, 'wkr_a', 'stdout', 'last words');
  hub.append(ep, 'wkr_a', 'system', 'worker wkr_a stopped (signal SIGKILL)');
  hub.close();
  await ended;
  t.same(got, ['last words', 'worker wkr_a stopped (signal SIGKILL)'], 'none lost');
});

t.test('a follow stream ends when the key that opened it is revoked or expires', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  for (const how of ['revoked', 'expired'] as const) {
    a.agent.logs.append(ep, 'wkr_a', 'stdout', `before ${how}`);
    await a.agent.queue.durable();
    const made = (await a.req('POST', '/v2/api-keys', { body: { name: how, scopes: ['endpoints:read'], ...(how === 'expired' ? { expiresAt: new Date(Date.now() + 1500).toISOString() } : {}) } })).json;
    const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { headers: { authorization: made.key } });
    t.equal(res.status, 200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    const readUntil = async (pred: (s: string) => boolean) => {
      while (!pred(text)) {
        const { value, done } = await reader.read();
        if (done) return true;
        text += decoder.decode(value, { stream: true });
      }
      return false;
    };
    await readUntil((s) => s.includes(`before ${how}`));
    if (how === 'revoked') t.equal((await a.req('DELETE', `/v2/api-keys/${made.id}`)).status, 204);
    else await new Promise((r) => setTimeout(r, 1600));
    a.agent.logs.append(ep, 'wkr_a', 'stdout', `after ${how}`);
    const ended = await Promise.race([readUntil(() => false), new Promise<string>((r) => setTimeout(() => r('timeout'), 3000))]);
    t.equal(ended, true, `the stream ends once the key is ${how}`);
    t.notMatch(text, `after ${how}`, `no line after the key was ${how}`);
  }
});

t.test('a follow with no line yet sends its status line and whole header block at once', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const port = new URL(a.url).port;
  const socket = connect(Number(port), '127.0.0.1');
  t.teardown(() => void socket.destroy());
  let got = '';
  socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
  socket.write(`GET /v2/serverless/${ep}/logs?follow=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n\r\n`);
  // No line exists and none is appended: the header block must still be complete.
  const deadline = Date.now() + 2000;
  while (!got.includes('\r\n\r\n') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  const end = got.indexOf('\r\n\r\n');
  t.ok(end > 0, `the header block ends before any line exists (got ${JSON.stringify(got.slice(0, 80))}…)`);
  const head = got.slice(0, end).toLowerCase();
  t.match(head, /^http\/1\.1 200 ok\r\n/);
  t.match(head, /\r\ncontent-type: application\/x-ndjson/);
  t.match(head, /\r\ntransfer-encoding: chunked/);

  // Then a line, and the body holds only NDJSON lines and blank lines.
  a.agent.logs.append(ep, 'wkr_a', 'stdout', 'first');
  while (!got.includes('first') && Date.now() < deadline + 3000) await new Promise((r) => setTimeout(r, 20));
  const body = got.slice(end + 4).replace(/(^|\r\n)[0-9a-f]+\r\n/g, '$1').replace(/\r\n/g, '');
  const lines = body.split('\n').filter((l) => l !== '');
  t.same(lines.map((l) => JSON.parse(l).line), ['first'], 'the first line follows on the same response');
});

t.test('with no worker runtime, jobs that wait with no worker up are explained once in the endpoint log', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 2, idleTimeout: 5 } }) })).json.id as string;
  const said = async () => ((await a.req('GET', `/v2/serverless/${ep}/logs`)).json as { line: string; stream: string; workerId: string | null }[])
    .filter((l) => l.line.includes('flashd starts no workers'));
  t.same(await said(), [], 'nothing before a job waits');
  for (let i = 0; i < 2; i++) t.equal((await a.req('POST', `/v2/${ep}/run`, { body: { input: { i } } })).status, 200);
  let lines = await said();
  for (let i = 0; i < 60 && lines.length === 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    lines = await said();
  }
  t.equal(lines.length, 1, 'said once the jobs wait');
  t.match(lines[0], { stream: 'system', workerId: null });
  t.equal(lines[0]?.line, `no worker can start: flashd starts no workers (--runtime none); start one yourself with \`flashd worker-env ${ep}\`; jobs wait in the queue (throttled)`);
  // The loop decides every second: it is not said again while the reason holds.
  await new Promise((r) => setTimeout(r, 2200));
  t.equal((await said()).length, 1, 'not repeated at each decision');
});

t.test('a read cut short by the 16 MiB cap says so (X-Logs-Truncated), so a pager does not stop early', async (t) => {
  // 1,100 lines of 16 KB is about 17.6 MiB: ?limit=2000 gets the newest 1,024 and used to say
  // nothing, and a pager reading on with ?since until a page holds fewer than `limit` lines
  // stopped after its first page, as if the log ended there.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  for (let i = 0; i < 1100; i++) hub.append(ep, 'wkr_a', 'stdout', `big ${String(i).padStart(5, '0')} `.padEnd(16_384, 'B'));
  await a.agent.queue.durable();
  const url = `/v2/serverless/${ep}/logs`;

  const tail = await a.req('GET', `${url}?limit=2000`);
  t.equal(tail.status, 200);
  t.equal(tail.json.length, 1024, 'the newest lines that fit in 16 MiB');
  t.equal(tail.json[0].line.slice(0, 9), 'big 00076', 'older lines are left out');
  t.equal(tail.headers.get('x-logs-truncated'), 'true', 'a tail read cut by the cap says so');

  const first = await a.req('GET', `${url}?since=0&limit=2000`);
  t.equal(first.json.length, 1024);
  t.equal(first.headers.get('x-logs-truncated'), 'true', 'a read with ?since cut by the cap says so');
  const last = first.json[first.json.length - 1].seq as number;
  const rest = await a.req('GET', `${url}?since=${last}&limit=2000`);
  t.equal(rest.json.length, 76, 'the rest, read on with ?since');
  t.equal(rest.headers.get('x-logs-truncated'), null, 'not cut: no header');

  t.equal((await a.req('GET', `${url}?limit=1000`)).headers.get('x-logs-truncated'), null, 'cut by ?limit, not the cap: no header');
  t.equal((await a.req('GET', `${url}?limit=1024`)).headers.get('x-logs-truncated'), null, 'exactly what fits: no header');
  const doc = (await a.req('GET', '/v2/openapi.json')).json;
  t.ok(doc.paths['/v2/serverless/{endpointId}/logs'].get.responses['200'].headers['X-Logs-Truncated'], 'in the OpenAPI document');

  // A follow from the tail leaves the older lines out too; one from ?since sends them all.
  const follow = await fetch(`${a.url}${url}?follow=true&limit=2000`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(follow.headers.get('x-logs-truncated'), 'true', 'a follow from the tail says so');
  await follow.body?.cancel();
  const followSince = await fetch(`${a.url}${url}?follow=true&since=0&limit=2000`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(followSince.headers.get('x-logs-truncated'), null, 'a follow from ?since goes on past the cap: no header');
  await followSince.body?.cancel();
});

t.test('the 16 MiB cap counts the bytes a line costs in the reply, escapes included, not its characters', async (t) => {
  // A NUL is one character and six bytes in JSON (\u0000), invalid UTF-8 shows as U+FFFD (three
  // bytes): 300 such lines of 16 KB are 4.9 M characters, well under the cap counted in
  // characters, and were sent whole as a 24.6 MB reply (10,000 of them: about 96 MiB, held in
  // memory until the client read it).
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  for (let i = 0; i < 300; i++) hub.append(ep, 'wkr_a', 'stdout', `${i} `.padEnd(16_384, i % 3 === 2 ? '\ufffd' : '\u0000'));
  await a.agent.queue.durable();
  const url = `/v2/serverless/${ep}/logs`;
  const cap = 16 * 1024 * 1024;
  // Each line's own members (seq, at, workerId, stream) and the array's punctuation: under 200 bytes.
  const within = (lines: number) => cap + lines * 200;

  const tail = await a.req('GET', `${url}?limit=10000`);
  t.equal(tail.status, 200);
  const tailBytes = Buffer.byteLength(tail.text);
  t.ok(tailBytes <= within(tail.json.length), `the reply is ${(tailBytes / 1048576).toFixed(1)} MiB, within the 16 MiB cap`);
  t.ok(tail.json.length < 300 && tail.json.length > 150, `the newest lines that fit: ${tail.json.length}`);
  t.equal(tail.json[tail.json.length - 1].line.split(' ')[0], '299', 'the newest line is in it');
  t.equal(tail.headers.get('x-logs-truncated'), 'true', 'a tail read cut by the cap says so');

  // A pager reading on with ?since gets every line, each page within the cap.
  const seen: string[] = [];
  let since = 0;
  let pages = 0;
  for (;;) {
    const page = await a.req('GET', `${url}?since=${since}&limit=10000`);
    pages++;
    t.ok(Buffer.byteLength(page.text) <= within(page.json.length), `page ${pages}: ${(Buffer.byteLength(page.text) / 1048576).toFixed(1)} MiB`);
    for (const l of page.json) seen.push(l.line.split(' ')[0]);
    if (page.headers.get('x-logs-truncated') !== 'true') break;
    since = page.json[page.json.length - 1].seq;
  }
  t.equal(pages, 2, 'two pages');
  t.same(seen, Array.from({ length: 300 }, (_, i) => String(i)), 'every line once, in order');

  // A follow's snapshot is cut by the same count, and says so.
  const follow = await fetch(`${a.url}${url}?follow=true&limit=10000`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(follow.headers.get('x-logs-truncated'), 'true', 'a follow from the tail says so');
  await follow.body?.cancel();
});

t.test('a follow of a quiet endpoint ends when the key that opened it is revoked or expires, with no new line', async (t) => {
  // The key was checked only at each new line: on an endpoint that printed nothing more, a
  // follow opened with a key since revoked (a leaked key deleted) or expired stayed open for good.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  a.agent.logs.append(ep, 'wkr_a', 'stdout', 'the only line');
  await a.agent.queue.durable();
  for (const how of ['revoked', 'expired'] as const) {
    const made = (await a.req('POST', '/v2/api-keys', { body: { name: how, scopes: ['endpoints:read'], ...(how === 'expired' ? { expiresAt: new Date(Date.now() + 1500).toISOString() } : {}) } })).json;
    const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { headers: { authorization: made.key } });
    t.equal(res.status, 200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    const readToEnd = async (): Promise<true> => {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return true;
        text += decoder.decode(value, { stream: true });
      }
    };
    const ended = readToEnd();
    if (how === 'revoked') t.equal((await a.req('DELETE', `/v2/api-keys/${made.id}`)).status, 204);
    const started = Date.now();
    const result = await Promise.race([ended, new Promise<string>((r) => setTimeout(() => r('still open'), 8000))]);
    t.equal(result, true, `the stream ends once the key is ${how}, though no line came`);
    t.ok(Date.now() - started < 8000, `within seconds (${Date.now() - started} ms)`);
    t.match(text, 'the only line');
    if (result !== true) await reader.cancel();
  }
});

t.test('a follow from far back gets every kept line before the live ones, none skipped', async (t) => {
  // flashd keeps up to 10,999 lines (trimmed to 10,000 every 1,000), but the catch-up from a
  // follow's snapshot to its first live line stopped at 10,000 lines: `?follow=true&since=0`
  // on a full log skipped the rest without a word and went on with the next new line.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  const hub = a.agent.logs;
  for (let i = 0; i < 10_500; i++) hub.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await a.agent.queue.durable();
  const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&since=0&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const readUntil = async (needle: string): Promise<boolean> => {
    const deadline = Date.now() + 20_000;
    while (!text.includes(needle) && Date.now() < deadline) {
      const { value, done } = await Promise.race([reader.read(), new Promise<{ value: undefined; done: false }>((r) => setTimeout(() => r({ value: undefined, done: false }), 500))]);
      if (done) return false;
      if (value) text += decoder.decode(value, { stream: true });
    }
    return text.includes(needle);
  };
  // Nothing more comes from the catch-up; a new line then shows what was sent before it.
  await readUntil('"line 10000"');
  await new Promise((r) => setTimeout(r, 500));
  hub.append(ep, 'wkr_a', 'stdout', 'fresh');
  t.ok(await readUntil('"fresh"'), 'the new line arrives');
  await reader.cancel();
  const lines = text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l).line as string);
  t.equal(lines.length, 10_501, 'every kept line, then the new one');
  t.equal(lines[10_499], 'line 10499', 'the last kept line before the new one');
  t.equal(lines[10_500], 'fresh');
});

t.test('a quiet follow sends an empty line every 15 s, so a proxy in front does not cut it for idleness', async (t) => {
  // Nothing was written while the endpoint printed nothing: behind nginx (proxy_read_timeout
  // 60 s by default, the TLS proxy the README suggests) or a load balancer, a follow of an idle
  // endpoint was cut after a minute, and a client gone without a word held its follow for good.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  a.agent.logs.append(ep, 'wkr_a', 'stdout', 'the only line');
  await a.agent.queue.durable();
  const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('the only line\"}\n')) text += decoder.decode((await reader.read()).value, { stream: true });
  const started = Date.now();
  const next = await Promise.race([reader.read(), new Promise<'nothing'>((r) => setTimeout(() => r('nothing'), 20_000))]);
  t.not(next, 'nothing', `something within 20 s (${Date.now() - started} ms)`);
  if (next !== 'nothing') {
    t.equal(decoder.decode(next.value), '\n', 'an empty line, which readers skip');
    t.ok(Date.now() - started >= 14_000, 'not before 15 s of quiet');
  }
  await reader.cancel();
});
