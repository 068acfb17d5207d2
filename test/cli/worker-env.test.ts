/**
 * `flashd worker-env` as a user runs it against a running server: the printed environment
 * drives a real worker through a job. Uses dist/flashd.mjs, built by `npm test` before tap.
 */
import t, { type Test } from 'tap';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADMIN_KEY, assertProblem, cpuBody, startAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { execFile } from 'node:child_process';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import { networkInterfaces } from 'node:os';
import { cleanEnv, REPO_ROOT } from '../helpers/spawn-flashd.js';
import { WORKER_ENV_USAGE } from '../../src/cli/worker-env.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');

/** Async, because the server under test runs in this process and must keep serving. `stdin`: written to it, then closed. */
function run(cmd: string, args: string[], env: NodeJS.ProcessEnv, timeout = 60_000, stdin = ''): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(cmd, args, { env, cwd: REPO_ROOT, timeout }, (err, stdout, stderr) => {
      resolve({ status: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
    // A child that exits without reading its stdin (sh -c '. file && env', a usage error)
    // closes the pipe first: the write then fails with EPIPE, which is no error of the test.
    child.stdin?.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code !== 'EPIPE') throw err;
    });
    child.stdin?.end(stdin);
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
  const keyId = /^# its key is (key_\w+): .* revoke it with DELETE \/v2\/api-keys\/(key_\w+)$/m.exec(dotenv.stdout);
  t.ok(keyId && keyId[1] === keyId[2], 'names the key, so it can be revoked');
  t.match((await a.req('GET', `/v2/api-keys/${keyId?.[1]}`)).json, { kind: 'worker', endpointId: ep }, 'the named key is this worker\'s');
  t.equal(vars['RUNPOD_SKIP_AUTO_SYSTEM_CHECKS'], 'true', "runpod-python >=1.9's fitness checks (internet, 4 GB free) do not kill a worker on an isolated box");
  const worker = new TestWorker({ workerId: vars['RUNPOD_POD_ID'] as string, env: vars as Record<string, string> });
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: { via: 'cli' } } })).json.id;
  t.same(await worker.take(), { id, input: { via: 'cli' } }, 'the printed environment serves the endpoint');

  const shell = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--format', 'shell'], env);
  t.match(shell.stdout, /^export RUNPOD_AI_API_KEY='fd_wkr_/m);
  const json = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--format', 'json'], env);
  t.match(JSON.parse(json.stdout), { workerId: /^wkr_/, env: { RUNPOD_ENDPOINT_ID: ep } });
  t.not(JSON.parse(json.stdout).workerId, vars['RUNPOD_POD_ID'], 'each call makes a new worker id');
});

