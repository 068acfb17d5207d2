/**
 * Config is read once, here and nowhere else: embedded defaults < `--config` JSON file <
 * FLASHD_* env < flags. The schema in `schema/config.schema.json` holds every default,
 * bound, flag name and env name; `--help` is printed from it too.
 */
import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import configSchema from '../../schema/config.schema.json' with { type: 'json' };
import { AgentError } from '../core/errors.js';
import { checkKeyFormat } from '../core/key-format.js';
import { closestName, nameScore, normalizeName } from '../core/names.js';

/** Near-miss names live in core/names.ts (the job API's query hints use them too); the CLI takes them from here. */
export { closestName };

export interface FlashdConfig {
  readonly host: string;
  readonly port: number;
  readonly dataDir: string;
  readonly publicUrl: string | null;
  readonly endpointHost: string | null;
  readonly endpointScheme: 'http' | 'https';
  readonly dataCenterId: string;
  readonly rateLimitMinute: number;
  readonly rateLimitHour: number;
  readonly rateLimitDay: number;
  readonly jobRateLimitPercent: number;
  readonly maxBodyBytes: number;
  readonly sqliteSynchronous: 'full' | 'normal';
  readonly sessionTtlSeconds: number;
  readonly runtime: 'auto' | 'docker' | 'none' | 'process';
  readonly containerSocket: string | null;
  readonly workerUrl: string | null;
  readonly leaseMs: number;
  readonly takeHoldMs: number;
  readonly pollSpinUs: number;
  readonly maxAttempts: number;
  readonly gpuRediscoverMs: number;
  readonly containerGpuDriver: 'auto' | 'nvidia' | 'cdi';
  readonly imagePullIdleTimeoutMs: number;
  readonly workerStopGraceMs: number;
  readonly workerInitTimeoutMs: number;
  readonly webhookAllowPrivate: boolean;
  readonly webhookRetryDelayMs: number;
  readonly processWorkdir: string | null;
  readonly logLevel: 'debug' | 'info' | 'warn' | 'error' | 'silent';
  readonly logFormat: 'text' | 'json';
  readonly adminApiKey: string | null;
  /**
   * Derived, not a setting: where `--runtime auto|docker` looks for an engine socket, in
   * order. `containerSocket` alone when it is set; else $DOCKER_HOST (unix://), the Docker
   * and rootful Podman paths, and rootless Podman's under $XDG_RUNTIME_DIR.
   */
  readonly containerSocketCandidates: readonly string[];
  /**
   * Derived: the scheme of a `$DOCKER_HOST` that is not `unix://` (`tcp://`, `ssh://`), which
   * flashd does not use, so the "no engine found" line can say why it was passed over; else null.
   */
  readonly dockerHostSkipped: string | null;
  /**
   * Derived: the `FLASHD_*` environment variables that are neither a setting nor read elsewhere
   * (OTHER_FLASHD_VARIABLES), each with the setting's variable it probably meant (`FLASHD_PROT`:
   * `FLASHD_PORT`), for one warning each at start: a typo in a unit's `Environment=` would
   * otherwise leave the default in place without a word.
   */
  readonly unknownEnv: readonly { readonly name: string; readonly didYouMean?: string }[];
  /**
   * Derived: the variables of secret settings (FLASHD_ADMIN_API_KEY) set but empty, for one
   * warning each at start. Empty is unset, as for every variable, but an empty secret is most
   * often one missing from the deploy (`FLASHD_ADMIN_API_KEY=${SECRET}` with SECRET unset), and
   * flashd would then make an admin key of its own without a word.
   */
  readonly emptySecretEnv: readonly string[];
}

interface OptionSchema {
  type?: string | string[];
  enum?: string[];
  default?: unknown;
  description: string;
  'x-flag'?: string;
  'x-env'?: string;
  'x-secret'?: boolean;
  /** What a value failing `pattern` should look like, said instead of the regular expression. */
  'x-pattern-hint'?: string;
  /** What a value caught by `not` (a range refused inside the bounds) should be instead. */
  'x-not-hint'?: string;
  /** What a value under `minimum` should be instead, said in place of `must be >= n`. */
  'x-minimum-hint'?: string;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  not?: { minimum?: number; maximum?: number };
}

