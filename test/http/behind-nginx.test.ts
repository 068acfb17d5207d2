/**
 * README "Behind a TLS proxy": its nginx block, run as written (the listen port, upstream port
 * and certificate paths put in for the test) in front of a real flashd, with a certificate made
 * by openssl. Through it: a management call, a /runsync whose 3 MiB input is over nginx's own
 * default body limit, taken and answered by a worker whose job URLs (worker-env, built from
 * --public-url) point at the proxy; a /runsync over flashd's 20 MiB limit answered with flashd's
 * problem+json 413, not nginx's HTML; and a log follow whose lines come through as they are
 * written, also with the block's `proxy_buffering off` taken out (flashd's X-Accel-Buffering).
 * Needs nginx and openssl (.ci/run installs nginx-light); skipped, saying why, without them.
 */
import t, { type Test } from 'tap';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { request, type RequestOptions } from 'node:https';
import { join } from 'node:path';
import { ADMIN_KEY, cpuBody, startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { freePort, REPO_ROOT } from '../helpers/spawn-flashd.js';

const MiB = 1024 * 1024;

function whyNot(): string | undefined {
  for (const bin of ['nginx', 'openssl']) {
    const r = spawnSync(bin, [bin === 'nginx' ? '-v' : 'version'], { encoding: 'utf8' });
    if (r.error) return `needs ${bin} (${r.error.message}); .ci/run installs nginx-light`;
  }
  return undefined;
}
const skip = whyNot() ?? false;

/** README's nginx block, as written. */
function readmeBlock(): string {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const at = readme.indexOf('### Behind a TLS proxy');
  const m = at < 0 ? null : /```nginx\n([\s\S]*?)```/.exec(readme.slice(at));
  if (!m) throw new Error('README "Behind a TLS proxy" has no nginx block');
  return m[1] as string;
}

interface Reply { status: number; headers: Record<string, string | string[] | undefined>; text: string; json: any }

/** nginx with README's block in front of `upstreamPort`; returns its https base URL and CA. */
async function startNginx(t: Test, upstreamPort: number, edit: (block: string) => string = (b) => b, listenPort?: number): Promise<{ url: string; ca: string }> {
  const dir = join(testDataDir(t), `nginx-${Math.random().toString(36).slice(2)}`);
  mkdirSync(join(dir, 'tmp'), { recursive: true });
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  const ssl = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=localhost',
    '-addext', 'subjectAltName=DNS:localhost', '-keyout', key, '-out', cert], { encoding: 'utf8' });
  if (ssl.status !== 0) throw new Error(`openssl: ${ssl.stderr}`);
  const port = listenPort ?? (await freePort());
  let block = edit(readmeBlock());
  const swaps: [RegExp, string][] = [
    [/server 127\.0\.0\.1:8000;/, `server 127.0.0.1:${upstreamPort};`],
    [/listen 443 ssl;/, `listen 127.0.0.1:${port} ssl;`],
    [/ssl_certificate\s+\S+;/, `ssl_certificate ${cert};`],
    [/ssl_certificate_key\s+\S+;/, `ssl_certificate_key ${key};`],
  ];
  for (const [from, to] of swaps) {
    if (!from.test(block)) throw new Error(`README's nginx block has no ${from}`);
    block = block.replace(from, to);
  }
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((k) => `${k}_temp_path ${join(dir, 'tmp', k)};`).join('\n');
  const conf = join(dir, 'nginx.conf');
  writeFileSync(conf, `${process.getuid?.() === 0 ? 'user root;\n' : ''}daemon off;
worker_processes 1;
pid ${join(dir, 'nginx.pid')};
error_log ${join(dir, 'error.log')} warn;
events { worker_connections 256; }
http {
access_log off;
${temp}
${block}
}
`);
  const proc: ChildProcess = spawn('nginx', ['-p', dir, '-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr?.on('data', (c: Buffer) => (stderr += c.toString()));
  t.teardown(() => new Promise<void>((resolve) => {
    if (proc.exitCode !== null) return resolve();
    proc.once('exit', () => resolve());
    proc.kill('SIGQUIT');
  }));
  const ca = readFileSync(cert, 'utf8');
  const url = `https://localhost:${port}`;
  for (let i = 0; ; i++) {
    if (proc.exitCode !== null) throw new Error(`nginx exited ${proc.exitCode}: ${stderr}${readFileSync(join(dir, 'error.log'), 'utf8')}`);
    try {
      if ((await call(ca, 'GET', `${url}/healthz`, { timeoutMs: 5000 })).status === 200) break;
    } catch (err) {
      // Refused while nginx starts; a connection with no reply is flashd not answering nginx.
      if (i > 100 || /no reply/.test((err as Error).message)) throw err;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return { url, ca };
}

function call(ca: string, method: string, url: string, o: { body?: string | Buffer; headers?: Record<string, string>; timeoutMs?: number } = {}): Promise<Reply> {
  const ms = o.timeoutMs ?? 30_000;
  return new Promise((resolve, reject) => {
    const opts: RequestOptions = { method, ca, headers: { ...o.headers }, timeout: ms };
    const req = request(url, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json: any;
        try { json = JSON.parse(text); } catch { json = undefined; }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: no reply within ${ms / 1000} s`)));
    req.on('error', reject);
    req.end(o.body);
  });
}

const admin = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' };

t.test("README's nginx block: jobs, a worker and errors go through it as they do to flashd", { skip }, async (t) => {
  const upstream = await freePort();
  const proxyPort = await freePort();
  // flashd is told the proxy's address, as README says; the proxy is started on that port below.
  const a = await startAgent(t, { port: upstream, publicUrl: `https://localhost:${proxyPort}`, takeHoldMs: 5000 });
  const { url, ca } = await startNginx(t, upstream, undefined, proxyPort);

  const created = await call(ca, 'POST', `${url}/v2/serverless`, { headers: admin, body: JSON.stringify(cpuBody({ workers: { min: 0, max: 0 } })) });
  t.equal(created.status, 201, created.text);
  const ep = created.json.id as string;

  const we = await call(ca, 'GET', `${url}/v2/serverless/${ep}/worker-env`, { headers: admin });
  t.equal(we.status, 200, we.text);
  const env = we.json.env as Record<string, string>;
  const workerId = we.json.workerId as string;
  t.ok(env['RUNPOD_WEBHOOK_GET_JOB']?.startsWith(`${url}/`), `the job URLs point at the proxy: ${env['RUNPOD_WEBHOOK_GET_JOB']}`);
  const workerKey = env['RUNPOD_AI_API_KEY'] as string;
  const takeUrl = `${(env['RUNPOD_WEBHOOK_GET_JOB'] as string).replace('$ID', workerId)}&job_in_progress=0`;

  // A parked job-take through the proxy, woken by a /runsync through it whose input is over
  // nginx's default client_max_body_size (1 MiB).
  const take = call(ca, 'GET', takeUrl, { headers: { authorization: workerKey } });
  await new Promise((resolve) => setTimeout(resolve, 300));
  const input = { pad: 'x'.repeat(3 * MiB) };
  const sync = call(ca, 'POST', `${url}/v2/${ep}/runsync?wait=20000`, { headers: admin, body: JSON.stringify({ input }) });
  const job = await take;
  t.equal(job.status, 200, `job-take through the proxy: ${job.text.slice(0, 200)}`);
  t.equal((job.json?.input as { pad: string } | undefined)?.pad.length, 3 * MiB, 'the whole input reached the worker');
  const doneUrl = `${(env['RUNPOD_WEBHOOK_POST_OUTPUT'] as string).replace('$ID', job.json.id as string)}&isStream=false`;
  const done = await call(ca, 'POST', doneUrl, { headers: { authorization: workerKey, 'content-type': 'application/x-www-form-urlencoded' }, body: JSON.stringify({ output: { n: input.pad.length } }) });
  t.equal(done.status, 200, done.text);
  const r = await sync;
  t.equal(r.status, 200, r.text.slice(0, 300));
  t.equal(r.json?.status, 'COMPLETED');
  t.same(r.json?.output, { n: 3 * MiB });

  // flashd's own limit, with its own problem+json, not nginx's HTML 413.
  const big = await call(ca, 'POST', `${url}/v2/${ep}/runsync`, { headers: admin, body: JSON.stringify({ input: { pad: 'x'.repeat(21 * MiB) } }) });
  t.equal(big.status, 413);
  t.match(String(big.headers['content-type']), /^application\/problem\+json/, "flashd's error, not the proxy's");
  t.equal(big.json?.status, 413);
  t.equal((await a.req('GET', `/v2/${ep}/health`)).json?.jobs?.inQueue, 0, 'nothing was queued');
});

t.test('a log follow comes through nginx line by line, also with proxy_buffering left on', { skip }, async (t) => {
  const upstream = await freePort();
  const a = await startAgent(t, { port: upstream });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  for (const [name, edit] of [
    ['as written', (b: string) => b],
    ['without proxy_buffering off', (b: string) => b.replace(/^\s*proxy_buffering off;.*$/m, '')],
  ] as const) {
    const { url, ca } = await startNginx(t, upstream, edit);
    const lines: string[] = [];
    let wake: () => void = () => {};
    const req = request(`${url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { ca, headers: { authorization: `Bearer ${ADMIN_KEY}` } }, (res) => {
      let buf = '';
      res.on('data', (c: Buffer) => {
        buf += c.toString();
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line) lines.push(line);
        }
        wake();
      });
    });
    req.on('error', () => {});
    req.end();
    const seen = async (text: string): Promise<boolean> => {
      const until = Date.now() + 5000;
      while (!lines.some((l) => l.includes(text))) {
        if (Date.now() > until) return false;
        await new Promise<void>((resolve) => { wake = resolve; setTimeout(resolve, 100); });
      }
      return true;
    };
    await new Promise((resolve) => setTimeout(resolve, 300));
    a.agent.logs.append(ep, 'wkr_a', 'stdout', `first ${name}`);
    t.ok(await seen(`first ${name}`), `${name}: a line comes through within 5 s`);
    a.agent.logs.append(ep, 'wkr_a', 'stdout', `second ${name}`);
    t.ok(await seen(`second ${name}`), `${name}: and the next one`);
    req.destroy();
  }
});