t.test('worker-env formats: dotenv as the values are, shell single-quoted as sh and docker compose read it', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  const gpu = "O'Brien #1";
  const dotenv = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--gpu', gpu], env);
  t.equal(dotenv.status, 0, dotenv.stderr);
  t.match(dotenv.stdout, /^# values as they are: for docker\/podman run --env-file; docker compose env_file and shells need --format shell$/m, 'says which tools read it');
  t.match(dotenv.stdout, /^RUNPOD_WEBHOOK_GET_JOB=http:\/\/[^\s]+\/job-take\/\$ID\?gpu=O%27Brien\+%231$/m, '$ID as it is: docker run --env-file takes values literally');

  const shell = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--gpu', gpu, '--format', 'shell'], env);
  t.equal(shell.status, 0, shell.stderr);
  t.match(shell.stdout, /^# single-quoted: for \. \.\/file \(sh, bash\) and docker compose env_file; docker run --env-file needs --format dotenv$/m);
  const lines = shell.stdout.split('\n').filter((l) => l && !l.startsWith('#'));
  // compose's env_file parser drops `export`, reads '…' literally (no $ expansion), and has no
  // escape for a quote inside: each value must be one quoted run without a quote in it.
  const bad = lines.filter((l) => !/^export [A-Z_]+='[^'\n]*'$/.test(l));
  t.same(bad, [], "every line is export KEY='value' with no quote inside the value");
  const printed = Object.fromEntries(lines.map((l) => [l.slice(7, l.indexOf('=')), l.slice(l.indexOf('=') + 2, -1)]));
  t.match(printed['RUNPOD_WEBHOOK_GET_JOB'], /\/job-take\/\$ID\?gpu=O%27Brien\+%231$/);
  const file = join(testDataDir(t), 'worker.env');
  writeFileSync(file, shell.stdout);
  const sourced = await run('sh', ['-c', '. "$1" && env', 'sh', file], cleanEnv());
  t.equal(sourced.status, 0, sourced.stderr);
  const seen = Object.fromEntries(sourced.stdout.split('\n').filter((l) => /^(RUNPOD|VENDOR)_/.test(l)).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  t.same(seen, printed, 'sh reads back exactly the printed values, $ID included');

  // The job URLs are flashd's --public-url, 127.0.0.1 by default: a worker container run with
  // `docker run --env-file` (what dotenv is for) polls its own loopback and is refused forever.
  const loopback = /^# the job URLs point at 127\.0\.0\.1:\d+, this machine's loopback: a worker in a container reaches it only with --network host \(docker\/podman run --network host --env-file …; network_mode: host in docker compose\), or start flashd with --public-url http:\/\/<an address the container reaches>:<port>$/m;
  t.match(dotenv.stdout, loopback, 'dotenv: says a container needs --network host to reach loopback URLs');
  t.match(shell.stdout, loopback, 'shell (docker compose env_file) alike');
  const json = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--format', 'json'], env);
  t.notMatch(json.stdout, /network host/, 'json has no comments');
  const published = await startAgent(t, { publicUrl: 'http://192.0.2.7:8123' });
  const ep2 = (await published.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const elsewhere = await run(process.execPath, [BUNDLE, 'worker-env', ep2, '--url', published.url], env);
  t.equal(elsewhere.status, 0, elsewhere.stderr);
  t.notMatch(elsewhere.stdout, /network host/, 'with a --public-url that is not loopback: no such line');
});

t.test('worker-env refuses a LOAD_BALANCER endpoint: its workers take no jobs', async (t) => {
  const a = await startAgent(t);
  const lb = (await a.req('POST', '/v2/serverless', { body: cpuBody({ type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 4 } }) })).json.id as string;
  const keys = () => (a.agent.db.prepare("SELECT count(*) AS n FROM api_keys WHERE kind = 'worker'").get() as { n: number }).n;
  const r = await a.req('GET', `/v2/serverless/${lb}/worker-env`);
  assertProblem(t, r, 409);
  t.match(r.json.detail, /LOAD_BALANCER endpoint: its workers serve HTTP themselves \(PORT, PORT_HEALTH, HEALTH_CHECK_PATH\) and take no jobs/);
  t.equal(keys(), 0, 'no worker key was made for it');
  const cli = await run(process.execPath, [BUNDLE, 'worker-env', lb, '--url', a.url], cleanEnv({ FLASHD_API_KEY: ADMIN_KEY }));
  t.equal(cli.status, 1);
  t.match(cli.stderr, /^flashd worker-env: 409: Endpoint \w+ is a LOAD_BALANCER endpoint/);
  t.equal(cli.stdout, '', 'no environment printed');
});

t.test('worker-env fails clearly', async (t) => {
  const a = await startAgent(t);
  const missing = await run(process.execPath, [BUNDLE, 'worker-env', 'nosuchendpoint', '--url', a.url, '--api-key', ADMIN_KEY], cleanEnv());
  t.equal(missing.status, 1);
  t.match(missing.stderr, /404/);
  const usage = await run(process.execPath, [BUNDLE, 'worker-env'], cleanEnv());
  t.equal(usage.status, 2);
  t.match(usage.stderr, /Usage: flashd worker-env/);
  const noKey = await run(process.execPath, [BUNDLE, 'worker-env', 'x', '--url', a.url, '--data-dir', testDataDir(t)], cleanEnv());
  t.equal(noKey.status, 2);
  t.match(noKey.stderr, /no API key/);
  // README's `worker-env $EP --api-key $KEY --format shell` with KEY unset.
  const emptyKey = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--api-key', '--format', 'shell'], cleanEnv());
  t.equal(emptyKey.status, 2);
  t.match(emptyKey.stderr, /^flashd worker-env: option --api-key needs a value\n/, 'names the option left without a value');
  const last = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--format'], cleanEnv());
  t.equal(last.status, 2);
  t.match(last.stderr, /^flashd worker-env: option --format needs a value\n/);
  const help = await run(process.execPath, [BUNDLE, 'worker-env', '--help'], cleanEnv());
  t.equal(help.status, 0);
  t.match(help.stdout, /--format/);
  t.match(help.stdout, /^ {2}-h, --help +show this help$/m, 'lists itself, as flashd --help does');
  t.equal((await run(process.execPath, [BUNDLE, 'worker-env', '-h'], cleanEnv())).stdout, help.stdout, '-h is the same');
});

t.test('worker-env usage errors end with the cause and a usage line, not 40 lines of help; a misspelt or short option is named as such', async (t) => {
  const USAGE_LINE = 'Usage: flashd worker-env <endpoint_id> [options] (see flashd worker-env --help)\n';
  const cases: [string[], string][] = [
    // The help printed after the error pushed the error off the top of a terminal.
    [[], 'name exactly one endpoint id'],
    [['ep', '--api-kye-file', 'k'], 'bad option --api-kye-file (did you mean --api-key-file?)'],
    [['ep', '--fromat', 'json'], 'bad option --fromat (did you mean --format?)'],
    // Not --api-key, which it begins with: the file's path would go in as the key.
    [['ep', '--api-key-flie', 'k'], 'bad option --api-key-flie (did you mean --api-key-file?)'],
    [['ep', '--verbose'], 'bad option --verbose'],
    [['ep', '--prot', '9000'], 'bad option --prot (to reach a flashd on another port or host, give --url http://HOST:PORT)'],
    [['ep', '--port=9000'], 'bad option --port=9000 (to reach a flashd on another port or host, give --url http://HOST:PORT)'],
    // A short option was taken for a second endpoint id: "name exactly one endpoint id".
    [['ep', '-f', 'json'], 'bad option -f (worker-env has long options only, such as --format)'],
    [['ep', '--format', 'yaml'], 'unknown format "yaml" (dotenv, shell or json)'],
    [['ep', 'sk_not_echoed'], 'name exactly one endpoint id (got 2 arguments that are no option)'],
  ];
  for (const [args, error] of cases) {
    const r = await run(process.execPath, [BUNDLE, 'worker-env', ...args], cleanEnv());
    t.equal(r.status, 2, `worker-env ${args.join(' ')}: exit 2`);
    t.equal(r.stderr, `flashd worker-env: ${error}\n${USAGE_LINE}`, `worker-env ${args.join(' ')}`);
    t.equal(r.stdout, '');
  }
  // `--api-key-file -` still reads stdin: a lone dash is a value, not an option.
  const stdin = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--api-key-file', '-', '--url', 'http://127.0.0.1:1'], cleanEnv(), 60_000, '');
  t.equal(stdin.stderr, 'flashd worker-env: stdin holds no API key (it is empty)\n');
});

t.test('worker-env with nothing listening says why and how to point it elsewhere, not just "fetch failed"', async (t) => {
  // A port that was free a moment ago: nothing answers there.
  const probe = createNetServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const port = (probe.address() as { port: number }).port;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  // README's flow with flashd on another --port: worker-env asks the default address.
  const byDefault = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--api-key', ADMIN_KEY], cleanEnv({ FLASHD_PORT: String(port) }));
  t.equal(byDefault.status, 1);
  t.notMatch(byDefault.stderr, /fetch failed/);
  t.match(byDefault.stderr, new RegExp(`^flashd worker-env: cannot reach flashd at http://127\\.0\\.0\\.1:${port}: connect ECONNREFUSED 127\\.0\\.0\\.1:${port}; is it running\\? For a flashd on another port or machine, give --url http://HOST:PORT \\(or set FLASHD_URL\\)\n$`));
  // An address given explicitly: the reason, without the hint to give one.
  const given = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--api-key', ADMIN_KEY, '--url', `http://127.0.0.1:${port}`], cleanEnv());
  t.equal(given.status, 1);
  t.equal(given.stderr, `flashd worker-env: cannot reach flashd at http://127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}; is it running?\n`);
});

t.test('worker-env refuses a --url or FLASHD_URL without http(s)://, instead of saying flashd is unreachable', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const hostPort = a.url.replace(/^http:\/\//, '');
  const bare = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', hostPort, '--api-key', ADMIN_KEY], cleanEnv());
  t.equal(bare.status, 2, 'bad usage');
  t.equal(bare.stderr, `flashd worker-env: --url must give an http:// or https:// URL such as http://127.0.0.1:8000, got "${hostPort}"\n`);
  t.equal(bare.stdout, '');
  const ftp = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--api-key', ADMIN_KEY], cleanEnv({ FLASHD_URL: `ftp://${hostPort}` }));
  t.equal(ftp.status, 2);
  t.match(ftp.stderr, /^flashd worker-env: FLASHD_URL must give an http:\/\/ or https:\/\/ URL/);
  const unset = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--api-key', ADMIN_KEY], cleanEnv({ FLASHD_URL: '', FLASHD_PORT: String(new URL(a.url).port) }));
  t.equal(unset.status, 0, `an empty FLASHD_URL counts as unset: ${unset.stderr}`);
});

/** Listens on a free loopback port until the test ends; returns its URL. */
async function listen(t: Test, server: HttpServer | NetServer): Promise<string> {
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => sockets.add(s));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => {
    for (const s of sockets) s.destroy();
    server.close(() => resolve());
  }));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

