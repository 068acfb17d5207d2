/**
 * The command line as a user meets it: the bundle `dist/flashd.mjs` (what `npm start` runs)
 * started as its own process. Flags, exit codes, the listening line, the first admin key and a
 * clean shutdown on SIGTERM.
 */
import t, { type Test } from 'tap';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { join } from 'node:path';
import configSchema from '../../schema/config.schema.json' with { type: 'json' };
import pkg from '../../package.json' with { type: 'json' };
import { cleanEnv, REPO_ROOT, run, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');
const node = process.execPath;

t.before(() => {
  // `npm test` builds dist/flashd.mjs once before tap; rebuilding here would race other files.
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
});

t.test('--help describes every flag and env variable of the config schema', async (t) => {
  const r = run(node, [BUNDLE, '--help']);
  t.equal(r.status, 0, 'exit 0');
  t.match(r.stdout, /Usage:/);
  const options = Object.entries(configSchema.properties) as [string, { 'x-flag'?: string; 'x-env'?: string; type?: unknown }][];
  for (const [key, o] of options) {
    // A boolean flag may stand alone, so its value is shown optional.
    const arg = o.type === 'boolean' ? '\\[true\\|false\\]$' : '<';
    if (o['x-flag']) t.match(r.stdout, new RegExp(`^\\s+${o['x-flag']} ${arg}`, 'm'), `${key}: flag ${o['x-flag']}`);
    if (o['x-env']) t.ok(r.stdout.includes(o['x-env']), `${key}: env ${o['x-env']}`);
  }
  t.match(r.stdout, /--config <file>/);
  t.equal(run(node, [BUNDLE, '-h']).stdout, r.stdout, '-h is the same');
});

t.test('--version prints the package version', async (t) => {
  const r = run(node, [BUNDLE, '--version']);
  t.equal(r.status, 0);
  t.equal(r.stdout, `flashd ${pkg.version}\n`);
});

t.test('a stray argument after --version, --help or help is a usage error (exit 2, one line naming it), not ignored', async (t) => {
  // Few runs: each starts node, which takes seconds on a loaded box.
  const cases: [string[], string][] = [
    [['--port', '9000', '--version', 'extra'], 'flashd: unexpected argument "extra": --version takes none (see flashd --help)\n'],
    [['-h', 'extra'], 'flashd: unexpected argument "extra": -h takes none (see flashd --help)\n'],
    [['help', 'extra'], 'flashd: unexpected argument "extra": help takes a command (serve, worker-env) or nothing (see flashd --help)\n'],
    [['server', '--help'], 'flashd: unknown command "server" (did you mean serve? see flashd --help)\n'],
    // Not echoed, as worker-env's other usage errors: one may be a key meant for --api-key.
    [['worker-env', 'ep', 'extra', '--help'], 'flashd worker-env: --help takes at most the endpoint id (got 2 arguments that are no option)\nUsage: flashd worker-env <endpoint_id> [options] (see flashd worker-env --help)\n'],
  ];
  for (const [args, stderr] of cases) {
    const r = run(node, [BUNDLE, ...args]);
    t.equal(r.status, 2, `${args.join(' ')}: exit 2`);
    t.equal(r.stderr, stderr, `${args.join(' ')}: names it`);
    t.equal(r.stdout, '', `${args.join(' ')}: nothing on stdout`);
  }
  // A flag's or an option's value is no stray argument.
  const version = run(node, [BUNDLE, '--data-dir', 'x', '--version', '--port', '1']);
  t.equal(version.status, 0, `flag values beside --version: exit 0 (${version.stderr})`);
  t.equal(version.stdout, `flashd ${pkg.version}\n`);
  const helpWorkerEnv = run(node, [BUNDLE, 'help', 'worker-env']);
  t.equal(helpWorkerEnv.status, 0, 'help worker-env: exit 0');
  t.match(helpWorkerEnv.stdout, /^Usage: flashd worker-env <endpoint_id>/, 'help worker-env is worker-env --help');
  const epHelp = run(node, [BUNDLE, 'worker-env', '--format', 'json', 'ep', '--help']);
  t.equal(epHelp.status, 0, 'worker-env --format json EP --help: exit 0');
  t.equal(epHelp.stdout, helpWorkerEnv.stdout, 'worker-env --format json EP --help: the help');
});

t.test('bad usage exits 2 with a message on stderr', async (t) => {
  const unknown = run(node, [BUNDLE, '--no-such-flag', '1']);
  t.equal(unknown.status, 2, 'unknown flag');
  t.match(unknown.stderr, /unknown flag --no-such-flag/);
  t.equal(unknown.stdout, '', 'nothing on stdout');

  const badValue = run(node, [BUNDLE, '--port', 'eighty']);
  t.equal(badValue.status, 2, 'non-integer port');
  t.match(badValue.stderr, /--port/);

  const outOfRange = run(node, [BUNDLE, '--port', '70000']);
  t.equal(outOfRange.status, 2, 'port out of range');
  t.match(outOfRange.stderr, /port/);

  const missing = run(node, [BUNDLE, '--data-dir']);
  t.equal(missing.status, 2, 'flag without a value');
  t.match(missing.stderr, /needs a value/);

  const swallowed = run(node, [BUNDLE, '--port', '--data-dir', 'X']);
  t.equal(swallowed.status, 2, 'flag without a value before another flag');
  t.equal(swallowed.stderr, 'flashd: invalid configuration: flag --port needs a value\n', 'the next flag is not taken as its value');

  const enumValue = run(node, [BUNDLE, '--log-level', 'loud']);
  t.equal(enumValue.status, 2, 'value outside an enum');
  t.match(enumValue.stderr, /flag --log-level: logLevel must be one of: debug, info, warn, error, silent\n$/);

  // Above 2^31-1 ms Node's setTimeout fires at once: every webhook try went out together.
  // Port 0 and a test dir, so that a build that accepts it serves nothing of the user's.
  const overflow = run(node, [BUNDLE, '--webhook-retry-delay-ms', '3000000000', '--port', '0', '--data-dir', testDataDir(t)]);
  t.equal(overflow.status, 2, 'a delay no timer can hold');
  t.match(overflow.stderr, /flag --webhook-retry-delay-ms: webhookRetryDelayMs must be <= 3600000\n$/);

  // `1` (meant as one second?) ran nvidia-smi back to back, each run initialising NVML.
  const busy = run(node, [BUNDLE, '--gpu-rediscover-ms', '1', '--port', '0', '--data-dir', testDataDir(t)]);
  t.equal(busy.status, 2, 'a rediscovery interval under a second');
  t.equal(busy.stderr, 'flashd: invalid configuration: flag --gpu-rediscover-ms: gpuRediscoverMs must be 0 (off) or at least 1000 (a second)\n');

  // The admin key is read from FLASHD_ADMIN_API_KEY only: a config file holding it is refused, before anything starts.
  const fileDir = testDataDir(t);
  const secretFile = join(fileDir, 'flashd.json');
  writeFileSync(secretFile, JSON.stringify({ adminApiKey: 'file-admin-key-0123456789' }));
  const secret = run(node, [BUNDLE, '--config', secretFile, '--port', '0', '--data-dir', join(fileDir, 'data')]);
  t.equal(secret.status, 2, 'adminApiKey in a config file');
  t.equal(secret.stderr, `flashd: invalid configuration: config file ${secretFile}: adminApiKey is read only from FLASHD_ADMIN_API_KEY, so the secret stays out of config files; remove it from the file\n`);
  t.notOk(existsSync(join(fileDir, 'data')), 'nothing started');

  const command = run(node, [BUNDLE, 'frobnicate']);
  t.equal(command.status, 2, 'unknown command');
  t.equal(command.stderr, 'flashd: unknown command "frobnicate" (see flashd --help)\n');
  const server = run(node, [BUNDLE, 'server', '--port', '0']);
  t.equal(server.status, 2, 'a command one letter off');
  t.equal(server.stderr, 'flashd: unknown command "server" (did you mean serve? see flashd --help)\n');
  t.equal(run(node, [BUNDLE, 'worker_env', 'ep']).stderr, 'flashd: unknown command "worker_env" (did you mean worker-env? see flashd --help)\n');

  const badEnv = run(node, [BUNDLE], cleanEnv({ FLASHD_PORT: 'x' }));
  t.equal(badEnv.status, 2, 'bad env value');
  t.match(badEnv.stderr, /FLASHD_PORT/);
});

/** A port that is certainly taken while the returned server lives. */
async function occupiedPort(t: Test): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as { port: number }).port;
}

