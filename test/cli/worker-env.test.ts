/**
 * `flashd worker-env` as a user runs it against a running server: the printed environment
 * drives a real worker through a job. Uses dist/flashd.mjs, built by `npm test` before tap.
 */
import t from 'tap';
import { join } from 'node:path';
import { ADMIN_KEY, cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { execFile } from 'node:child_process';
import { networkInterfaces } from 'node:os';
import { cleanEnv, REPO_ROOT } from '../helpers/spawn-flashd.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');

/** Async, because the server under test runs in this process and must keep serving. */
function run(cmd: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(cmd, args, { env, cwd: REPO_ROOT, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ status: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

t.test('worker-env prints a working environment in three formats', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  const dotenv = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url], env);
  t.equal(dotenv.status, 0, dotenv.stderr);
  const vars = Object.fromEntries(dotenv.stdout.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  for (const name of ['WEBHOOK_GET_JOB', 'WEBHOOK_POST_OUTPUT', 'WEBHOOK_POST_STREAM', 'WEBHOOK_PING', 'POD_ID', 'AI_API_KEY', 'ENDPOINT_ID', 'PING_INTERVAL']) {
    t.ok(vars[`RUNPOD_${name}`], `RUNPOD_${name}`);
    t.equal(vars[`VENDOR_${name}`], vars[`RUNPOD_${name}`], `VENDOR_${name} equals RUNPOD_${name}`);
  }
  t.match(vars['RUNPOD_WEBHOOK_GET_JOB'], /\/job-take\/\$ID\?/, 'templates already hold a ?query');
  const worker = new TestWorker({ workerId: vars['RUNPOD_POD_ID'] as string, env: vars as Record<string, string> });
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { via: 'cli' } } })).json.id;
  t.same(await worker.take(), { id, input: { via: 'cli' } }, 'the printed environment serves the endpoint');

  const shell = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--format', 'shell'], env);
  t.match(shell.stdout, /^export RUNPOD_AI_API_KEY='fd_wkr_/m);
  const json = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--format', 'json'], env);
  t.match(JSON.parse(json.stdout), { workerId: /^wkr_/, env: { RUNPOD_ENDPOINT_ID: ep } });
  t.not(JSON.parse(json.stdout).workerId, vars['RUNPOD_POD_ID'], 'each call makes a new worker id');
});

t.test('worker-env fails clearly', async (t) => {
  const a = await startAgent(t);
  const missing = await run(process.execPath, [BUNDLE, 'worker-env', 'nosuchendpoint', '--url', a.url, '--api-key', ADMIN_KEY], cleanEnv());
  t.equal(missing.status, 1);
  t.match(missing.stderr, /404/);
  const usage = await run(process.execPath, [BUNDLE, 'worker-env'], cleanEnv());
  t.equal(usage.status, 2);
  t.match(usage.stderr, /Usage: flashd worker-env/);
  const noKey = await run(process.execPath, [BUNDLE, 'worker-env', 'x', '--url', a.url, '--data-dir', t.testdir()], cleanEnv());
  t.equal(noKey.status, 2);
  t.match(noKey.stderr, /no API key/);
  const help = await run(process.execPath, [BUNDLE, 'worker-env', '--help'], cleanEnv());
  t.equal(help.status, 0);
  t.match(help.stdout, /--format/);
});

/** An address of this machine other than loopback, as another machine would use. */
const lanAddress = Object.values(networkInterfaces()).flat().find((i) => i && i.family === 'IPv4' && !i.internal)?.address;

t.test('worker-env warns when asked over the network but the job URLs are loopback', { skip: lanAddress ? false : 'no non-loopback IPv4 address here' }, async (t) => {
  const a = await startAgent(t, { host: '0.0.0.0' });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  const remote = `http://${lanAddress}:${a.agent.port}`;
  const warned = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', remote], env);
  t.equal(warned.status, 0, 'the environment is still printed');
  t.match(warned.stdout, /RUNPOD_WEBHOOK_GET_JOB=http:\/\/127\.0\.0\.1/);
  t.match(warned.stderr, /warning: the job URLs point at 127\.0\.0\.1:\d+, which a worker on another machine cannot reach; start flashd with --public-url/);
  const local = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', `http://127.0.0.1:${a.agent.port}`], env);
  t.equal(local.stderr, '', 'asked on this machine: no warning');
  const published = await startAgent(t, { host: '0.0.0.0', publicUrl: `http://${lanAddress}:8123` });
  const ep2 = (await published.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const fine = await run(process.execPath, [BUNDLE, 'worker-env', ep2, '--url', `http://${lanAddress}:${published.agent.port}`], env);
  t.equal(fine.stderr, '', 'with --public-url: no warning');
});
