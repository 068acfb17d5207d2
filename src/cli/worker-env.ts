/**
 * `flashd worker-env <endpoint_id>`: asks a running flashd for a new worker id and key and
 * prints the environment an external worker needs (GET /v2/serverless/{id}/worker-env).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { closestName } from '../config/index.js';

export const WORKER_ENV_USAGE = `Usage: flashd worker-env <endpoint_id> [options]

Prints the environment a worker needs to serve <endpoint_id>: a new worker id and a worker key
that can only take and post jobs for that endpoint, and the job URLs under both flashd's names
(VENDOR_*) and RunPod's (RUNPOD_*), so the runpod SDK works unchanged. Run one worker per
printed environment. QUEUE endpoints only: a LOAD_BALANCER endpoint's workers take no jobs.
The key stays valid until revoked (DELETE /v2/api-keys/<key id>, the id printed in a comment;
GET /v2/api-keys?kind=worker lists them) or until the endpoint is deleted.

Options:
  --url <url>          flashd to ask (default: FLASHD_URL, else http://127.0.0.1:<FLASHD_PORT or 8000>),
                       without a user name, password, ?query or #fragment;
                       plain http:// to another machine sends the API key (and brings the worker
                       key back) unencrypted: allowed, with a warning on stderr
  --api-key-file <f>   read the admin API key from file <f>, or from stdin with -
  --api-key <key>      the admin API key itself: other users of this machine can see it in ps,
                       so prefer FLASHD_API_KEY or --api-key-file
  --data-dir <dir>     where to find admin-api-key (default: FLASHD_DATA_DIR, else ./data);
                       it does not say which flashd to ask: for one not at the default, give --url
  --format <fmt>       dotenv (default): KEY=value with values as they are, for docker/podman run
                       --env-file (not for docker compose's env_file, which would expand $ID, nor
                       for a shell); shell: export KEY='value', for . ./worker.env (sh, bash) and
                       for docker compose's env_file (single quotes keep $ID); json
  --gpu <name>         GPU name the worker reports in its URLs (default: gpu or cpu from the endpoint)
  -h, --help           show this help

The API key is the first of --api-key, --api-key-file, FLASHD_API_KEY, FLASHD_ADMIN_API_KEY and <data-dir>/admin-api-key
(a flashd started with FLASHD_ADMIN_API_KEY writes no admin-api-key file); when flashd refuses it
(401, 403), the error says which of these it came from.
Each run registers a new worker and a worker key that stays valid until it is revoked or the
endpoint is deleted: keep the file it is written to private (umask 077) and out of version control.

Example:
  (umask 077; flashd worker-env abc123def456gh --format shell > worker.env) && . ./worker.env && python3 handler.py
  pass show flashd | flashd worker-env abc123def456gh --api-key-file - --url https://flashd.example.lan
`;

/** Whether a URL's host is this machine only (127.0.0.0/8, also as ::ffff:127.x.y.z, ::1, localhost). */
function isLoopback(raw: string): boolean {
  try {
    const host = new URL(raw).hostname.replace(/^\[|\]$/g, '');
    return host === 'localhost' || host.endsWith('.localhost') || host === '::1' || /^127\./.test(host) || /^::ffff:7f[0-9a-f]{2}:/.test(host);
  } catch {
    return false;
  }
}

/** Whether `raw` is an absolute http(s) URL that fetch can ask. */
function isHttpUrl(raw: string): boolean {
  try {
    const u = new URL(raw);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '';
  } catch {
    return false;
  }
}

/** Whether `raw` parses as a URL with a user name or password (`http://user:pass@host`). */
function hasCredentials(raw: string): boolean {
  try {
    const u = new URL(raw);
    return u.username !== '' || u.password !== '';
  } catch {
    return false;
  }
}