t.test('starts on --port 0, answers /healthz, prints the first admin key once, exits 0 on SIGTERM', async (t) => {
  const dir = testDataDir(t);
  // Flags win over env: were FLASHD_PORT used, listening would fail on the taken port.
  const taken = await occupiedPort(t);
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir], cleanEnv({ FLASHD_PORT: String(taken) }));
  const url = new URL(f.url);
  t.equal(url.hostname, '127.0.0.1', 'default host');
  t.not(url.port, '0', 'the bound port is reported, not 0');
  t.not(url.port, String(taken), 'the flag won over FLASHD_PORT');

  const health = await fetch(`${f.url}/healthz`);
  t.equal(health.status, 200);
  t.same(await health.json(), { status: 'ok', version: pkg.version });

  const file = join(dir, 'admin-api-key');
  const key = readFileSync(file, 'utf8').trim();
  t.match(key, /^fd_usr_[A-Za-z0-9]{36}$/);
  t.equal(statSync(file).mode & 0o777, 0o600, 'admin-api-key is 0600');
  t.ok((await f.stdoutHolding(key)).includes(key), 'the key is printed on stdout');
  t.notOk(f.stderr().includes(key), 'and not in the log');
  const list = await fetch(`${f.url}/v2/serverless`, { headers: { authorization: `Bearer ${key}` } });
  t.equal(list.status, 200, 'the printed key works');
  t.same(await list.json(), []);
  t.equal((await fetch(`${f.url}/v2/serverless`)).status, 401, 'no key, no access');

  t.equal(await f.stop('SIGTERM'), 0, 'SIGTERM exits 0');
  t.match(f.stderr(), /shutting down signal=SIGTERM/);
  t.match(f.stderr().trimEnd().split('\n').at(-1), /info +stopped ms=\d+ exitCode=0$/, 'the last line says shutdown is over');
  t.ok(existsSync(join(dir, 'flashd.db')), 'database in --data-dir');

  const again = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir], cleanEnv());
  t.notOk(again.stdout().includes('fd_usr_'), 'no key printed on a second start');
  t.equal((await fetch(`${again.url}/v2/serverless`, { headers: { authorization: `Bearer ${key}` } })).status, 200, 'the key survives a restart');
  t.equal(await again.stop('SIGINT'), 0, 'SIGINT exits 0 too');
});