t.test('worker-env against a server that is not flashd: one line, exit 1', async (t) => {
  // FLASHD_WORKER_ENV_TIMEOUT_MS stands in for the 10 s; the run's own 30 s limit catches a hang.
  // That the 0.3 s was the limit used shows in the message, not in a wall-clock bound, which a
  // loaded machine (node's own start taking seconds) would break.
  // Only the silent server gets the short limit: under load, this process (which serves the
  // others) can take longer than 0.3 s to answer, and their checks are not about the limit.
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  const page = await listen(t, createHttpServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>It works!</body></html>')));
  const html = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', page], env, 30_000);
  t.equal(html.status, 1, 'a 200 that is not JSON');
  t.equal(html.stderr, `flashd worker-env: ${page} did not answer like flashd (not JSON: "<html><body>It works!</body></html>")\n`, 'no stack trace');
  t.equal(html.stdout, '', 'nothing printed as an environment');

  const other = await listen(t, createHttpServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"env":null}')));
  const json = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', other], env, 30_000);
  t.equal(json.status, 1, 'JSON of another shape');
  t.equal(json.stderr, `flashd worker-env: ${other} did not answer like flashd (no workerId and env in its JSON)\n`);
  t.equal(json.stdout, '');

  // Another web server on that port (or a proxy's error page): a status with an HTML body,
  // many lines long, is still one line, not the page.
  const notFound = await listen(t, createHttpServer((_req, res) => res.writeHead(404, { 'content-type': 'text/html' }).end('<html>\n<body>\n<h1>404 Not Found</h1>\n</body>\n</html>\n')));
  const err = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', notFound], env, 30_000);
  t.equal(err.status, 1, 'an error status that is not flashd\'s');
  t.equal(err.stderr, `flashd worker-env: ${notFound} did not answer like flashd (HTTP 404, not JSON: "<html>\\n<body>\\n<h1>404 Not Found</h1>\\n</body>\\n</html>\\n")\n`, 'one line, the body quoted short');
  const bad = await listen(t, createHttpServer((_req, res) => res.writeHead(502, { 'content-type': 'application/json' }).end('{"message":"bad gateway"}')));
  const badJson = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', bad], env, 30_000);
  t.equal(badJson.stderr, `flashd worker-env: ${bad} did not answer like flashd (HTTP 502, no detail in its JSON)\n`);
  t.equal(badJson.status, 1);

  const silent = await listen(t, createNetServer(() => {}));
  const hang = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', silent], { ...env, FLASHD_WORKER_ENV_TIMEOUT_MS: '300' }, 30_000);
  t.equal(hang.stderr, `flashd worker-env: no answer from ${silent} within 0.3 s\n`, 'accepted, never answered');
  t.equal(hang.status, 1, 'gave up after its timeout rather than hanging');

  // flashd's plain-http port never answers a TLS handshake either: an https:// URL of it waits out
  // the limit, and the line says the likely cause (a wrong scheme), not only that nothing answered.
  const tlsUrl = silent.replace('http://', 'https://');
  const tls = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', tlsUrl], { ...env, FLASHD_WORKER_ENV_TIMEOUT_MS: '300' }, 30_000);
  t.equal(tls.stderr, `flashd worker-env: no answer from ${tlsUrl} within 0.3 s; flashd itself serves plain http only (https:// is for a TLS proxy in front of it): if this is flashd's own port, try --url ${silent}\n`, 'https:// to a plain port: says to try http://');
  t.equal(tls.status, 1);
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
  t.equal(fine.status, 0);
  t.notMatch(fine.stderr, /job URLs/, 'with --public-url: no warning about the job URLs (plain http still warns, below)');
});

t.test('worker-env takes the key from a file or stdin, off the command line; --api-key still works', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const file = join(testDataDir(t), 'admin.key');
  writeFileSync(file, `${ADMIN_KEY}\n`, { mode: 0o600 });
  const workerOf = (stdout: string) => /^# worker (wkr_\w+) for endpoint/m.exec(stdout)?.[1];

  const fromFile = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key-file', file], cleanEnv());
  t.equal(fromFile.status, 0, fromFile.stderr);
  t.ok(workerOf(fromFile.stdout), 'a file (its trailing newline dropped) gives the key');
  t.equal(fromFile.stderr, '', 'loopback: no warning');
  const fromStdin = await run(process.execPath, [BUNDLE, 'worker-env', ep, `--url=${a.url}`, '--api-key-file', '-', '--format', 'json'], cleanEnv(), 60_000, `${ADMIN_KEY}\n`);
  t.equal(fromStdin.status, 0, fromStdin.stderr);
  t.match(JSON.parse(fromStdin.stdout), { workerId: /^wkr_/, env: { RUNPOD_ENDPOINT_ID: ep } }, '- reads it from stdin');
  const fromFlag = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key', ADMIN_KEY], cleanEnv());
  t.equal(fromFlag.status, 0, `--api-key still works: ${fromFlag.stderr}`);
  t.ok(workerOf(fromFlag.stdout));
  const overEnv = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key-file', file], cleanEnv({ FLASHD_API_KEY: 'not-the-key-0123456789' }));
  t.equal(overEnv.status, 0, `the file wins over FLASHD_API_KEY: ${overEnv.stderr}`);

  const both = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key', ADMIN_KEY, '--api-key-file', file], cleanEnv());
  t.equal(both.status, 2);
  t.match(both.stderr, /^flashd worker-env: give --api-key or --api-key-file, not both\n/);
  const missing = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key-file', join(testDataDir(t), 'nope')], cleanEnv());
  t.equal(missing.status, 2);
  t.match(missing.stderr, /^flashd worker-env: cannot read the API key from .*nope: ENOENT/);
  const empty = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key-file', '-'], cleanEnv(), 60_000, '\n');
  t.equal(empty.status, 2);
  t.equal(empty.stderr, 'flashd worker-env: stdin holds no API key (it is empty)\n');
  t.equal(empty.stdout, '');
  const noKey = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--data-dir', testDataDir(t)], cleanEnv());
  t.match(noKey.stderr, /no API key: set FLASHD_API_KEY \(or FLASHD_ADMIN_API_KEY\), pass --api-key-file \(- for stdin\) or --api-key/);

  const help = (await run(process.execPath, [BUNDLE, 'worker-env', '--help'], cleanEnv())).stdout;
  t.match(help, /^ {2}--api-key-file <f> +read the admin API key from file <f>, or from stdin with -$/m);
  t.match(help, /--api-key <key> +the admin API key itself: other users of this machine can see it in ps,/);
  t.match(help, /plain http:\/\/ to another machine sends the API key/);
});

