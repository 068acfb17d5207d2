/**
 * Settings: defaults < --config file < FLASHD_* env < flags; `--flag value` and `--flag=value`;
 * every bad value listed at once; unknown flags refused; --help text covering every option.
 */
import t from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import configSchema from '../../schema/config.schema.json' with { type: 'json' };
import { closestName, closestSetting, configHelp, loadConfig, parseFlags } from '../../src/config/index.js';
import { AgentError } from '../../src/core/errors.js';

type Option = { 'x-flag'?: string; 'x-env'?: string; default?: unknown; description: string; type?: unknown };
const OPTIONS = Object.entries(configSchema.properties) as [string, Option][];

function failure(fn: () => unknown): AgentError {
  try {
    fn();
  } catch (err) {
    if (err instanceof AgentError) return err;
    throw err;
  }
  throw new Error('expected a configuration error');
}

t.test('defaults suit a single machine', async (t) => {
  const c = loadConfig();
  t.equal(c.host, '127.0.0.1');
  t.equal(c.port, 8000);
  t.equal(c.dataDir, './data');
  t.same([c.rateLimitMinute, c.rateLimitHour, c.rateLimitDay], [600, 18000, 200000]);
  t.same([c.publicUrl, c.endpointHost, c.endpointScheme, c.dataCenterId], [null, null, 'http', 'LOCAL-1']);
  t.equal(c.adminApiKey, null);
  t.ok(Object.isFrozen(c), 'read once and frozen');
  for (const [key, o] of OPTIONS) {
    if ('default' in o) t.same((c as unknown as Record<string, unknown>)[key], o.default, `${key} defaults to the schema default`);
  }
});

t.test('env FLASHD_* and flags; flags win', async (t) => {
  const env = { FLASHD_HOST: '0.0.0.0', FLASHD_PORT: '9000', FLASHD_DATA_DIR: '/srv/flashd', FLASHD_RATE_LIMIT_MINUTE: '10', FLASHD_RATE_LIMIT_HOUR: '100', FLASHD_RATE_LIMIT_DAY: '1000' };
  const fromEnv = loadConfig({ env });
  t.same([fromEnv.host, fromEnv.port, fromEnv.dataDir], ['0.0.0.0', 9000, '/srv/flashd'], 'env overrides defaults');
  t.same([fromEnv.rateLimitMinute, fromEnv.rateLimitHour, fromEnv.rateLimitDay], [10, 100, 1000], 'rate-limit env');
  const both = loadConfig({ env, argv: ['--host', '127.0.0.2', '--port=9100', '--data-dir=/tmp/x', '--rate-limit-minute', '20', '--rate-limit-hour=200', '--rate-limit-day', '2000'] });
  t.same([both.host, both.port, both.dataDir], ['127.0.0.2', 9100, '/tmp/x'], 'flags override env, in both --flag value and --flag=value forms');
  t.same([both.rateLimitMinute, both.rateLimitHour, both.rateLimitDay], [20, 200, 2000], 'rate-limit flags');
  t.equal(loadConfig({ argv: ['--port', '9001', '--port', '9002'] }).port, 9002, 'the last flag wins');
  t.equal(loadConfig({ env: { FLASHD_PORT: '' } }).port, 8000, 'an empty env var is unset');
  t.equal(loadConfig({ argv: ['--data-dir=a=b'] }).dataDir, 'a=b', 'only the first = splits');
  t.equal(loadConfig({ env: { FLASHD_ADMIN_API_KEY: 'automation-key-0123456789' } }).adminApiKey, 'automation-key-0123456789', 'the admin key comes from env');
  t.same(parseFlags(['--port', '1234']).values, { port: 1234 });
});