t.test('a data directory others may write: tightened to 0700 with a warning when flashd owns it, else refused (exit 1)', async (t) => {
  const dir = testDataDir(t);
  chmodSync(dir, 0o777);
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv());
  t.equal(statSync(dir).mode & 0o7777, 0o700, 'made 0700');
  t.match(f.stderr(), /warn\s+data directory was writable by group or others: made owner-only .*oldMode=0777 newMode=0700/);
  t.equal(await f.stop(), 0);
  if (process.getuid?.() !== 0) return;
  const other = testDataDir(t);
  chownSync(other, 65534, 65534);
  chmodSync(other, 0o777);
  const r = run(node, [BUNDLE, '--port', '0', '--data-dir', other, '--runtime', 'none']);
  t.equal(r.status, 1, 'another user\'s: exit 1');
  t.match(r.stderr, `flashd: cannot start: data directory ${other} is writable by group or others (mode 0777) and owned by uid 65534`);
  t.equal(statSync(other).mode & 0o7777, 0o777, 'left as it was');
  t.notOk(existsSync(join(other, 'flashd.db')), 'nothing made in it');
});

t.test('a data directory flashd cannot write: exit 1 naming the path, the uid and the cause, not SQLite\'s bare text', async (t) => {
  // As root, run flashd as nobody (root may write anything); else as this user.
  const root = process.getuid?.() === 0;
  const uid = root ? 65534 : (process.getuid?.() as number);
  // `env -i`: tap adds its process-info hook to a child's environment, and as nobody the hook failed to write under .tap.
  // CAP_DAC_READ_SEARCH (read and search, never write): nobody can then load the bundle from a
  // checkout in a directory only root may enter (a clone under /root or a mktemp -d), while
  // writes keep nobody's own permissions, which is what the test is about.
  const as = (args: string[]) => (root
    ? run('env', ['-i', `PATH=${process.env['PATH'] ?? '/usr/bin:/bin'}`, `TMPDIR=${nobodyTmp}`, 'setpriv', '--reuid', '65534', '--regid', '65534', '--clear-groups', '--inh-caps=+dac_read_search', '--ambient-caps=+dac_read_search', node, BUNDLE, ...args])
    : run(node, [BUNDLE, ...args]));
  // In the system's temporary directory, not under the checkout: nobody must be able to reach the
  // data directories through every parent (access(2) checks as the real user, without the
  // capability above), or every case would fail on the path instead of on the directory tested.
  const parent = mkdtempSync(join(tmpdir(), 'flashd-perm-'));
  t.teardown(() => rmSync(parent, { recursive: true, force: true }));
  chmodSync(parent, 0o755);
  const own = (dir: string) => {
    mkdirSync(dir);
    if (root) chownSync(dir, 65534, 65534);
    return dir;
  };
  // nobody's home (/nonexistent) cannot hold flashd's cache: the uWS copy goes to $TMPDIR/flashd-65534, kept in here.
  const nobodyTmp = own(join(parent, 'tmp'));

  const readOnly = own(join(parent, 'read-only'));
  chmodSync(readOnly, 0o500);
  const r1 = as(['--port', '0', '--data-dir', readOnly, '--runtime', 'none']);
  t.equal(r1.status, 1, 'mode 0500: exit 1');
  t.equal(r1.stderr, `flashd: cannot start: data directory ${readOnly} is not writable by uid ${uid} (EACCES); it is owned by uid ${uid} with mode 0500. `
    + 'Give flashd\'s user a directory it can write (chown it to that user, chmod 700), or choose another --data-dir\n');
  chmodSync(readOnly, 0o700);
  if (!root) return;

  const rootOwned = join(parent, 'root-owned');
  mkdirSync(rootOwned, { mode: 0o700 });
  const r2 = as(['--port', '0', '--data-dir', rootOwned, '--runtime', 'none']);
  t.equal(r2.status, 1, 'root\'s 0700 directory: exit 1');
  t.match(r2.stderr, `flashd: cannot start: data directory ${rootOwned} is not writable by uid 65534 (EACCES); it is owned by uid 0 with mode 0700.`);

  // A database left by a run as root: SQLite said "attempt to write a readonly database".
  const leftByRoot = own(join(parent, 'left-by-root'));
  writeFileSync(join(leftByRoot, 'flashd.db'), '', { mode: 0o644 });
  const r3 = as(['--port', '0', '--data-dir', leftByRoot, '--runtime', 'none']);
  t.equal(r3.status, 1, 'root\'s flashd.db: exit 1');
  t.match(r3.stderr, `flashd: cannot start: ${join(leftByRoot, 'flashd.db')} in the data directory is not writable by uid 65534 (EACCES); it is owned by uid 0 with mode 0644.`);
  t.notMatch(r1.stderr + r2.stderr + r3.stderr, /unable to open|readonly database/);
});