type DerivedKey = 'containerSocketCandidates' | 'dockerHostSkipped' | 'unknownEnv' | 'emptySecretEnv';
type SettingKey = Exclude<keyof FlashdConfig, DerivedKey>;
const properties = configSchema.properties as unknown as Record<SettingKey, OptionSchema>;

export interface LoadConfigInput {
  argv?: readonly string[];
  env?: Readonly<Record<string, string | undefined>>;
  /** Values that win over everything (tests). */
  overrides?: Partial<Omit<FlashdConfig, DerivedKey>>;
}

function containerSocketCandidates(explicit: unknown, env: Readonly<Record<string, string | undefined>>): string[] {
  if (typeof explicit === 'string') return [explicit];
  const out: string[] = [];
  const dockerHost = env['DOCKER_HOST'];
  if (dockerHost?.startsWith('unix://')) out.push(dockerHost.slice('unix://'.length));
  out.push('/var/run/docker.sock', '/run/podman/podman.sock');
  if (env['XDG_RUNTIME_DIR']) out.push(`${env['XDG_RUNTIME_DIR']}/podman/podman.sock`);
  return out;
}

function isIntegerOption(schema: OptionSchema): boolean {
  return schema.type === 'integer' || (Array.isArray(schema.type) && schema.type.includes('integer'));
}

/** A raw string from a flag or env var as the option's type; an error string when it cannot be. */
function coerce(key: string, schema: OptionSchema, raw: string, source: string): { value: unknown } | { error: string } {
  if (schema.type === 'boolean') {
    if (/^(1|true|yes|on)$/i.test(raw)) return { value: true };
    if (/^(0|false|no|off)$/i.test(raw)) return { value: false };
    return { error: `${source}: ${key} must be true or false, got ${JSON.stringify(raw)}` };
  }
  if (isIntegerOption(schema)) {
    if (!/^-?\d+$/.test(raw.trim())) return { error: `${source}: ${key} must be an integer, got ${JSON.stringify(raw)}` };
    return { value: Number(raw) };
  }
  return { value: raw };
}

interface ParsedFlags {
  values: Record<string, unknown>;
  /** The flag each value came from, for error messages. */
  sources: Record<string, string>;
  configFile?: string;
  errors: string[];
  /** Bare words that are neither a flag nor a flag's value. */
  stray: string[];
}

function collectFlags(argv: readonly string[]): ParsedFlags {
  const byFlag = new Map<string, [string, OptionSchema]>();
  for (const [key, schema] of Object.entries(properties)) {
    if (schema['x-flag']) byFlag.set(schema['x-flag'], [key, schema]);
  }
  // Null-prototype: a key such as "__proto__" or "constructor" must not find Object.prototype's.
  const out: ParsedFlags = { values: {}, sources: Object.create(null) as Record<string, string>, errors: [], stray: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    const inline = eq > 0 ? arg.slice(eq + 1) : undefined;
    const take = (): string | undefined => {
      if (inline !== undefined) return inline;
      const next = argv[i + 1];
      // `--port --data-dir x`: the value was left out, and taking the next flag as it would
      // report a confusing error and then its own value as an unknown flag.
      if (next === undefined || next.startsWith('--')) {
        out.errors.push(`flag ${name} needs a value`);
        return undefined;
      }
      i++;
      return next;
    };
    if (name === '--config') {
      const file = take();
      if (file !== undefined) out.configFile = file;
      continue;
    }
    // A bare word is no flag: `flashd --port 9000 serve` put the command after the flags.
    if (!arg.startsWith('-')) {
      out.stray.push(arg);
      out.errors.push(arg === 'serve' || arg === 'worker-env'
        ? `the command ${arg} must come before the flags: flashd ${arg} [flags] (see flashd --help)`
        : `unexpected argument ${JSON.stringify(arg)}: not a flag, and a command (serve, worker-env) comes before the flags (see flashd --help)`);
      continue;
    }
    const entry = byFlag.get(name);
    if (!entry) {
      // As a config file's unknown setting: `--prot` names `--port` (and `-port` too). Only a name
      // that has a flag; a secret's (`--admin-api-key`) is said to be read from its variable only.
      const hint = name.startsWith('-') ? closestSetting(name, { secrets: true }) : undefined;
      const schema = hint === undefined ? undefined : properties[hint as SettingKey];
      const flag = schema?.['x-flag'];
      if (schema?.['x-secret']) out.errors.push(`unknown flag ${name}: the admin key is read only from ${schema['x-env'] ?? 'the environment'}, so it stays out of ps and shell history (see flashd --help)`);
      else if (flag === undefined && /^-[^-]/.test(name)) out.errors.push(`unknown flag ${name} (flashd has long flags only, such as --port; see flashd --help)`);
      else out.errors.push(`unknown flag ${name} (${flag === undefined ? '' : `did you mean ${flag}? `}see flashd --help)`);
      // Its value, if it has one, is not another unknown flag (`-p 9000`).
      const next = argv[i + 1];
      if (inline === undefined && next !== undefined && (name.startsWith('--') ? !next.startsWith('--') : name.startsWith('-') && !next.startsWith('-'))) i++;
      continue;
    }
    const [key, schema] = entry;
    const bare = schema.type === 'boolean' && inline === undefined && (argv[i + 1] === undefined || (argv[i + 1] as string).startsWith('--'));
    const raw = bare ? 'true' : take();
    if (raw === undefined) continue;
    const result = coerce(key, schema, raw, `flag ${name}`);
    if ('error' in result) {
      out.errors.push(result.error);
      delete out.values[key];
      continue;
    }
    out.values[key] = result.value;
    out.sources[key] = `flag ${name}`;
  }
  return out;
}

