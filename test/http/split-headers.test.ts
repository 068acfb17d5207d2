/**
 * A request whose header block is over 4 KB and arrives in more than one read: the bundled
 * uWS v20.30 closed such a connection with no reply (its HttpParser keeps at most 4 KB between
 * reads); src/core/native.ts loads a copy patched to 16 KB. runpod-python's ping lists every job
 * in progress in its query, so a worker with ~90+ jobs sends one, and a real network splits it.
 */
import t from 'tap';
import { connect } from 'node:net';
import { createHash } from 'node:crypto';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';
import { patchUwsAddon, UWS_ADDON } from '../../src/core/native.js';
import { queueBody, startAgent } from '../helpers/agent.js';

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

t.test('a header block over 4 KB split across reads is answered (up to 16 KB)', { skip }, async (t) => {
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
  t.equal(await splitRequest(port, req(ids(400).slice(0, 16200))), 'HTTP/1.1 200 OK', 'just under 16 KB');
  t.equal(await splitRequest(port, req(ids(400))), '(closed)', 'over 16 KB split: still refused (a bound, as Node has)');
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

t.test('patchUwsAddon touches only the known binary', async (t) => {
  t.equal(patchUwsAddon(UWS_ADDON, Buffer.alloc(100)), null, 'wrong size');
  t.equal(patchUwsAddon('uws_darwin_arm64_115.node', Buffer.alloc(100)), null, 'no patch for that file');
});