t.test('a SIGTERM while flashd is still starting stops it cleanly once started (exit 0, not 143)', async (t) => {
  const dir = testDataDir(t);
  const child = spawn(node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], { env: cleanEnv(), stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  let first = '';
  // The first log line (the store's migrations) comes from inside the start, before it listens.
  child.stderr.on('data', (chunk: Buffer) => {
    if (stderr === '') {
      first = chunk.toString();
      child.kill('SIGTERM');
    }
    stderr += chunk.toString();
  });
  const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
  t.notMatch(first, /flashd listening/, 'the signal was sent before it listened');
  t.equal(signal, null, 'not killed by the signal');
  t.equal(code, 0, 'exit 0, as a SIGTERM after the start');
  t.match(stderr, /shutting down signal=SIGTERM/);
});

t.test('FLASHD_* env configures the server without flags', async (t) => {
  const dir = testDataDir(t);
  const adminKey = 'cli-test-admin-key-0123456789';
  const f = await startFlashd(t, node, [BUNDLE], cleanEnv({ FLASHD_PORT: '0', FLASHD_DATA_DIR: dir, FLASHD_ADMIN_API_KEY: adminKey, FLASHD_LOG_FORMAT: 'json' }));
  t.equal((await fetch(`${f.url}/healthz`)).status, 200);
  const r = await fetch(`${f.url}/v2/serverless`, { headers: { authorization: `Bearer ${adminKey}` } });
  t.equal(r.status, 200, 'FLASHD_ADMIN_API_KEY is a valid admin key');
  t.notOk(existsSync(join(dir, 'admin-api-key')), 'no generated key file');
  t.notOk(f.stdout().includes('fd_usr_'), 'no key printed');
  t.notOk(f.stderr().includes(adminKey), 'the env key is never logged');
  const listening = f.stderr().split('\n').find((l) => l.includes('flashd listening'));
  t.match(JSON.parse(listening ?? '{}'), { level: 'info', msg: 'flashd listening' }, 'FLASHD_LOG_FORMAT=json');
  t.ok(existsSync(join(dir, 'flashd.db')), 'database in FLASHD_DATA_DIR');
  t.equal(await f.stop(), 0);
});

t.test('an unknown FLASHD_* variable is warned about once at start, with the setting it probably meant', async (t) => {
  const env = cleanEnv({
    FLASHD_PORT: '0', FLASHD_DATA_DIR: testDataDir(t), FLASHD_PROT: '1234', FLASHD_SESION_TTL: '60',
    // worker-env's, the native loader's and the tests' own: not settings, and no warning.
    FLASHD_API_KEY: 'client-side-key-0123456789', FLASHD_URL: 'http://127.0.0.1:8000', FLASHD_NATIVE_DIR: '', FLASHD_TEST_ANYTHING: '1',
    // The typo that matters most: flashd then makes an admin key of its own instead of the one meant.
    FLASHD_ADMIN_KEY: 'meant-admin-key-0123456789',
  });
  const f = await startFlashd(t, node, [BUNDLE], env);
  const warned = f.stderr().split('\n').filter((l) => l.includes('unknown FLASHD_ variable'));
  t.same(warned.map((l) => l.replace(/^.*?warn\s+/, 'warn ')), [
    'warn unknown FLASHD_ variable ignored name=FLASHD_PROT didYouMean=FLASHD_PORT',
    'warn unknown FLASHD_ variable ignored name=FLASHD_SESION_TTL didYouMean=FLASHD_SESSION_TTL',
    'warn unknown FLASHD_ variable ignored name=FLASHD_ADMIN_KEY didYouMean=FLASHD_ADMIN_API_KEY',
  ], 'each once, with the closest name; the value is not logged');
  t.notMatch(f.stderr(), /client-side-key|meant-admin-key/, 'no value is logged');
  t.equal(await f.stop(), 0);
});

t.test('an empty FLASHD_ADMIN_API_KEY (FLASHD_ADMIN_API_KEY=${SECRET} with the secret missing) is warned about before a key is made', async (t) => {
  const dir = testDataDir(t);
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv({ FLASHD_ADMIN_API_KEY: '' }));
  const warned = f.stderr().split('\n').filter((l) => l.includes('name=FLASHD_ADMIN_API_KEY'));
  t.equal(warned.length, 1, `one line: ${f.stderr()}`);
  t.match(warned[0], /warn +secret variable set but empty: ignored, as if unset name=FLASHD_ADMIN_API_KEY /);
  t.match(await f.stdoutHolding(/First start: created an admin API key/), /First start: created an admin API key/, 'a key is made, as when unset');
  t.ok(existsSync(join(dir, 'admin-api-key')));
  t.equal(await f.stop(), 0);
});