const shellQuote = (v: string) => `'${v.replace(/'/g, `'\\''`)}'`;

/**
 * How long to wait for the whole answer: a server that accepts the connection and never
 * answers would otherwise hang the command for ever. FLASHD_WORKER_ENV_TIMEOUT_MS replaces it
 * for tests only (not in the usage text), so they need not wait 10 s.
 */
const DEFAULT_TIMEOUT_MS = 10_000;

function timeoutOf(env: NodeJS.ProcessEnv): number {
  const ms = Number(env['FLASHD_WORKER_ENV_TIMEOUT_MS']);
  return Number.isInteger(ms) && ms > 0 ? ms : DEFAULT_TIMEOUT_MS;
}

/** `text` parsed, or why it is not JSON, quoted short on one line. */
function parseJson(text: string): { value: unknown } | { notJson: string } {
  try {
    return { value: JSON.parse(text) };
  } catch {
    return { notJson: `not JSON: ${JSON.stringify(text.length > 60 ? `${text.slice(0, 60)}…` : text)}` };
  }
}

/** The `detail` of a flashd error body (problem+json), on one line; undefined for any other body. */
function problemDetail(parsed: { value: unknown } | { notJson: string }): string | undefined {
  const detail = 'value' in parsed ? (parsed.value as { detail?: unknown } | null)?.detail : undefined;
  return typeof detail === 'string' ? detail.replace(/\s*\n\s*/g, ' ') : undefined;
}

/** The answer's shape, checked: a 200 from something other than flashd must not print garbage. */
function workerEnvBody(text: string): { workerId: string; keyId?: string; env: Record<string, string> } | string {
  const parsed = parseJson(text);
  if ('notJson' in parsed) return parsed.notJson;
  const body = parsed.value;
  const b = body as { workerId?: unknown; keyId?: unknown; env?: unknown } | null;
  const env = b?.env;
  if (typeof b?.workerId !== 'string' || typeof env !== 'object' || env === null || Array.isArray(env) || !Object.values(env).every((v) => typeof v === 'string')) {
    return 'no workerId and env in its JSON';
  }
  // keyId is optional so this command still works against a flashd from before it was added.
  return typeof b.keyId === 'string'
    ? { workerId: b.workerId, keyId: b.keyId, env: env as Record<string, string> }
    : { workerId: b.workerId, env: env as Record<string, string> };
}

/** Why a fetch failed: its cause's message (an AggregateError's first, for a name with several addresses). */
function fetchFailure(err: Error): string {
  const cause = (err as { cause?: unknown }).cause as { message?: string; code?: string; errors?: { message?: string }[] } | undefined;
  return cause?.message || cause?.errors?.[0]?.message || cause?.code || err.message;
}

/** worker-env's options that take a value (-h and --help apart). */
const OPTIONS = ['url', 'api-key', 'api-key-file', 'data-dir', 'format', 'gpu'] as const;
const FORMATS = ['dotenv', 'shell', 'json'];

/**
 * A usage error: the cause, then the usage line. The whole help after it (40 lines) pushed the
 * cause off the top of a terminal; `flashd` itself answers a bad flag with one line too.
 */
function usageError(message: string): number {
  process.stderr.write(`flashd worker-env: ${message}\nUsage: flashd worker-env <endpoint_id> [options] (see flashd worker-env --help)\n`);
  return 2;
}

/** What a bad option probably meant, for its error: another option, or --url for the server's --port and --host. */
function badOption(arg: string): string {
  if (!arg.startsWith('--')) return `bad option ${arg} (worker-env has long options only, such as --format)`;
  const eq = arg.indexOf('=');
  const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2);
  if (closestName(name, ['port', 'host']) !== undefined) return `bad option ${arg} (to reach a flashd on another port or host, give --url http://HOST:PORT)`;
  const meant = closestName(name, OPTIONS);
  return `bad option ${arg}${meant === undefined ? '' : ` (did you mean --${meant}?)`}`;
}

