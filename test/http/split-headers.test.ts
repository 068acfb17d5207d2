/**
 * A request whose header block is over 4 KB and arrives in more than one read: the bundled
 * uWS v20.30 closed such a connection with no reply (its HttpParser keeps at most 4 KB between
 * reads); src/core/native.ts loads a copy patched to 128 KiB. runpod-python's ping lists every
 * job in progress in its query (~42 bytes a flashd job), so a worker with ~90+ jobs sends one,
 * and a real network splits it; at 16 KB (the earlier patch) a worker holding ~380 or more jobs
 * lost every lease.
 */
import t from 'tap';
import { connect } from 'node:net';
import { createHash } from 'node:crypto';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';
import { patchUwsAddon, UWS_ADDON } from '../../src/core/native.js';
import { queueBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });
// The patch exists for this build only (FLASHD_UWS_UNPATCHED=1 loads the binary as shipped: these tests then fail).
const skip = UWS_ADDON === 'uws_linux_x64_115.node' ? false : `no uWS patch for ${UWS_ADDON}`;

/** Sends `head` in two writes 50 ms apart (cut at `cut`, default the middle); resolves with the status line or '(closed)'. */
function splitRequest(port: number, head: string, cut = Math.floor(head.length / 2)): Promise<string> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.setNoDelay(true);
    let got = '';
    s.on('data', (d) => {
      got += d.toString();
      if (got.includes('\r\n')) {
        s.destroy();
        resolve(got.slice(0, got.indexOf('\r\n')));
      }
    });
    s.on('error', () => undefined);
    s.on('close', () => resolve(got ? got.split('\r\n')[0] as string : '(closed)'));
    s.on('connect', () => {
      s.write(head.slice(0, cut));
      setTimeout(() => s.write(head.slice(cut)), 50);
    });
  });
}

/** n job ids as runpod-python's ping query holds them: `<uuid>-u1`, comma-joined, the comma encoded (~42 bytes a job). */
const ids = (n: number) => Array.from({ length: n }, (_, i) => `${createHash('sha1').update(String(i)).digest('hex').slice(0, 36)}-u1`).join('%2C');

t.test('a header block over 4 KB split across reads is answered (up to 128 KiB)', { skip }, async (t) => {
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: () => ({ maxBodyBytes: 1024, handle: (req) => ({ status: 200, body: String(req.query.get('job_id')?.length ?? 0) }) }),
    onEarlyError: () => ({ status: 500 }),
  });
  const { port } = await server.listen();
  t.teardown(() => server.close());
  const req = (query: string) => `GET /v2/ep/ping/w1?job_id=${query}&runpod_version=1.12.0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`;
  t.equal(await splitRequest(port, req(ids(60))), 'HTTP/1.1 200 OK', '60 job ids (~2.6 KB): fine before and after');
  t.equal(await splitRequest(port, req(ids(150))), 'HTTP/1.1 200 OK', '150 job ids (~6.4 KB)');
  t.equal(await splitRequest(port, req(ids(300))), 'HTTP/1.1 200 OK', '300 job ids (~12.7 KB), worker-vllm\'s default concurrency');
  t.equal(await splitRequest(port, req(ids(300)), 20), 'HTTP/1.1 200 OK', 'cut inside the request line near its start');
  t.equal(await splitRequest(port, req(ids(400))), 'HTTP/1.1 200 OK', '400 job ids (~17 KB): closed at the earlier 16 KB');
  t.equal(await splitRequest(port, req(ids(1638))), 'HTTP/1.1 200 OK', '1,638 job ids (~69 KB): runpod-python\'s most (its 64 KB job-id mirror)');
  t.equal(await splitRequest(port, req(ids(3000)), 1448), 'HTTP/1.1 200 OK', '3,000 job ids (~126 KB), cut at one MSS');
  t.equal(await splitRequest(port, req(ids(3200).slice(0, 130_900))), 'HTTP/1.1 200 OK', 'just under 128 KiB');
  t.equal(await splitRequest(port, req(ids(3200))), '(closed)', 'over 128 KiB split: still refused (a bound, as Node has)');
});