t.test('a --config file sits between defaults and env', async (t) => {
  const dir = t.testdir();
  const file = join(dir, 'flashd.json');
  writeFileSync(file, JSON.stringify({ port: 7000, host: '10.0.0.1', dataDir: '/from-file' }));
  const c = loadConfig({ argv: ['--config', file], env: { FLASHD_HOST: '10.0.0.2' } });
  t.same([c.port, c.host, c.dataDir], [7000, '10.0.0.2', '/from-file'], 'file over defaults, env over file');
  t.equal(loadConfig({ argv: [`--config=${file}`, '--port', '7001'] }).port, 7001, 'flags over file');
  writeFileSync(join(dir, 'typo.json'), JSON.stringify({ prot: 1 }));
  t.match(failure(() => loadConfig({ argv: ['--config', join(dir, 'typo.json')] })).message, /unknown setting "prot"/);
  t.match(failure(() => loadConfig({ argv: ['--config', join(dir, 'missing.json')] })).message, /cannot read config file/);
  // A key Object.prototype has was looked up there: "[object Object]: unknown setting "__proto__"".
  writeFileSync(join(dir, 'proto.json'), '{"__proto__": 1, "constructor": 2}');
  const proto = failure(() => loadConfig({ argv: ['--config', join(dir, 'proto.json')] }));
  t.same(proto.errors, [`config file ${join(dir, 'proto.json')}: unknown setting "__proto__"`, `config file ${join(dir, 'proto.json')}: unknown setting "constructor"`],
    'labelled with the file like any other unknown setting');
  // The admin key is env only (--help says so): a file holding it was taken, and the log said "from environment".
  writeFileSync(join(dir, 'secret.json'), JSON.stringify({ port: 7000, adminApiKey: 'file-admin-key-0123456789' }));
  const secret = failure(() => loadConfig({ argv: ['--config', join(dir, 'secret.json')] }));
  t.same(secret.errors, [`config file ${join(dir, 'secret.json')}: adminApiKey is read only from FLASHD_ADMIN_API_KEY, so the secret stays out of config files; remove it from the file`]);
  t.notMatch(secret.message, /file-admin-key/, 'the value is not echoed');
  t.equal(loadConfig({ env: { FLASHD_ADMIN_API_KEY: 'env-admin-key-0123456789' } }).adminApiKey, 'env-admin-key-0123456789', 'env still sets it');
  // The file's names are the schema's (sessionTtlSeconds for --session-ttl): an unknown one names the closest.
  writeFileSync(join(dir, 'names.json'), JSON.stringify({ sessionTtl: 3600, 'log-level': 'debug', prot: 1, FLASHD_DATA_DIR: '/x', zzzz: 1, adminKey: 'k' }));
  const names = join(dir, 'names.json');
  t.same(failure(() => loadConfig({ argv: ['--config', names] })).errors, [
    `config file ${names}: unknown setting "sessionTtl" (did you mean "sessionTtlSeconds"?)`,
    `config file ${names}: unknown setting "log-level" (did you mean "logLevel"?)`,
    `config file ${names}: unknown setting "prot" (did you mean "port"?)`,
    `config file ${names}: unknown setting "FLASHD_DATA_DIR" (did you mean "dataDir"?)`,
    `config file ${names}: unknown setting "zzzz"`,
    `config file ${names}: unknown setting "adminKey"`,
  ], 'the closest name, never the env-only admin key, nothing when none is close');
  writeFileSync(join(dir, 'array.json'), '[1]');
  t.match(failure(() => loadConfig({ argv: ['--config', join(dir, 'array.json')] })).message, /JSON object/);
});