/**
 * The bare words of `argv` that are neither a flag nor a flag's value (`extra` in
 * `--port 9000 extra`), for `flashd --help` and `--version`, which read no flags.
 */
export function strayArguments(argv: readonly string[]): string[] {
  return collectFlags(argv).stray;
}

/** Parses `--flag value` and `--flag=value`. Unknown flags are an error listing the valid ones. */
export function parseFlags(argv: readonly string[]): { values: Record<string, unknown>; configFile?: string } {
  const { values, configFile, errors } = collectFlags(argv);
  if (errors.length) throw new AgentError('VALIDATION_FAILED', errors.join('; '), { errors });
  return configFile === undefined ? { values } : { values, configFile };
}

/**
 * Whether a name that is no setting probably meant a secret one: `FLASHD_ADMIN_KEY`,
 * `FLASHD_ADMIN_TOKEN` and `--admin-key` are too far from `FLASHD_ADMIN_API_KEY` for a typo,
 * and such a miss is the one that matters (another admin key than the one meant).
 */
function secretNearMiss(wanted: string): boolean {
  return wanted.includes('admin') && /key|token|secret|pass/.test(wanted);
}

/**
 * The setting a config file probably meant by the unknown `name`: the one whose name, flag or
 * env variable it spells (`session-ttl`, `FLASHD_SESSION_TTL`), begins (`sessionTtl` for
 * `sessionTtlSeconds`), or misses by a typo or two. A secret (env only) only with `secrets`, for
 * an env variable or a flag, which are then pointed to its variable; never for a config file.
 */
export function closestSetting(name: string, options: { secrets?: boolean } = {}): string | undefined {
  const wanted = normalizeName(name.replace(/^(?:-+|FLASHD_)/i, ''));
  if (wanted === '') return undefined;
  let best: { key: string; score: number } | undefined;
  for (const [key, schema] of Object.entries(properties)) {
    if (schema['x-secret'] && !options.secrets) continue;
    const forms = [key, schema['x-flag'] ?? '', (schema['x-env'] ?? '').replace(/^FLASHD_/, '')].map(normalizeName).filter((f) => f !== '');
    let score = Math.min(...forms.map((form) => nameScore(wanted, form)));
    // After a typo or two of another setting's name, before a name it only begins.
    if (schema['x-secret'] && secretNearMiss(wanted)) score = Math.min(score, 2.5);
    if (score < (best?.score ?? Infinity)) best = { key, score };
  }
  return best?.key;
}

/**
 * `FLASHD_*` variables read outside config/, which are not settings: worker-env's (the admin key
 * it sends, the URL it asks, its test-only timeout), the native loader's (core/native.ts), and
 * those of the tests, benchmarks and CI scripts (by prefix). Not warned about at start.
 */