t.test('a --data-dir that names a regular file: exit 1 saying it is not a directory, not "cannot create"', async (t) => {
  const file = join(testDataDir(t), 'not-a-dir');
  writeFileSync(file, 'x');
  const r = run(node, [BUNDLE, '--port', '0', '--data-dir', file]);
  t.equal(r.status, 1);
  t.match(r.stderr, `data directory ${file} is not a directory`);
  t.notMatch(r.stderr, /cannot create|EEXIST/);
});

t.test('a port flashd may not bind says permission denied, not "address in use or not permitted"', async (t) => {
  // uWS gives no errno; flashd tries the port again with Node's net to name the cause.
  let unprivileged = 1024;
  try {
    unprivileged = Number(readFileSync('/proc/sys/net/ipv4/ip_unprivileged_port_start', 'utf8'));
  } catch {
    // Not Linux: ports below 1024 are privileged.
  }
  if (unprivileged === 0) {
    t.pass('every port is unprivileged here', { skip: 'net.ipv4.ip_unprivileged_port_start=0' });
    return;
  }
  const port = String(Math.min(unprivileged, 1024) - 1);
  // As root, run flashd as root without CAP_NET_BIND_SERVICE (dropped from its bounding set:
  // root may otherwise bind any port). Not as nobody: a checkout under a 0700 directory (CI's
  // mktemp, /root) is out of nobody's reach, node_modules included.
  const root = process.getuid?.() === 0;
  const parent = mkdtempSync(join(tmpdir(), 'flashd-port-'));
  t.teardown(() => rmSync(parent, { recursive: true, force: true }));
  const args = [BUNDLE, '--port', port, '--data-dir', join(parent, 'data'), '--runtime', 'none'];
  const r = root
    ? run('setpriv', ['--bounding-set', '-net_bind_service', '--inh-caps', '-net_bind_service', node, ...args])
    : run(node, args);
  t.equal(r.status, 1, 'exit 1, as before');
  t.equal(r.stderr.split('\n').filter((l) => l.startsWith('flashd:')).join('\n'),
    `flashd: cannot start: cannot listen on 127.0.0.1:${port}: permission denied: ports below 1024 need root or CAP_NET_BIND_SERVICE`);
});