t.test('worker-env warns on stderr before sending the key over plain http to another machine', { skip: lanAddress ? false : 'no non-loopback IPv4 address here' }, async (t) => {
  const a = await startAgent(t, { host: '0.0.0.0', publicUrl: `http://${lanAddress}:8123` });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  const port = a.agent.port;
  const lan = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', `http://${lanAddress}:${port}`], env);
  t.equal(lan.status, 0, 'a warning, not an error: homelab LANs often run plain http');
  t.match(lan.stdout, /^RUNPOD_AI_API_KEY=fd_wkr_/m, 'the environment is printed');
  t.equal(lan.stderr, `flashd worker-env: warning: sending the API key to ${lanAddress}:${port} over plain http, unencrypted, and the worker key comes back the same way; anyone on the network path can read both (use an https:// URL, or run worker-env on flashd's machine)\n`);
  for (const local of [`http://127.0.0.1:${port}`, `http://localhost:${port}`, `http://[::ffff:127.0.0.1]:${port}`]) {
    const r = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', local], env);
    t.equal(r.status, 0, `${local}: ${r.stderr}`);
    t.equal(r.stderr, '', `${local} is this machine: no warning`);
  }
});

t.test("README's recipe writes worker.env (a worker key that never expires) owner-only, and git ignores the file", async (t) => {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const writes = [...readme.split('\n'), ...WORKER_ENV_USAGE.split('\n')].filter((l) => /worker-env .*> *worker\.env/.test(l));
  t.ok(writes.length >= 2, `README and --help each show one: ${writes.length}`);
  t.same(writes.filter((l) => !/\(umask 077; [^)]*> *worker\.env\)/.test(l)), [], 'each one writes it with umask 077');

  // README's line as written, the file moved out of the checkout.
  const recipe = readme.split('\n').find((l) => l.includes('worker-env $EP --format shell') && l.includes('worker.env')) ?? '';
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const out = join(testDataDir(t), 'worker.env');
  const r = await run('sh', ['-c', `umask 022; ${recipe.replace(/\.\/worker\.env|worker\.env/g, '"$OUT"')}`],
    cleanEnv({ EP: ep, KEY: ADMIN_KEY, FLASHD_URL: a.url, OUT: out }));
  t.equal(r.status, 0, `${recipe}: ${r.stderr}`);
  t.match(readFileSync(out, 'utf8'), /RUNPOD_AI_API_KEY='fd_wkr_/, 'the worker key is in it');
  t.equal(statSync(out).mode & 0o777, 0o600, 'readable by its owner only, under a umask of 022');

  // A copy of the sources without .git (a release tarball) has nothing to ask.
  if ((await run('git', ['rev-parse', '--git-dir'], cleanEnv())).status !== 0) return;
  const ignored = await run('git', ['check-ignore', '-q', 'worker.env'], cleanEnv());
  t.equal(ignored.status, 0, 'git ignores worker.env in the checkout');
});