const OTHER_FLASHD_VARIABLES = new Set(['FLASHD_API_KEY', 'FLASHD_URL', 'FLASHD_WORKER_ENV_TIMEOUT_MS', 'FLASHD_NATIVE_DIR', 'FLASHD_UWS_UNPATCHED', 'FLASHD_CI_CACHE']);
const OTHER_FLASHD_PREFIXES = ['FLASHD_TEST_', 'FLASHD_BENCH_'];

/** The FLASHD_* names in `env` flashd reads nowhere, with the setting's variable each probably meant. */
function unknownEnv(env: Readonly<Record<string, string | undefined>>): { name: string; didYouMean?: string }[] {
  const settings = new Set(Object.values(properties).map((schema) => schema['x-env']));
  const out: { name: string; didYouMean?: string }[] = [];
  for (const name of Object.keys(env)) {
    if (!/^FLASHD_/i.test(name) || settings.has(name) || OTHER_FLASHD_VARIABLES.has(name) || OTHER_FLASHD_PREFIXES.some((p) => name.startsWith(p))) continue;
    // A secret's variable is where a secret belongs: FLASHD_ADMIN_KEY names FLASHD_ADMIN_API_KEY.
    const key = closestSetting(name, { secrets: true });
    const didYouMean = key === undefined ? undefined : properties[key as SettingKey]['x-env'];
    out.push(didYouMean === undefined ? { name } : { name, didYouMean });
  }
  return out;
}

// No meta-schema check at start (see core/schemas.ts; the test checks config.schema.json too).
const ajv = new Ajv2020({ useDefaults: true, allErrors: true, strict: true, allowUnionTypes: true, validateSchema: false });
ajv.addVocabulary(['x-flag', 'x-env', 'x-secret', 'x-pattern-hint', 'x-not-hint', 'x-minimum-hint']);
const validateConfig = ajv.compile(configSchema);

/**
 * Reads the layers, then validates the merged result. Every bad value is reported at once (a
 * value that cannot be parsed, an unknown flag, a bound or pattern failure), each naming the
 * flag, env var or file it came from.
 */