t.test('every bad value is listed, with where it came from', async (t) => {
  const err = failure(() => loadConfig({
    argv: ['--port', '70000', '--rate-limit-minute', 'lots', '--log-level', 'chatty'],
    env: { FLASHD_RATE_LIMIT_HOUR: '0', FLASHD_RATE_LIMIT_DAY: 'x', FLASHD_PUBLIC_URL: 'ftp://nope' },
  }));
  t.equal(err.code, 'VALIDATION_FAILED');
  const errors = err.errors ?? [];
  t.equal(errors.length, 6, `six errors: ${JSON.stringify(errors)}`);
  t.ok(errors.some((e) => /^flag --port: port must be <= 65535/.test(e)), 'out-of-range flag');
  t.ok(errors.some((e) => /^flag --rate-limit-minute: .*integer.*"lots"/.test(e)), 'unparseable flag');
  t.ok(errors.includes('flag --log-level: logLevel must be one of: debug, info, warn, error, silent'), 'bad enum flag, with the allowed values');
  t.ok(errors.some((e) => /^env FLASHD_RATE_LIMIT_HOUR: rateLimitHour must be >= 1/.test(e)), 'out-of-range env');
  t.ok(errors.some((e) => /^env FLASHD_RATE_LIMIT_DAY: .*integer/.test(e)), 'unparseable env');
  t.ok(errors.includes('env FLASHD_PUBLIC_URL: publicUrl must be scheme://host[:port] (http or https), without a path, query or credentials, e.g. http://192.168.1.20:8000'),
    'bad pattern env, said as the form wanted, not as a regular expression');
  t.match(err.message, /^invalid configuration: /);
  for (const [argv, re] of [
    [['--port', '-1'], /port must be >= 0/],
    [['--port', '80.5'], /integer/],
    [['--host', ''], /host must NOT have fewer than 1 characters/],
    [['--endpoint-scheme', 'ftp'], /endpointScheme must be one of: http, https$/],
    [['--data-center-id', 'has space'], /dataCenterId must be 1 to 32 letters, digits or hyphens/],
    [['--endpoint-host', 'http://lb.example.com'], /endpointHost must be host\[:port\], without a scheme or path/],
    [['--max-body-bytes', '10'], /maxBodyBytes must be >= 1024/],
  ] as [string[], RegExp][]) {
    t.match(failure(() => loadConfig({ argv })).message, re, argv.join(' '));
  }
});

t.test('--gpu-rediscover-ms is 0 (off) or at least a second, not nvidia-smi back to back', async (t) => {
  t.equal(loadConfig({ argv: ['--gpu-rediscover-ms', '0'] }).gpuRediscoverMs, 0, '0: only at start');
  t.equal(loadConfig({ argv: ['--gpu-rediscover-ms', '1000'] }).gpuRediscoverMs, 1000, 'a second');
  for (const v of ['1', '500', '999']) {
    t.same(failure(() => loadConfig({ argv: ['--gpu-rediscover-ms', v] })).errors,
      ['flag --gpu-rediscover-ms: gpuRediscoverMs must be 0 (off) or at least 1000 (a second)'], `--gpu-rediscover-ms ${v}: one error that says what is allowed`);
  }
  t.same(failure(() => loadConfig({ env: { FLASHD_GPU_REDISCOVER_MS: '10' } })).errors,
    ['env FLASHD_GPU_REDISCOVER_MS: gpuRediscoverMs must be 0 (off) or at least 1000 (a second)'], 'from env too');
  t.match(failure(() => loadConfig({ argv: ['--gpu-rediscover-ms', '-5'] })).message, /gpuRediscoverMs must be >= 0/, 'negative: as before');
});

t.test('--image-pull-idle-timeout-ms 0 is refused saying how to come close to off: a stalled pull must not hold its GPUs for good', async (t) => {
  for (const v of ['0', '999']) {
    t.same(failure(() => loadConfig({ argv: ['--image-pull-idle-timeout-ms', v] })).errors,
      ['flag --image-pull-idle-timeout-ms: imagePullIdleTimeoutMs must be at least 1000 (a second); it cannot be turned off, as a stalled pull would hold its worker\'s GPUs for good: the most, 86400000 (a day), comes closest'], v);
  }
  t.match(failure(() => loadConfig({ argv: ['--image-pull-idle-timeout-ms', '99999999999'] })).message, /imagePullIdleTimeoutMs must be <= 86400000$/, 'above: as before');
  t.equal(loadConfig({ argv: ['--image-pull-idle-timeout-ms', '86400000'] }).imagePullIdleTimeoutMs, 86400000);
});