t.test('worker-env refuses credentials, a query or a fragment in --url or FLASHD_URL (exit 2), without echoing them', async (t) => {
  const env = cleanEnv({ FLASHD_API_KEY: ADMIN_KEY });
  // Nothing need listen there: the address is refused before anything is sent.
  const creds = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', 'http://admin:PROXYPASS@127.0.0.1:1'], env);
  t.equal(creds.status, 2, 'bad usage, not "is it running?"');
  t.notMatch(creds.stderr, /PROXYPASS|admin:/, 'the password is not echoed');
  t.equal(creds.stderr, 'flashd worker-env: --url must not hold a user name or password (the API key is what flashd checks), such as http://127.0.0.1:8000\n');
  t.equal(creds.stdout, '');
  const userOnly = await run(process.execPath, [BUNDLE, 'worker-env', 'ep'], cleanEnv({ FLASHD_API_KEY: ADMIN_KEY, FLASHD_URL: 'https://token-xyz@flashd.example.lan' }));
  t.equal(userOnly.status, 2);
  t.match(userOnly.stderr, /^flashd worker-env: FLASHD_URL must not hold a user name or password/);
  t.notMatch(userOnly.stderr, /token-xyz/);
  for (const bad of ['http://127.0.0.1:1/?token=abc', 'http://127.0.0.1:1#top', 'http://127.0.0.1:1/flashd?']) {
    const r = await run(process.execPath, [BUNDLE, 'worker-env', 'ep', '--url', bad], env);
    t.equal(r.status, 2, `${bad}: bad usage, not a 404 from the server`);
    t.equal(r.stderr, 'flashd worker-env: --url must not hold a ?query or #fragment: worker-env adds the path and query itself; give the base URL such as http://127.0.0.1:8000\n', bad);
  }
});