export function loadConfig(input: LoadConfigInput = {}): FlashdConfig {
  const env = input.env ?? {};
  const flags = collectFlags(input.argv ?? []);
  const errors = [...flags.errors];
  // Null-prototype (as in collectFlags): a file's "__proto__" key is labelled with the file, not Object.prototype.
  const sources = Object.create(null) as Record<string, string>;
  let fileValues: Record<string, unknown> = {};
  if (flags.configFile !== undefined) {
    try {
      const parsed: unknown = JSON.parse(readFileSync(flags.configFile, 'utf8'));
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('the file must hold a JSON object');
      fileValues = parsed as Record<string, unknown>;
      for (const key of Object.keys(fileValues)) {
        sources[key] = `config file ${flags.configFile}`;
        // A secret (the admin key) comes from its env variable only, as --help says: a config
        // file is copied, committed and left readable far more often than a unit's environment.
        const schema = Object.hasOwn(properties, key) ? properties[key as SettingKey] : undefined;
        if (schema?.['x-secret']) {
          errors.push(`config file ${flags.configFile}: ${key} is read only from ${schema['x-env'] ?? 'the environment'}, so the secret stays out of config files; remove it from the file`);
          delete fileValues[key];
        }
      }
    } catch (err) {
      errors.push(`cannot read config file ${flags.configFile}: ${(err as Error).message}`);
    }
  }
  const envValues: Record<string, unknown> = {};
  const emptySecretEnv: string[] = [];
  for (const [key, schema] of Object.entries(properties)) {
    const name = schema['x-env'];
    const raw = name === undefined ? undefined : env[name];
    if (raw === '' && schema['x-secret'] && name !== undefined) emptySecretEnv.push(name);
    if (raw === undefined || raw === '') continue;
    const result = coerce(key, schema, raw, `env ${name}`);
    if ('error' in result) errors.push(result.error);
    else {
      envValues[key] = result.value;
      sources[key] = `env ${name}`;
    }
  }
  Object.assign(sources, flags.sources);
  const merged: Record<string, unknown> = { ...fileValues, ...envValues, ...flags.values, ...input.overrides };
  if (!validateConfig(merged)) {
    for (const e of validateConfig.errors ?? []) {
      if (e.keyword === 'additionalProperties') {
        const name = String((e.params as { additionalProperty?: unknown }).additionalProperty);
        const hint = closestSetting(name);
        errors.push(`${sources[name] ?? 'config'}: unknown setting ${JSON.stringify(name)}${hint === undefined ? '' : ` (did you mean ${JSON.stringify(hint)}?)`}`);
        continue;
      }
      const key = e.instancePath.slice(1);
      const where = key && sources[key] ? `${sources[key]}: ` : '';
      // ajv's "must be equal to one of the allowed values" leaves the user guessing which,
      // "must match pattern" shows a regular expression and "must NOT be valid" says nothing; each
      // names what is wanted instead (the value is not echoed: a URL may carry credentials). A
      // minimum that a 0-means-off reader would try says what comes closest instead.
      const hint = e.keyword === 'pattern' ? 'x-pattern-hint' : e.keyword === 'not' ? 'x-not-hint' : e.keyword === 'minimum' ? 'x-minimum-hint' : undefined;
      const shape = hint !== undefined && Object.hasOwn(properties, key) ? properties[key as SettingKey][hint] : undefined;
      const message = e.keyword === 'enum'
        ? `must be one of: ${((e.params as { allowedValues?: unknown[] }).allowedValues ?? []).map(String).join(', ')}`
        : shape !== undefined ? `must be ${shape}` : e.message ?? 'is invalid';
      errors.push(`${where}${key || 'config'} ${message}`);
    }
  }
  // authenticate() refuses a malformed fd_ key before any lookup: registered, it could never be
  // used. Checked here, with no database, so the start stops before the data directory is made.
  const adminApiKey = merged['adminApiKey'];
  if (typeof adminApiKey === 'string' && checkKeyFormat(adminApiKey) === 'malformed') {
    errors.push('FLASHD_ADMIN_API_KEY starts with fd_ but is not a key flashd generated (bad format or checksum), '
      + 'so every request with it would be refused as malformed; choose a value that does not start with fd_');
  }
  // The pattern cannot bound a port (`:99999`) or check a host (`[zz]`): the URL parser does, so
  // such a base URL is refused here, not found out in every requestUrl and worker URL built on it.
  for (const key of ['publicUrl', 'workerUrl'] as const) {
    const url = merged[key];
    const schema = properties[key];
    if (typeof url !== 'string' || schema.pattern === undefined || !new RegExp(schema.pattern).test(url)) continue;
    let valid: boolean;
    try {
      valid = new URL(url).port !== '0';
    } catch {
      valid = false;
    }
    if (!valid) {
      const example = /e\.g\. (\S+)$/.exec(schema['x-pattern-hint'] ?? '')?.[1] ?? 'http://192.168.1.20:8000';
      errors.push(`${sources[key] ?? 'config'}: ${key} must be a URL with a valid host and a port from 1 to 65535, e.g. ${example}`);
    }
  }
  // Nor can it bound endpointHost's port or check its labels, which would be in every
  // LOAD_BALANCER endpoint's requestUrls: each reason is named (the pattern lets an empty name
  // through, so that `:99999` is told what is wrong with it).
  const endpointHost = merged['endpointHost'];
  const hostSchema = properties.endpointHost;
  if (typeof endpointHost === 'string' && hostSchema.pattern !== undefined && new RegExp(hostSchema.pattern).test(endpointHost)) {
    const [name = '', port] = endpointHost.split(':');
    const labels = name.split('.');
    const wrong: string[] = [];
    if (name === '') wrong.push('have a host name before the port');
    else if (labels.includes('')) wrong.push('be a host name without empty labels');
    else if (labels.some((l) => l.startsWith('-') || l.endsWith('-'))) wrong.push("be a host name whose labels neither start nor end with '-'");
    // `{id}.1.2.3.4` is no name a resolver finds (nor is any name whose last label is a number,
    // which a URL parser takes for an IPv4 address).
    else if (/^[0-9]+$/.test(labels[labels.length - 1] ?? '')) wrong.push('be a host name, not an IP address: the endpoint URLs {id}.{endpoint-host} would not resolve');
    if (port !== undefined && !(/^[1-9][0-9]*$/.test(port) && Number(port) <= 65535)) wrong.push('have a port from 1 to 65535 (no leading zero)');
    if (wrong.length) {
      const example = /e\.g\. (.+)$/.exec(hostSchema['x-pattern-hint'] ?? '')?.[1] ?? 'lb.example.com';
      errors.push(`${sources['endpointHost'] ?? 'config'}: endpointHost must ${wrong.join(' and ')}, e.g. ${example}`);
    }
  }
  if (errors.length) throw new AgentError('VALIDATION_FAILED', `invalid configuration: ${errors.join('; ')}`, { errors });
  // Host names are case-insensitive: written in lower case, as a URL parser writes them (and the ids before them are).
  if (typeof endpointHost === 'string') merged['endpointHost'] = endpointHost.toLowerCase();
  // `http://10.0.0.5:8000/` is how a base URL is often written; the URLs built on it add their own `/`.
  for (const key of ['publicUrl', 'workerUrl'] as const) {
    const url = merged[key];
    if (typeof url === 'string' && url.endsWith('/')) merged[key] = url.slice(0, -1);
  }
  merged['containerSocketCandidates'] = Object.freeze(containerSocketCandidates(merged['containerSocket'], env));
  // Only the scheme: the rest of the address may name a user (ssh://user@host).
  const dockerHost = env['DOCKER_HOST'];
  merged['unknownEnv'] = Object.freeze(unknownEnv(env));
  merged['emptySecretEnv'] = Object.freeze(emptySecretEnv);
  merged['dockerHostSkipped'] = merged['containerSocket'] == null && dockerHost && !dockerHost.startsWith('unix://') ? /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(dockerHost)?.[0] ?? 'not a URL' : null;
  return Object.freeze(merged) as unknown as FlashdConfig;
}