t.test('base URLs: a trailing slash is dropped; a path, query or credentials are refused without echoing them', async (t) => {
  const config = loadConfig({ argv: ['--public-url', 'http://192.168.1.20:8000/'], env: { FLASHD_WORKER_URL: 'https://[fd00::2]:8443/' } });
  t.equal(config.publicUrl, 'http://192.168.1.20:8000', 'publicUrl without its trailing slash');
  t.equal(config.workerUrl, 'https://[fd00::2]:8443', 'workerUrl (IPv6) without its trailing slash');
  t.equal(loadConfig({ argv: ['--public-url', 'https://gpu.example.com'] }).publicUrl, 'https://gpu.example.com', 'no slash: as given');
  for (const bad of ['http://user:secret@gpu.example.com', 'http://gpu.example.com/v2', 'http://gpu.example.com?x=1', 'http://gpu.example.com//', 'gpu.example.com:8000']) {
    const err = failure(() => loadConfig({ argv: ['--public-url', bad] }));
    t.equal(err.message, 'invalid configuration: flag --public-url: publicUrl must be scheme://host[:port] (http or https), without a path, query or credentials, e.g. http://192.168.1.20:8000', bad);
  }
  t.notMatch(failure(() => loadConfig({ env: { FLASHD_WORKER_URL: 'http://user:secret@10.0.0.1' } })).message, /secret/, 'the credentials are not echoed');
});

t.test('base URLs: a port outside 1-65535 or a host no URL can hold is refused at start, not in every URL built on it', async (t) => {
  for (const bad of ['http://example.com:99999', 'http://example.com:65536', 'http://example.com:0', 'https://[zz]:8000']) {
    const err = failure(() => loadConfig({ argv: ['--public-url', bad] }));
    t.equal(err.message, 'invalid configuration: flag --public-url: publicUrl must be a URL with a valid host and a port from 1 to 65535, e.g. http://192.168.1.20:8000', bad);
  }
  const worker = failure(() => loadConfig({ env: { FLASHD_WORKER_URL: 'http://172.17.0.1:70000' } }));
  t.equal(worker.message, 'invalid configuration: env FLASHD_WORKER_URL: workerUrl must be a URL with a valid host and a port from 1 to 65535, e.g. http://172.17.0.1:8000');
  t.equal(loadConfig({ argv: ['--worker-url', 'http://172.17.0.1:65535'] }).workerUrl, 'http://172.17.0.1:65535', '65535 is a port');
});

t.test('--endpoint-host: a bad port, an empty or dashed label, an IP address or no host is refused at start, each by name, not found in every LOAD_BALANCER requestUrl', async (t) => {
  const refused = (bad: string, what: string) => t.equal(failure(() => loadConfig({ argv: ['--endpoint-host', bad] })).message,
    `invalid configuration: flag --endpoint-host: endpointHost must ${what}, e.g. lb.example.com or lb.localhost:8000`, bad);
  for (const bad of ['lb.example.com:99999', 'lb.example.com:65536', 'lb.example.com:0', 'a:065535', 'lb.example.com:080']) refused(bad, 'have a port from 1 to 65535 (no leading zero)');
  for (const bad of ['lb..example.com', '.lb.example.com', 'lb.example.com.']) refused(bad, 'be a host name without empty labels');
  for (const bad of ['-lb.example.com', 'lb-.example.com', 'lb.example.com-', 'lb.-example.com:8000']) refused(bad, "be a host name whose labels neither start nor end with '-'");
  // `{id}.1.2.3.4` resolves to nothing: every requestUrl would be unreachable.
  for (const bad of ['1.2.3.4', '127.0.0.1:8000', 'lb.123']) refused(bad, 'be a host name, not an IP address: the endpoint URLs {id}.{endpoint-host} would not resolve');
  // An empty host is named as such, not taken for a malformed value; so is the port beside it.
  refused(':99999', 'have a host name before the port and have a port from 1 to 65535 (no leading zero)');
  refused(':0', 'have a host name before the port and have a port from 1 to 65535 (no leading zero)');
  refused(':8000', 'have a host name before the port');
  t.match(failure(() => loadConfig({ env: { FLASHD_ENDPOINT_HOST: 'lb.example.com:0' } })).message, /^invalid configuration: env FLASHD_ENDPOINT_HOST: endpointHost must have a port from 1 to 65535 /, 'from env too');
  t.equal(loadConfig({ argv: ['--endpoint-host', 'lb.example.com:65535'] }).endpointHost, 'lb.example.com:65535', '65535 is a port');
  t.equal(loadConfig({ argv: ['--endpoint-host', 'localhost'] }).endpointHost, 'localhost', 'one label');
  t.equal(loadConfig({ argv: ['--endpoint-host', 'x-1.lb-2.example.com:1'] }).endpointHost, 'x-1.lb-2.example.com:1', "'-' inside a label, digits in a label, port 1");
  // Host names are case-insensitive: the URLs built on it are written as a URL parser writes them.
  t.equal(loadConfig({ argv: ['--endpoint-host', 'LB.Example.COM:80'] }).endpointHost, 'lb.example.com:80', 'upper case is accepted, written in lower case');
});