export async function workerEnvCommand(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const opts: Record<string, string> = {};
  const positional: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '--help' || a === '-h') {
      // `worker-env $EP --help` is fine; a second bare word is a mistake, as without --help.
      const words = args.filter((w, j) => !w.startsWith('-') && !((OPTIONS as readonly string[]).includes((args[j - 1] ?? '').slice(2)) && (args[j - 1] ?? '').startsWith('--')));
      if (words.length > 1) return usageError(`--help takes at most the endpoint id (got ${words.length} arguments that are no option)`);
      process.stdout.write(WORKER_ENV_USAGE);
      return 0;
    }
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq > 0 ? a.slice(2, eq) : a.slice(2);
      if (!(OPTIONS as readonly string[]).includes(name)) return usageError(badOption(a));
      // `--api-key $KEY --format shell` with KEY unset: taking --format as the key would end in
      // a confusing "name exactly one endpoint id" about the now stray `shell`.
      const next = args[i + 1];
      if (eq < 0 && (next === undefined || next.startsWith('--'))) return usageError(`option --${name} needs a value`);
      const value = eq > 0 ? a.slice(eq + 1) : (args[++i] as string);
      opts[name] = value;
    } else if (a.startsWith('-') && a !== '-') {
      // `-f json`: taken for two more endpoint ids, it said "name exactly one endpoint id".
      return usageError(badOption(a));
    } else positional.push(a);
  }
  const endpointId = positional[0];
  const format = opts['format'] ?? 'dotenv';
  if (positional.length !== 1) {
    // Not echoed: one may be a key meant for --api-key (`worker-env $EP $KEY`).
    return usageError(positional.length === 0 ? 'name exactly one endpoint id' : `name exactly one endpoint id (got ${positional.length} arguments that are no option)`);
  }
  if (!FORMATS.includes(format)) return usageError(`unknown format ${JSON.stringify(format.length > 32 ? `${format.slice(0, 32)}…` : format)} (dotenv, shell or json)`);
  // An empty FLASHD_URL or FLASHD_PORT counts as unset, as the server's FLASHD_* settings do.
  const url = (opts['url'] ?? (env['FLASHD_URL'] || `http://127.0.0.1:${env['FLASHD_PORT'] || '8000'}`)).replace(/\/+$/, '');
  const source = opts['url'] !== undefined ? '--url' : env['FLASHD_URL'] ? 'FLASHD_URL' : 'FLASHD_PORT';
  // Before anything echoes the URL: fetch refuses a URL with credentials (its message, said as
  // "cannot reach", would print the password twice), and the key is what flashd checks anyway.
  if (hasCredentials(url)) {
    process.stderr.write(`flashd worker-env: ${source} must not hold a user name or password (the API key is what flashd checks), such as http://127.0.0.1:8000\n`);
    return 2;
  }
  // worker-env appends /v2/serverless/…: after a ?query or #fragment that path is not a path
  // (a baffling 404). Not echoed: a query may hold a token as well.
  if (/[?#]/.test(url)) {
    process.stderr.write(`flashd worker-env: ${source} must not hold a ?query or #fragment: worker-env adds the path and query itself; give the base URL such as http://127.0.0.1:8000\n`);
    return 2;
  }
  // `--url localhost:8000` (no scheme) would otherwise be reported as flashd not answering there.
  if (!isHttpUrl(url)) {
    process.stderr.write(`flashd worker-env: ${source} must give an http:// or https:// URL such as http://127.0.0.1:8000, got ${JSON.stringify(url)}\n`);
    return 2;
  }
  if (opts['api-key'] !== undefined && opts['api-key-file'] !== undefined) {
    process.stderr.write(`flashd worker-env: give --api-key or --api-key-file, not both\n\n${WORKER_ENV_USAGE}`);
    return 2;
  }
  let key = opts['api-key'];
  // Where the key came from, said when flashd refuses it (never the key): a stale FLASHD_API_KEY
  // left in the shell hides FLASHD_ADMIN_API_KEY, and a plain 401 gave no hint of it.
  let keySource = '--api-key';
  const keyFile = opts['api-key-file'];
  if (keyFile !== undefined) {
    keySource = keyFile === '-' ? '--api-key-file -, stdin' : `--api-key-file ${keyFile}`;
    // A file or a pipe keeps the key off the command line, which every user of the machine can read (ps).
    const from = keyFile === '-' ? 'stdin' : keyFile;
    try {
      key = readFileSync(keyFile === '-' ? 0 : keyFile, 'utf8').trim();
    } catch (err) {
      process.stderr.write(`flashd worker-env: cannot read the API key from ${from}: ${(err as Error).message}\n`);
      return 2;
    }
    if (!key) {
      process.stderr.write(`flashd worker-env: ${from} holds no API key (it is empty)\n`);
      return 2;
    }
  }
  // FLASHD_ADMIN_API_KEY is the server's name for the same key: one env file sourced for both
  // (a systemd unit's, compose's) then serves worker-env too. Empty counts as unset.
  if (key === undefined && env['FLASHD_API_KEY']) {
    key = env['FLASHD_API_KEY'];
    keySource = env['FLASHD_ADMIN_API_KEY'] ? 'FLASHD_API_KEY, which is read before FLASHD_ADMIN_API_KEY' : 'FLASHD_API_KEY';
  } else if (key === undefined && env['FLASHD_ADMIN_API_KEY']) {
    key = env['FLASHD_ADMIN_API_KEY'];
    keySource = 'FLASHD_ADMIN_API_KEY';
  }
  if (!key) {
    const file = join(opts['data-dir'] ?? env['FLASHD_DATA_DIR'] ?? './data', 'admin-api-key');
    keySource = file;
    try {
      key = readFileSync(file, 'utf8').trim();
    } catch {
      process.stderr.write(`flashd worker-env: no API key: set FLASHD_API_KEY (or FLASHD_ADMIN_API_KEY), pass --api-key-file (- for stdin) or --api-key, or run where ${file} exists (a flashd started with FLASHD_ADMIN_API_KEY writes no such file: give that key)\n`);
      return 2;
    }
  }
  // Homelab LANs often run plain http, so this is a warning, not an error: said before the key is sent.
  if (new URL(url).protocol === 'http:' && !isLoopback(url)) {
    process.stderr.write(`flashd worker-env: warning: sending the API key to ${new URL(url).host} over plain http, unencrypted, and the worker key comes back the same way; anyone on the network path can read both (use an https:// URL, or run worker-env on flashd's machine)\n`);
  }
  const query = opts['gpu'] ? `?gpu=${encodeURIComponent(opts['gpu'])}` : '';
  const timeoutMs = timeoutOf(env);
  let res: Response;
  let text: string;
  try {
    // The signal bounds the body too: a server may send its headers and then stall.
    res = await fetch(`${url}/v2/serverless/${encodeURIComponent(endpointId as string)}/worker-env${query}`, { headers: { authorization: `Bearer ${key}` }, signal: AbortSignal.timeout(timeoutMs) });
    text = await res.text();
  } catch (err) {
    const e = err as Error;
    // fetch says only "fetch failed"; the reason (connect ECONNREFUSED …, getaddrinfo ENOTFOUND …)
    // is its cause. Asked at the default address, the likely fix is --url: flashd on another --port.
    const hint = opts['url'] === undefined && !env['FLASHD_URL'] ? ' For a flashd on another port or machine, give --url http://HOST:PORT (or set FLASHD_URL)' : '';
    // flashd's own port speaks plain http only and never answers a TLS handshake: an https:// URL
    // of it waits out the limit, and "no answer" alone reads as flashd being down or hung.
    const tls = new URL(url).protocol === 'https:'
      ? `; flashd itself serves plain http only (https:// is for a TLS proxy in front of it): if this is flashd's own port, try --url http://${new URL(url).host}`
      : '';
    process.stderr.write(e.name === 'TimeoutError'
      ? `flashd worker-env: no answer from ${url} within ${timeoutMs / 1000} s${tls}\n`
      : `flashd worker-env: cannot reach flashd at ${url}: ${fetchFailure(e)}; is it running?${hint}\n`);
    return 1;
  }
  if (!res.ok) {
    // flashd's errors are problem+json with a detail; anything else (another service on that
    // port, a proxy's HTML error page) is said on one line, as for a 200 that is not flashd's.
    const parsed = parseJson(text);
    const detail = problemDetail(parsed);
    const from = res.status === 401 || res.status === 403 ? ` (key from ${keySource})` : '';
    // Asked at the default address, a key or endpoint unknown there most likely belongs to another
    // flashd on this machine (its --data-dir given, not its --url): say which one refused it.
    const asked = (res.status === 401 || res.status === 404) && opts['url'] === undefined && !env['FLASHD_URL']
      ? ` Asked ${url}, the default address: for a flashd on another port or machine, give --url http://HOST:PORT (or set FLASHD_URL).`
      : '';
    process.stderr.write(detail !== undefined
      ? `flashd worker-env: ${res.status}: ${detail}${from}${asked}\n`
      : `flashd worker-env: ${url} did not answer like flashd (HTTP ${res.status}, ${'notJson' in parsed ? parsed.notJson : 'no detail in its JSON'})\n`);
    return 1;
  }
  const body = workerEnvBody(text);
  if (typeof body === 'string') {
    process.stderr.write(`flashd worker-env: ${url} did not answer like flashd (${body})\n`);
    return 1;
  }
  // Asked over the network, answered with loopback URLs: a worker on that other machine would
  // poll itself. Said on stderr, so the environment on stdout stays usable.
  const jobUrl = body.env['RUNPOD_WEBHOOK_GET_JOB'];
  if (jobUrl && isLoopback(jobUrl) && !isLoopback(url)) {
    process.stderr.write(`flashd worker-env: warning: the job URLs point at ${new URL(jobUrl).host}, which a worker on another machine cannot reach; start flashd with --public-url http://<address other machines use>:<port>\n`);
  }
  if (format === 'json') process.stdout.write(JSON.stringify(body, null, 2) + '\n');
  else {
    const lines = Object.entries(body.env).map(([k, v]) => (format === 'shell' ? `export ${k}=${shellQuote(v)}` : `${k}=${v}`));
    // The URLs hold a literal $ID that the worker fills in: say which tools read each format as it is.
    const use = format === 'shell'
      ? '# single-quoted: for . ./file (sh, bash) and docker compose env_file; docker run --env-file needs --format dotenv'
      : '# values as they are: for docker/podman run --env-file; docker compose env_file and shells need --format shell';
    // Loopback job URLs (the default --public-url) are the container's own loopback inside a
    // container: `docker run --env-file` of this file would poll nothing, for ever.
    const container = jobUrl && isLoopback(jobUrl)
      ? `# the job URLs point at ${new URL(jobUrl).host}, this machine's loopback: a worker in a container reaches it only with --network host (docker/podman run --network host --env-file …; network_mode: host in docker compose), or start flashd with --public-url http://<an address the container reaches>:<port>\n`
      : '';
    const revoke = body.keyId ? `# its key is ${body.keyId}: see it with GET /v2/api-keys?kind=worker, revoke it with DELETE /v2/api-keys/${body.keyId}\n` : '';
    process.stdout.write(`# worker ${body.workerId} for endpoint ${endpointId}\n${revoke}${use}\n${container}${lines.join('\n')}\n`);
  }
  return 0;
}