t.test('--log-format json: a start that fails ends with one JSON line (level error), not a text line', async (t) => {
  const isJson = (line: string) => {
    try {
      return typeof JSON.parse(line) === 'object';
    } catch {
      return false;
    }
  };
  const lastLine = (stderr: string) => JSON.parse(stderr.trimEnd().split('\n').pop() ?? '') as Record<string, unknown>;

  // A bad data directory (flag), and a port already in use (env): every line on stderr is JSON.
  const file = join(testDataDir(t), 'not-a-dir');
  writeFileSync(file, 'x');
  const badDir = run(node, [BUNDLE, '--port', '0', '--data-dir', file, '--runtime', 'none', '--log-format', 'json']);
  t.equal(badDir.status, 1, 'bad data dir: exit 1, as in text');
  t.ok(badDir.stderr.trimEnd().split('\n').every(isJson), `bad data dir: only JSON lines: ${badDir.stderr}`);
  t.match(lastLine(badDir.stderr), { level: 'error', msg: 'cannot start', err: { message: `data directory ${file} is not a directory (a file of that name exists): choose another --data-dir` } });
  t.notMatch(badDir.stderr, /"stack"/, 'no stack trace, as in text');

  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const port = (server.address() as { port: number }).port;
  const inUse = run(node, [BUNDLE, '--data-dir', testDataDir(t), '--runtime', 'none'], cleanEnv({ FLASHD_PORT: String(port), FLASHD_LOG_FORMAT: 'json' }));
  t.equal(inUse.status, 1, 'port in use: exit 1, as in text');
  t.ok(inUse.stderr.trimEnd().split('\n').every(isJson), `port in use: only JSON lines: ${inUse.stderr}`);
  t.match(lastLine(inUse.stderr), { level: 'error', msg: 'cannot start', err: { message: `cannot listen on 127.0.0.1:${port}: address already in use (another flashd or program listens there; pick --port)` } });

  // A configuration error (exit 2) stays one text line: the configuration it comes from is not
  // valid, so no log format has been chosen yet.
  const badConfig = run(node, [BUNDLE, '--log-format', 'json', '--port', 'eighty']);
  t.equal(badConfig.status, 2);
  t.match(badConfig.stderr, /^flashd: invalid configuration: flag --port/, 'configuration errors stay text');
});