t.test('unknown flags and missing values', async (t) => {
  const unknown = failure(() => loadConfig({ argv: ['--prot', '9000'] }));
  t.match(unknown.message, /unknown flag --prot \(did you mean --port\? see flashd --help\)/, 'the closest flag, as a config file\'s unknown setting gets');
  t.match(failure(() => loadConfig({ argv: ['--zzzzzz', '1'] })).message, /unknown flag --zzzzzz \(see flashd --help\)/, 'nothing close: no suggestion');
  t.match(failure(() => loadConfig({ argv: ['--port'] })).message, /flag --port needs a value/);
  // A bare word is no flag: a command after the flags is told to come first, not called an unknown flag.
  t.equal(failure(() => loadConfig({ argv: ['--port', '9000', 'serve'] })).message, 'invalid configuration: the command serve must come before the flags: flashd serve [flags] (see flashd --help)', 'serve after the flags');
  t.equal(failure(() => loadConfig({ argv: ['worker-env'] })).message, 'invalid configuration: the command worker-env must come before the flags: flashd worker-env [flags] (see flashd --help)', 'worker-env after the flags');
  t.equal(failure(() => loadConfig({ argv: ['--port', '9000', 'server'] })).message, 'invalid configuration: unexpected argument "server": not a flag, and a command (serve, worker-env) comes before the flags (see flashd --help)', 'any other word');
  t.equal(loadConfig({ argv: ['--data-dir', 'serve'] }).dataDir, 'serve', "a flag's value may be such a word");
  // The admin key is env only (flags show in ps): the flag says where it goes, as a config file does, never echoing the value.
  for (const argv of [['--admin-api-key', 'flag-admin-key-0123456789'], ['--admin-api-key=flag-admin-key-0123456789'], ['--admin-key', 'flag-admin-key-0123456789']]) {
    const err = failure(() => loadConfig({ argv }));
    t.same(err.errors, [`unknown flag ${(argv[0] as string).split('=')[0]}: the admin key is read only from FLASHD_ADMIN_API_KEY, so it stays out of ps and shell history (see flashd --help)`], argv.join(' '));
    t.notMatch(err.message, /flag-admin-key/, 'the value is not echoed');
  }
  // A single-dash flag's value is not a second unknown flag (that was "unknown flag -p …; unknown flag 9000 …").
  t.same(failure(() => loadConfig({ argv: ['-p', '9000'] })).errors, ['unknown flag -p (flashd has long flags only, such as --port; see flashd --help)'], '-p 9000: one error');
  t.same(failure(() => loadConfig({ argv: ['-port', '9000', '--host', 'x'] })).errors, ['unknown flag -port (did you mean --port? see flashd --help)'], '-port: its long form');
  // A left-out value does not swallow the next flag (that was "port must be an integer, got
  // "--data-dir"; unknown flag X").
  const swallowed = failure(() => loadConfig({ argv: ['--port', '--data-dir', 'X'] }));
  t.same(swallowed.errors, ['flag --port needs a value'], 'the next flag is not taken as the value');
  t.same(failure(() => loadConfig({ argv: ['--config', '--port', '1'] })).errors, ['flag --config needs a value']);
  t.equal(loadConfig({ argv: ['--process-workdir=--odd'] }).processWorkdir, '--odd', 'a value starting with -- goes after =');
  const many = failure(() => loadConfig({ argv: ['--prot', '1', '--hots', 'x', '--port', 'y'] }));
  t.equal(many.errors?.length, 3, `all listed: ${JSON.stringify(many.errors)}`);
  t.throws(() => parseFlags(['--nope']), /unknown flag --nope/);
});