t.test('a worker ping listing 200 jobs, cut at one MSS, is answered', { skip }, async (t) => {
  const a = await startAgent(t);
  const ep = await a.req('POST', '/v2/serverless', { body: queueBody({ name: 'split' }) });
  t.ok(ep.status < 300, `endpoint created (${ep.status} ${ep.text.slice(0, 200)})`);
  const env = await a.req('GET', `/v2/serverless/${ep.json.id}/worker-env`);
  t.equal(env.status, 200);
  const ping = new URL((env.json.env.RUNPOD_WEBHOOK_PING as string).replace('$RUNPOD_POD_ID', env.json.workerId));
  ping.searchParams.set('job_id', decodeURIComponent(ids(200)));
  ping.searchParams.set('runpod_version', '1.12.0');
  const head = `GET ${ping.pathname}${ping.search} HTTP/1.1\r\nHost: ${ping.host}\r\nAuthorization: ${env.json.env.RUNPOD_AI_API_KEY}\r\nConnection: close\r\n\r\n`;
  t.ok(head.length > 8000, `a ${head.length}-byte header block`);
  t.equal(await splitRequest(Number(ping.port), head, 1448), 'HTTP/1.1 200 OK', 'cut at one MSS, as on a 1500-MTU network');
});

t.test('a worker holding 1,000 jobs keeps their leases with pings split at one MSS', { skip }, async (t) => {
  const a = await startAgent(t, { leaseMs: 2000, jobRateLimitPercent: 0 });
  const ep = (await a.req('POST', '/v2/serverless', { body: queueBody({ name: 'many' }) })).json.id as string;
  const we = (await a.req('GET', `/v2/serverless/${ep}/worker-env`)).json as { workerId: string; env: Record<string, string> };
  const w = new TestWorker(we);
  for (let i = 0; i < 1000; i += 50) {
    const runs = await Promise.all(Array.from({ length: 50 }, () => a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })));
    if (runs.some((r) => r.status !== 200)) return t.fail(`run: ${runs.find((r) => r.status !== 200)?.text}`);
  }
  const held: string[] = [];
  while (held.length < 1000) {
    const { status, jobs } = await w.takeBatch(256);
    if (status !== 200) return t.fail(`job-take-batch answered ${status} with ${held.length} jobs taken`);
    held.push(...jobs.map((j) => j.id));
  }
  t.equal(new Set(held).size, 1000, 'the worker holds 1,000 jobs');
  // runpod-python's heartbeat: requests encodes the comma list (%2C), ~42 bytes a flashd job id.
  const ping = new URL((we.env['RUNPOD_WEBHOOK_PING'] as string).replace('$RUNPOD_POD_ID', w.workerId));
  ping.searchParams.set('job_id', held.join(','));
  ping.searchParams.set('runpod_version', '1.12.0');
  const head = `GET ${ping.pathname}${ping.search} HTTP/1.1\r\nHost: ${ping.host}\r\nAuthorization: ${w.key}\r\nUser-Agent: RunPod-Python-SDK/1.12.0\r\nConnection: close\r\n\r\n`;
  t.ok(head.length > 40_000, `a ${head.length}-byte header block`);
  // Heartbeats every 500 ms for one and a half leases: each must be answered and renew all 1,000.
  const until = Date.now() + 3000;
  const answers = new Set<string>();
  while (Date.now() < until) {
    answers.add(await splitRequest(Number(ping.port), head, 1448));
    await new Promise((r) => setTimeout(r, 500));
  }
  t.same([...answers], ['HTTP/1.1 200 OK'], 'every ping answered');
  for (const id of [held[0], held[499], held[999]] as string[]) {
    t.equal((await a.req('GET', `/v2/${ep}/status/${id}`)).json.status, 'IN_PROGRESS', `job ${id} still held by the worker`);
  }
  t.equal((await w.done(held[999] as string, { output: 1 })).status, 200, 'and its result is accepted, not fenced');
});

t.test('patchUwsAddon touches only the known binary', async (t) => {
  t.equal(patchUwsAddon(UWS_ADDON, Buffer.alloc(100)), null, 'wrong size');
  t.equal(patchUwsAddon('uws_darwin_arm64_115.node', Buffer.alloc(100)), null, 'no patch for that file');
});