/**
 * An integer setting's bounds, compactly: `1000..86400000`, `at least 1024`, and the two ranges
 * a `not` leaves (`0 or 1000..86400000`); undefined without any.
 */
function boundsOf(schema: OptionSchema): string | undefined {
  if (!isIntegerOption(schema) || (schema.minimum === undefined && schema.maximum === undefined)) return undefined;
  const range = (lo: number | undefined, hi: number | undefined): string =>
    lo === undefined ? `at most ${String(hi)}` : hi === undefined ? `at least ${lo}` : lo === hi ? String(lo) : `${lo}..${hi}`;
  const hole = schema.not;
  if (hole?.minimum !== undefined && hole.maximum !== undefined) return `${range(schema.minimum, hole.minimum - 1)} or ${range(hole.maximum + 1, schema.maximum)}`;
  return range(schema.minimum, schema.maximum);
}

/** The `--help` text, generated from the config schema so it never drifts. */
export function configHelp(): string {
  const lines: string[] = [];
  for (const [key, schema] of Object.entries(properties)) {
    const flag = schema['x-flag'];
    const envName = schema['x-env'];
    // The bounds beside the default: only an error showed them before (`--lease-ms` >= 1000).
    const bounds = boundsOf(schema);
    const shown = [schema.default === null || schema.default === undefined ? undefined : `default: ${JSON.stringify(schema.default)}`, bounds].filter((p) => p !== undefined);
    const def = shown.length ? ` (${shown.join('; ')})` : '';
    // A boolean flag may stand alone (collectFlags): `<value>` would say it needs one.
    const choices = schema.enum
      ? ` One of: ${schema.enum.join(', ')}.`
      : schema.type === 'boolean' ? ' The flag alone means true; values: true or false (also 1/0, yes/no, on/off).' : '';
    const arg = schema.type === 'boolean' ? '[true|false]' : `<${isIntegerOption(schema) ? 'n' : 'value'}>`;
    const head = flag ? `  ${flag} ${arg}` : `  (env only) ${key}`;
    lines.push(head);
    lines.push(`      ${schema.description}${choices}${def}`);
    if (envName) lines.push(`      env: ${envName}`);
    // Its name in a --config file (the admin key has none: env only).
    if (!schema['x-secret']) lines.push(`      config file: "${key}"`);
  }
  return lines.join('\n');
}
