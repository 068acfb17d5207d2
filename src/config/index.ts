/**
 * Config is read once, here and nowhere else: embedded defaults < `--config` JSON file <
 * FLASHD_* env < flags. The schema in `schema/config.schema.json` holds every default,
 * bound, flag name and env name; `--help` is printed from it too.
 */
import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import configSchema from '../../schema/config.schema.json' with { type: 'json' };
import { AgentError } from '../core/errors.js';

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
  readonly maxBodyBytes: number;
  readonly sqliteSynchronous: 'full' | 'normal';
  readonly sessionTtlSeconds: number;
  readonly runtime: 'none' | 'process';
  readonly leaseMs: number;
  readonly takeHoldMs: number;
  readonly maxAttempts: number;
  readonly webhookAllowPrivate: boolean;
  readonly webhookRetryDelayMs: number;
  readonly processWorkdir: string | null;
  readonly logLevel: 'debug' | 'info' | 'warn' | 'error' | 'silent';
  readonly logFormat: 'text' | 'json';
  readonly adminApiKey: string | null;
}

interface OptionSchema {
  type?: string | string[];
  enum?: string[];
  default?: unknown;
  description: string;
  'x-flag'?: string;
  'x-env'?: string;
  'x-secret'?: boolean;
}

const properties = configSchema.properties as unknown as Record<keyof FlashdConfig, OptionSchema>;

export interface LoadConfigInput {
  argv?: readonly string[];
  env?: Readonly<Record<string, string | undefined>>;
  /** Values that win over everything (tests). */
  overrides?: Partial<FlashdConfig>;
}

function isIntegerOption(schema: OptionSchema): boolean {
  return schema.type === 'integer' || (Array.isArray(schema.type) && schema.type.includes('integer'));
}

function coerce(key: string, schema: OptionSchema, raw: string, source: string): unknown {
  if (schema.type === 'boolean') {
    if (/^(1|true|yes|on)$/i.test(raw)) return true;
    if (/^(0|false|no|off)$/i.test(raw)) return false;
    throw new AgentError('VALIDATION_FAILED', `${source}: ${key} must be true or false, got ${JSON.stringify(raw)}`);
  }
  if (isIntegerOption(schema)) {
    if (!/^-?\d+$/.test(raw.trim())) {
      throw new AgentError('VALIDATION_FAILED', `${source}: ${key} must be an integer, got ${JSON.stringify(raw)}`);
    }
    return Number(raw);
  }
  return raw;
}

/** Parses `--flag value` and `--flag=value`. Unknown flags are an error listing the valid ones. */
export function parseFlags(argv: readonly string[]): { values: Record<string, unknown>; configFile?: string } {
  const byFlag = new Map<string, [string, OptionSchema]>();
  for (const [key, schema] of Object.entries(properties)) {
    if (schema['x-flag']) byFlag.set(schema['x-flag'], [key, schema]);
  }
  const values: Record<string, unknown> = {};
  let configFile: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const eq = arg.indexOf('=');
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    const inline = eq > 0 ? arg.slice(eq + 1) : undefined;
    const take = (): string => {
      if (inline !== undefined) return inline;
      const next = argv[i + 1];
      if (next === undefined) throw new AgentError('VALIDATION_FAILED', `flag ${name} needs a value`);
      i++;
      return next;
    };
    if (name === '--config') {
      configFile = take();
      continue;
    }
    const entry = byFlag.get(name);
    if (!entry) throw new AgentError('VALIDATION_FAILED', `unknown flag ${name} (see flashd --help)`);
    const [key, schema] = entry;
    const bare = schema.type === 'boolean' && inline === undefined && (argv[i + 1] === undefined || (argv[i + 1] as string).startsWith('--'));
    values[key] = bare ? true : coerce(key, schema, take(), `flag ${name}`);
  }
  return configFile === undefined ? { values } : { values, configFile };
}

const ajv = new Ajv2020({ useDefaults: true, allErrors: true, strict: true, allowUnionTypes: true });
ajv.addVocabulary(['x-flag', 'x-env', 'x-secret']);
const validateConfig = ajv.compile(configSchema);

export function loadConfig(input: LoadConfigInput = {}): FlashdConfig {
  const env = input.env ?? {};
  const { values: flagValues, configFile } = parseFlags(input.argv ?? []);
  let fileValues: Record<string, unknown> = {};
  if (configFile !== undefined) {
    try {
      fileValues = JSON.parse(readFileSync(configFile, 'utf8')) as Record<string, unknown>;
    } catch (err) {
      throw new AgentError('VALIDATION_FAILED', `cannot read config file ${configFile}: ${(err as Error).message}`);
    }
  }
  const envValues: Record<string, unknown> = {};
  for (const [key, schema] of Object.entries(properties)) {
    const name = schema['x-env'];
    const raw = name === undefined ? undefined : env[name];
    if (raw !== undefined && raw !== '') envValues[key] = coerce(key, schema, raw, `env ${name}`);
  }
  const merged: Record<string, unknown> = { ...fileValues, ...envValues, ...flagValues, ...input.overrides };
  if (!validateConfig(merged)) {
    const errors = (validateConfig.errors ?? []).map((e) => `${e.instancePath.slice(1) || 'config'} ${e.message ?? 'is invalid'}`);
    throw new AgentError('VALIDATION_FAILED', `invalid configuration: ${errors.join('; ')}`, { errors });
  }
  return Object.freeze(merged) as unknown as FlashdConfig;
}

/** The `--help` text, generated from the config schema so it never drifts. */
export function configHelp(): string {
  const lines: string[] = [];
  for (const [key, schema] of Object.entries(properties)) {
    const flag = schema['x-flag'];
    const envName = schema['x-env'];
    const def = schema.default === null || schema.default === undefined ? '' : ` (default: ${JSON.stringify(schema.default)})`;
    const choices = schema.enum ? ` One of: ${schema.enum.join(', ')}.` : '';
    const head = flag ? `  ${flag} <${isIntegerOption(schema) ? 'n' : 'value'}>` : `  (env only) ${key}`;
    lines.push(head);
    lines.push(`      ${schema.description}${choices}${def}`);
    if (envName) lines.push(`      env: ${envName}`);
  }
  return lines.join('\n');
}