t.test('a boolean flag stands alone or takes a value', async (t) => {
  t.equal(loadConfig({ argv: ['--webhook-allow-private'] }).webhookAllowPrivate, true, 'last, alone');
  const before = loadConfig({ argv: ['--webhook-allow-private', '--port', '1'] });
  t.same([before.webhookAllowPrivate, before.port], [true, 1], 'alone before another flag');
  t.equal(loadConfig({ argv: ['--webhook-allow-private', 'false'] }).webhookAllowPrivate, false, 'with a value');
  t.equal(loadConfig({ argv: ['--webhook-allow-private=off'] }).webhookAllowPrivate, false, 'with =value');
  t.match(failure(() => loadConfig({ argv: ['--webhook-allow-private', 'maybe'] })).message, /webhookAllowPrivate must be true or false, got "maybe"/);
});

/** Milliseconds, seconds and microseconds settings, by their names; each ends up in a timer or a deadline. */
const TIME_UNITS: [RegExp, number][] = [[/Ms$/, 1], [/Seconds$/, 1000], [/Us$/, 0.001]];

t.test('every time setting has a cap a Node timer can hold', async (t) => {
  // setTimeout takes at most 2^31-1 ms; above it Node warns and fires at once, so a
  // --webhook-retry-delay-ms of 3000000000 sent all webhook tries together.
  const timed = OPTIONS.filter(([key]) => TIME_UNITS.some(([re]) => re.test(key))) as [string, Option & { maximum?: number }][];
  t.ok(timed.length >= 7, `found the time settings: ${timed.map(([k]) => k).join(', ')}`);
  for (const [key, o] of timed) {
    const perUnit = (TIME_UNITS.find(([re]) => re.test(key)) as [RegExp, number])[1];
    const max = o.maximum;
    t.type(max, 'number', `${key} has a maximum`);
    if (max === undefined) continue;
    t.ok(max * perUnit <= 2 ** 31 - 1, `${key}: ${max} fits a timer`);
    t.ok((o.default as number) <= max, `${key}: the default ${String(o.default)} is allowed`);
    const flag = o['x-flag'] as string;
    t.match(failure(() => loadConfig({ argv: [flag, String(max + 1)] })).message, new RegExp(`${flag}: ${key} must be <= ${max}$`), `${flag} above its cap`);
    t.equal((loadConfig({ argv: [flag, String(max)] }) as unknown as Record<string, number>)[key], max, `${flag} at its cap`);
  }
  t.match(failure(() => loadConfig({ argv: ['--webhook-retry-delay-ms', '3000000000'] })).message, /flag --webhook-retry-delay-ms: webhookRetryDelayMs must be <= 3600000/);
  t.match(failure(() => loadConfig({ env: { FLASHD_SESSION_TTL: '99999999999' } })).message, /env FLASHD_SESSION_TTL: sessionTtlSeconds must be <= 604800/);
});