t.test('worker-env takes FLASHD_ADMIN_API_KEY, the server\'s own variable, after FLASHD_API_KEY', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  // One unit env file sourced for both: the server's key is the one there is.
  const serverVar = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--data-dir', testDataDir(t)], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.equal(serverVar.status, 0, serverVar.stderr);
  t.match(serverVar.stdout, /^# worker wkr_\w+ for endpoint/m);
  const both = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url], cleanEnv({ FLASHD_API_KEY: 'not-the-key-0123456789', FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.equal(both.status, 1, 'FLASHD_API_KEY comes first');
  // A stale FLASHD_API_KEY in the shell hides the right key: the refusal says where the key came from (never the key).
  t.equal(both.stderr, 'flashd worker-env: 401: The API key is not valid. (key from FLASHD_API_KEY, which is read before FLASHD_ADMIN_API_KEY)\n');
  const stale = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url], cleanEnv({ FLASHD_ADMIN_API_KEY: 'not-the-key-0123456789' }));
  t.equal(stale.stderr, 'flashd worker-env: 401: The API key is not valid. (key from FLASHD_ADMIN_API_KEY)\n');
  const keyDir = testDataDir(t);
  writeFileSync(join(keyDir, 'admin-api-key'), 'not-the-key-0123456789\n', { mode: 0o600 });
  const fromDataDir = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--data-dir', keyDir], cleanEnv());
  t.equal(fromDataDir.stderr, `flashd worker-env: 401: The API key is not valid. (key from ${join(keyDir, 'admin-api-key')})\n`);
  const fromFlag = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key', 'not-the-key-0123456789'], cleanEnv());
  t.equal(fromFlag.stderr, 'flashd worker-env: 401: The API key is not valid. (key from --api-key)\n');
  const fromStdin = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--api-key-file', '-'], cleanEnv(), 60_000, 'not-the-key-0123456789\n');
  t.equal(fromStdin.stderr, 'flashd worker-env: 401: The API key is not valid. (key from --api-key-file -, stdin)\n');
  const readOnly = (await a.req('POST', '/v2/api-keys', { body: { name: 'ro', scopes: ['endpoints:read'] } })).json.key as string;
  const forbidden = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url], cleanEnv({ FLASHD_API_KEY: readOnly }));
  t.match(forbidden.stderr, /^flashd worker-env: 403: .*\(key from FLASHD_API_KEY\)\n$/, 'a key without the admin scope: where it came from too');
  for (const r of [both, stale, fromDataDir, fromFlag, fromStdin, forbidden]) t.notMatch(r.stderr, /not-the-key|fd_usr_/, 'the key is never printed');

  const dir = testDataDir(t);
  const none = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--url', a.url, '--data-dir', dir], cleanEnv());
  t.equal(none.status, 2);
  t.equal(none.stderr, `flashd worker-env: no API key: set FLASHD_API_KEY (or FLASHD_ADMIN_API_KEY), pass --api-key-file (- for stdin) or --api-key, or run where ${join(dir, 'admin-api-key')} exists (a flashd started with FLASHD_ADMIN_API_KEY writes no such file: give that key)\n`);
  const help = (await run(process.execPath, [BUNDLE, 'worker-env', '--help'], cleanEnv())).stdout;
  t.match(help, /The API key is the first of --api-key, --api-key-file, FLASHD_API_KEY, FLASHD_ADMIN_API_KEY and <data-dir>\/admin-api-key/);
});