t.test('configHelp describes every option', async (t) => {
  const help = configHelp();
  for (const [key, o] of OPTIONS) {
    // A boolean flag may stand alone: its value is shown optional, with the values it takes.
    const arg = o.type === 'boolean' ? '\\[true\\|false\\]$' : '<';
    if (o['x-flag']) t.match(help, new RegExp(`^\\s+${o['x-flag']} ${arg}`, 'm'), `${key}: ${o['x-flag']}`);
    if (o['x-env']) t.match(help, new RegExp(`env: ${o['x-env']}$`, 'm'), `${key}: ${o['x-env']}`);
    // The name to use in a --config file, for each setting a file may hold (not the env-only admin key).
    if (o['x-flag']) t.match(help, new RegExp(`^\\s+${o['x-flag']} .*\\n(?:\\s{6}.*\\n)*?\\s{6}config file: "${key}"$`, 'm'), `${key}: its config-file name under ${o['x-flag']}`);
    t.ok(help.includes(o.description), `${key}: description`);
    if (o.default !== undefined && o.default !== null) t.ok(help.includes(`(default: ${JSON.stringify(o.default)}`), `${key}: default shown`);
    // A bound that only an error showed (--lease-ms >= 1000, --take-hold-ms <= 85000) is in the help, compactly.
    const { minimum, maximum } = o as { minimum?: number; maximum?: number };
    if (o['x-flag'] && (minimum !== undefined || maximum !== undefined)) {
      t.match(help, new RegExp(`^\\s+${o['x-flag']} .*\\n\\s{6}.*; (?:[0-9]+ or )?${minimum === undefined ? 'at most ' : maximum === undefined ? 'at least ' : ''}[0-9.]+\\)\\n`, 'm'), `${key}: its bounds shown`);
    }
  }
  t.match(help, /\(default: 300000; 1000\.\.86400000\)\n/, '--image-pull-idle-timeout-ms: min..max');
  t.match(help, /\(default: 60000; 0 or 1000\.\.86400000\)\n/, '--gpu-rediscover-ms: the range its `not` leaves');
  t.match(help, /\(default: 1048576; at least 1024\)\n/, '--max-body-bytes: a minimum only');
  t.match(help, /\(default: 55000; 100\.\.85000\)\n/, '--take-hold-ms');
  t.notMatch(help, /config file: "adminApiKey"/, 'the admin key has no config-file name');
  for (const flag of ['--host', '--port', '--data-dir', '--rate-limit-minute', '--rate-limit-hour', '--rate-limit-day']) {
    t.ok(help.includes(flag), `${flag} in --help`);
  }
});

t.test('engine sockets: $DOCKER_HOST unix:// is a candidate; another scheme is named as passed over, without its address', async (t) => {
  const unix = loadConfig({ env: { DOCKER_HOST: 'unix:///srv/docker.sock' } });
  t.same(unix.containerSocketCandidates.slice(0, 1), ['/srv/docker.sock']);
  t.equal(unix.dockerHostSkipped, null);
  const tcp = loadConfig({ env: { DOCKER_HOST: 'tcp://10.0.0.9:2375' } });
  t.equal(tcp.dockerHostSkipped, 'tcp://', 'tcp:// passed over');
  t.notOk(tcp.containerSocketCandidates.some((c) => c.includes('10.0.0.9')), 'and not a candidate');
  t.equal(loadConfig({ env: { DOCKER_HOST: 'ssh://admin@gpu-box' } }).dockerHostSkipped, 'ssh://', 'the user name in it is not kept');
  t.equal(loadConfig({ env: { DOCKER_HOST: 'tcp://10.0.0.9:2375' }, argv: ['--container-socket', '/run/podman/podman.sock'] }).dockerHostSkipped, null,
    'not asked about when --container-socket names the socket');
  t.equal(loadConfig({ env: {} }).dockerHostSkipped, null);
});

t.test('FLASHD_* variables that are neither settings nor read elsewhere are listed, with the closest name', async (t) => {
  const c = loadConfig({ env: {
    FLASHD_PROT: '1234', FLASHD_LOGLEVEL: 'debug', FLASHD_ZZZZZZ: '1', FLASHD_PORT: '9000',
    FLASHD_API_KEY: 'k', FLASHD_URL: 'http://x', FLASHD_WORKER_ENV_TIMEOUT_MS: '1', FLASHD_NATIVE_DIR: '/n', FLASHD_UWS_UNPATCHED: '1',
    FLASHD_TEST_GPU: '1', FLASHD_BENCH_WORKER_IMAGE: 'i', FLASHD_CI_CACHE: '/c', FLASHD_ADMIN_API_KEY: 'admin-key-0123456789',
  } });
  t.equal(c.port, 9000);
  t.same(c.unknownEnv, [
    { name: 'FLASHD_PROT', didYouMean: 'FLASHD_PORT' },
    { name: 'FLASHD_LOGLEVEL', didYouMean: 'FLASHD_LOG_LEVEL' },
    { name: 'FLASHD_ZZZZZZ' },
  ], 'known client, loader, test and bench variables are not listed');
  t.same(loadConfig({ env: {} }).unknownEnv, []);
});

t.test('near-misses of FLASHD_ADMIN_API_KEY name it: such a typo leaves flashd with another admin key than the one meant', async (t) => {
  const names = ['FLASHD_ADMIN_KEY', 'FLASHD_ADMIN_TOKEN', 'FLASHD_ADMINKEY', 'FLASHD_ADMIN_API_KEY_FILE', 'FLASHD_ADMIN_PASSWORD', 'flashd_admin_api_key'];
  const c = loadConfig({ env: Object.fromEntries(names.map((n) => [n, 'meant-admin-key-0123456789'])) });
  t.same(c.unknownEnv, names.map((name) => ({ name, didYouMean: 'FLASHD_ADMIN_API_KEY' })));
  t.equal(c.adminApiKey, null, 'none of them is taken');
  t.same(loadConfig({ env: { FLASHD_ADMIN_USER: 'me' } }).unknownEnv, [{ name: 'FLASHD_ADMIN_USER' }], 'admin without key, token, secret or password: no guess');
});

t.test('an empty FLASHD_ADMIN_API_KEY (a secret missing from the deploy) is unset, and listed to be warned about', async (t) => {
  const c = loadConfig({ env: { FLASHD_ADMIN_API_KEY: '' } });
  t.equal(c.adminApiKey, null, 'as unset: no key of that value');
  t.same(c.emptySecretEnv, ['FLASHD_ADMIN_API_KEY']);
  t.same(loadConfig({ env: {} }).emptySecretEnv, [], 'unset: nothing to say');
  t.same(loadConfig({ env: { FLASHD_PORT: '' } }).emptySecretEnv, [], 'an empty setting that is no secret: unset, as before, with no warning');
});

t.test('a one-letter typo of a name is suggested before a shorter name it begins with', async (t) => {
  const workerEnv = ['url', 'api-key', 'api-key-file', 'data-dir', 'format', 'gpu'];
  // Was --api-key, which it begins with: the key file's path then went in as the key.
  t.equal(closestName('api-key-flie', workerEnv), 'api-key-file', 'a transposition near the end');
  t.equal(closestName('api-key-fille', workerEnv), 'api-key-file', 'a doubled letter');
  t.equal(closestName('api-key-fle', workerEnv), 'api-key-file', 'a dropped letter');
  // A prefix still wins where no name is a typo away, and breaks a tie between typos.
  t.equal(closestName('api-kye-file', workerEnv), 'api-key-file');
  t.equal(closestName('form', workerEnv), 'format', 'a name it begins');
  t.equal(closestName('api-keys', workerEnv), 'api-key', 'one letter more than api-key');
  t.equal(closestName('worker', ['serve', 'worker-env', 'help']), 'worker-env');
  t.equal(closestName('server', ['serve', 'worker-env', 'help']), 'serve');
  t.equal(closestName('frobnicate', ['serve', 'worker-env', 'help']), undefined);
  t.equal(closestSetting('sessionTtl'), 'sessionTtlSeconds');
  t.equal(closestSetting('prot'), 'port');
  t.equal(closestSetting('FLASHD_ADMIN_KEY', { secrets: true }), 'adminApiKey');
});