t.test('a 401 or 404 from the address worker-env asked by default names it and how to ask another flashd', async (t) => {
  // Two flashd on one machine: worker-env given the other one's --data-dir, without --url, asked
  // the one at the default address, and its 401 (or the 404 of an endpoint that lives on the
  // other) named the key's file but not the flashd that refused it.
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const port = new URL(a.url).port;
  const asked = `http://127.0.0.1:${port}`;
  const hint = ` Asked ${asked}, the default address: for a flashd on another port or machine, give --url http://HOST:PORT (or set FLASHD_URL).\n`;
  const keyDir = testDataDir(t);
  writeFileSync(join(keyDir, 'admin-api-key'), 'not-the-key-0123456789\n', { mode: 0o600 });
  const otherKey = await run(process.execPath, [BUNDLE, 'worker-env', ep, '--data-dir', keyDir], cleanEnv({ FLASHD_PORT: port }));
  t.equal(otherKey.status, 1);
  t.equal(otherKey.stderr, `flashd worker-env: 401: The API key is not valid. (key from ${join(keyDir, 'admin-api-key')})${hint}`);
  const otherEndpoint = await run(process.execPath, [BUNDLE, 'worker-env', 'zzzzzzzzzzzzzz'], cleanEnv({ FLASHD_PORT: port, FLASHD_API_KEY: ADMIN_KEY }));
  t.equal(otherEndpoint.status, 1);
  t.equal(otherEndpoint.stderr, `flashd worker-env: 404: Endpoint zzzzzzzzzzzzzz not found.${hint}`);
  const given = await run(process.execPath, [BUNDLE, 'worker-env', 'zzzzzzzzzzzzzz', '--url', a.url], cleanEnv({ FLASHD_API_KEY: ADMIN_KEY }));
  t.equal(given.stderr, 'flashd worker-env: 404: Endpoint zzzzzzzzzzzzzz not found.\n', 'with --url, the address is the one the user gave: no hint');
});
