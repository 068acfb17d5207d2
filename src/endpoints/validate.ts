/**
 * Create and update rules of the spec ("Create a serverless endpoint", "Resources and their
 * fields", "Command encoding", "Mounts"). The JSON Schema checks shapes and bounds first; the
 * rules here check what a schema cannot: cross-field conflicts, catalog membership and the
 * resources a body refers to. Failures are gathered so one response lists them all.
 */
import { AgentError, validationError } from '../core/errors.js';
import { sortedJson } from '../core/json-raw.js';
import { normalizeName } from '../core/names.js';
import { assertSchema, SCHEMA_DOCUMENTS } from '../core/schemas.js';
import { OTHER_POOL, POOL_IDS, cpuFlavor, gpuType, gpuTypeForName, gpuTypeMeant, poolTypes } from '../catalog/index.js';
import { applyCommand, CommandError, findLocalTestFlag, localTestFlagMessage, type StoredCommand } from './command.js';
import {
  DEFAULT_TIMEOUT_MS, DEFAULT_WORKERS, idleTimeoutApplies,
  type CpuSpec, type EndpointSpec, type GpuSpec, type NetworkVolumeSpec, type Scaling, type TemplateSpec, type WorkersSpec,
} from './types.js';

/** Lookups the rules need, scoped to the caller's account. */
export interface ValidationContext {
  knownDataCenters: readonly string[];
  /** The nvidia-smi names of this host's GPU models the catalog does not know (pool OTHER). */
  hostGpuModels: readonly string[];
  /** The caller's own or a public template. */
  template(id: string): TemplateSpec | undefined;
  networkVolume(id: string): NetworkVolumeSpec | undefined;
  globalVolumeExists(id: string): boolean;
  registryExists(id: string): boolean;
}

interface GpuInput {
  pools?: string[];
  excludedTypes?: string[];
  count?: number;
  allowedCudaVersions?: string[];
  minCudaVersion?: string | null;
}

interface MountsInput {
  network?: { volumeId: string }[];
  global?: { volumeId: string }[];
}

export interface EndpointBody {
  name?: string;
  type?: 'QUEUE' | 'LOAD_BALANCER';
  scaling?: Scaling;
  image?: string;
  templateId?: string;
  args?: string;
  cmd?: string[];
  entrypoint?: string[];
  disk?: number;
  env?: Record<string, string>;
  ports?: string[];
  registry?: string | null;
  gpu?: GpuInput | null;
  cpu?: CpuSpec[] | null;
  dataCenterIds?: string[];
  flashboot?: EndpointSpec['flashboot'];
  networkVolumes?: string[];
  mounts?: MountsInput;
  timeout?: number;
  workers?: Partial<WorkersSpec>;
  allowedCudaVersions?: unknown;
  minCudaVersion?: unknown;
}

const CUDA_KEYS = ['allowedCudaVersions', 'minCudaVersion'] as const;
const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The floor of an endpoint's `timeout`, as of `policy.executionTimeout` (schema/jobs.schema.json). */
const MIN_TIMEOUT_MS = 5000;

/**
 * `assertSchema`, with the unit spelled out when the execution timeout at `field` is under its
 * 5 s floor: such a value was most likely meant in seconds (600, meant as 10 minutes, would end
 * every job after 0.6 s), so the error says what it is in seconds and, when the value read as
 * seconds is in range, which number of ms that would be.
 */
export function assertWithTimeoutHint<T>(schema: string, raw: unknown, field: string): T {
  try {
    return assertSchema<T>(schema, raw);
  } catch (err) {
    if (!(err instanceof AgentError) || !err.errors) throw err;
    const ms = isObject(raw) ? raw[field] : undefined;
    throw validationError(err.errors.map((e) => withMillisecondHint(e, `/${field}`, ms, MIN_TIMEOUT_MS)));
  }
}

/**
 * `error` with the unit spelled out when it is Ajv's `<pointer>: must be >= <floorMs>` for a
 * positive integer `ms` (a value in milliseconds under its floor, most likely meant in seconds):
 * what it is in seconds and, when the value read as seconds is in range, which number of ms that
 * would be. Any other error comes back as it is. An endpoint's `timeout` and a job's
 * `policy.executionTimeout` and `policy.ttl` (api/jobs.ts) use it.
 */
export function withMillisecondHint(error: string, pointer: string, ms: unknown, floorMs: number): string {
  if (error !== `${pointer}: must be >= ${floorMs}` || typeof ms !== 'number' || !Number.isInteger(ms) || ms < 1 || ms >= floorMs) return error;
  const meant = ms * 1000 >= floorMs ? `; did you mean ${ms * 1000}?` : '';
  return `${error} (${floorMs / 1000} s): it is in milliseconds, so ${ms} is ${ms / 1000} s${meant}`;
}

/**
 * RunPod's names for a setting that a flashd body has under another name: a value is its place
 * here (said `here it is workers.max`), or `{ say }`, the whole of what to say instead.
 */
type FieldPlaces = Readonly<Record<string, string | { say: string }>>;

/** Where a table's names come from, said in the error; null: RunPod's word, from no body of its own. */
interface NameSource { readonly fields: FieldPlaces; readonly origin: string | null }

/**
 * Where each field of the older `/v1/endpoints` body (RunPod's REST names, which flashd's `/v1`
 * takes too) lives in a `/v2` body: sent to `/v2/serverless`, such a field is an unknown property,
 * and the error says where it goes rather than only that it is unknown. RunPod GraphQL's
 * `saveEndpoint` shares these names (`workersMax`, `scalerType`, `gpuCount`, …).
 */
const V1_FIELDS: FieldPlaces = {
  gpuTypeIds: 'gpu.pools with gpu.excludedTypes, or send it as it is to POST /v1/endpoints',
  gpuCount: 'gpu.count',
  cpuFlavorIds: 'cpu[].id',
  vcpuCount: 'cpu[].vcpuCount',
  computeType: 'gpu or cpu',
  workersMin: 'workers.min',
  workersMax: 'workers.max',
  idleTimeout: 'workers.idleTimeout',
  scalerType: 'scaling.type',
  scalerValue: 'scaling.queueDelay or scaling.requestCount',
  executionTimeoutMs: 'timeout',
  networkVolumeId: 'mounts.network',
};

/** The names of RunPod GraphQL's `saveEndpoint` (what flash and the console send) not in {@link V1_FIELDS}. */
const GRAPHQL_ENDPOINT_FIELDS: FieldPlaces = {
  gpuIds: 'gpu.pools, an array of pool ids (not a comma-separated string), with each "-TYPE" of it in gpu.excludedTypes',
  locations: 'dataCenterIds, an array of data center ids (not a comma-separated string)',
  instanceIds: 'cpu, a list of {"id": CPU flavor id, "vcpuCount": N}',
  networkVolumeIds: 'mounts.network, a list of {"volumeId": ID}',
  flashBootType: 'flashboot: "OFF", "FLASHBOOT" or "PRIORITY_FLASHBOOT"',
};

/** Where each field of RunPod's REST template body lives in a flashd template body (see {@link V1_FIELDS}). */
const REST_TEMPLATE_FIELDS: FieldPlaces = {
  imageName: 'image',
  containerDiskInGb: 'disk',
  dockerStartCmd: 'args',
  dockerArgs: 'args',
  dockerEntrypoint: 'args, as {"entrypoint": [...], "cmd": [...]}',
  containerRegistryAuthId: 'registry',
  // RunPod's serverless templates take 0 here too: a pod's own disk, which workers do not have.
  volumeInGb: { say: 'workers have no volume of their own here (a RunPod serverless template takes 0): leave it out, and attach a network volume to the endpoint (mounts.network), mounted at /vendor-volume' },
  volumeMountPath: { say: 'volumes are mounted at the fixed path /vendor-volume (a network volume attached to the endpoint, mounts.network): leave it out' },
};

const REST_TEMPLATE = "a field of RunPod's REST template body";

/**
 * The names of runpod-flash's `Endpoint(...)` arguments (Python, snake_case) that are not
 * another table's name in snake_case (`idle_timeout` is `idleTimeout`, found through
 * {@link normalizeName}), for the flash user who writes the JSON body by hand.
 */
const FLASH_FIELDS: FieldPlaces = {
  datacenter: 'dataCenterIds, an array of data center ids',
  volume: 'mounts.network, a list of {"volumeId": ID}',
  max_concurrency: { say: 'a worker takes as many jobs at once as its SDK asks for (concurrency_modifier in serverless.start): leave it out' },
  dependencies: { say: 'flashd installs nothing into a worker: put the packages in the image' },
  system_dependencies: { say: 'flashd installs nothing into a worker: put the packages in the image' },
  accelerate_downloads: { say: 'flashd has no such setting: leave it out' },
};

const FLASH = "an argument of runpod-flash's Endpoint";

/** The names RunPod users type in an endpoint create or PATCH, first table first. */
const ENDPOINT_NAME_SOURCES: readonly NameSource[] = [
  { fields: V1_FIELDS, origin: 'a POST /v1/endpoints field' },
  { fields: GRAPHQL_ENDPOINT_FIELDS, origin: "a field of RunPod GraphQL's saveEndpoint" },
  // An endpoint body holds a template's fields too, and takes the command as cmd and entrypoint.
  { fields: { ...REST_TEMPLATE_FIELDS, dockerStartCmd: 'cmd', dockerEntrypoint: 'entrypoint' }, origin: REST_TEMPLATE },
  // RunPod's console and docs call it the scaler; only a create takes templateId here.
  { fields: { scaler: 'scaling: {"type": "QUEUE_DELAY", "queueDelay": N} or {"type": "REQUEST_COUNT", "requestCount": N}' }, origin: null },
  { fields: { templateId: { say: 'here a template is read only at create: send the fields to change (image, args, env, …) themselves' } }, origin: "RunPod's REST PATCH takes it" },
  { fields: FLASH_FIELDS, origin: FLASH },
];


/** What an errors[] entry says of a field's place here. */
const placeText = (place: string | { say: string }): string => (typeof place === 'string' ? `here it is ${place}` : place.say);

/**
 * `check()`, with each top-level unknown property that `sources` know pointed at its place here:
 * `/workersMax: unknown property (a POST /v1/endpoints field); here it is workers.max`. A
 * snake_case name is looked up as the same name in camelCase too ({@link normalizeName} compares
 * them alike), among the properties of `schema` and in `sources`: `/min_cuda_version: unknown
 * property; here it is minCudaVersion (flashd's names are camelCase)`, `/idle_timeout: unknown
 * property (idleTimeout in snake_case, as a POST /v1/endpoints field); here it is
 * workers.idleTimeout`.
 */
function withFieldPlaces<T>(check: () => T, sources: readonly NameSource[], schema?: string): T {
  try {
    return check();
  } catch (err) {
    if (!(err instanceof AgentError) || !err.errors) throw err;
    let hinted = false;
    const errors = err.errors.map((e) => {
      const name = /^\/(\w+): unknown property$/.exec(e)?.[1];
      if (name === undefined) return e;
      const source = sources.find((s) => Object.hasOwn(s.fields, name));
      if (source !== undefined) {
        hinted = true;
        return `${e}${source.origin === null ? '' : ` (${source.origin})`}; ${placeText(source.fields[name] as string | { say: string })}`;
      }
      if (!name.includes('_')) return e;
      const same = (other: string): boolean => normalizeName(other) === normalizeName(name);
      const own = schema === undefined ? undefined : propertiesOf(schema).find(same);
      if (own !== undefined) {
        hinted = true;
        return `${e}; here it is ${own} (flashd's names are camelCase)`;
      }
      for (const s of sources) {
        const camel = Object.keys(s.fields).find(same);
        if (camel === undefined) continue;
        hinted = true;
        return `${e} (${camel} in snake_case${s.origin === null ? '' : `, as ${s.origin}`}); ${placeText(s.fields[camel] as string | { say: string })}`;
      }
      return e;
    });
    throw hinted ? validationError(errors) : err;
  }
}

/** The top-level property names of a schema entry (`EndpointCreate`), for {@link withFieldPlaces}. */
function propertiesOf(name: string): readonly string[] {
  for (const doc of Object.values(SCHEMA_DOCUMENTS)) {
    const entry = doc.$defs[name] as { properties?: Record<string, unknown> } | undefined;
    if (entry) return Object.keys(entry.properties ?? {});
  }
  return [];
}

/**
 * A schema entry that a value in another API's shape, or a RunPod console habit, is told more
 * about: `error` matches the schema's entry, `when` picks the values (the one its pointer
 * names) it applies to, `say` gives the entry instead. Nothing more is accepted.
 */
interface ShapeHint { readonly error: RegExp; when(value: unknown): boolean; say(error: string, value: unknown): string }

/** A number written as a JSON string ("3", "0.5"), short enough to say again. */
const QUOTED_NUMBER = /^-?\d{1,15}(\.\d{1,6})?$/;

const SHAPE_HINTS: readonly ShapeHint[] = [
  {
    error: /^\/env: must be object$/, when: Array.isArray,
    say: () => '/env: must be an object of variable names to string values ({"NAME": "value"}), not an array (RunPod GraphQL\'s list of {key, value} pairs)',
  },
  { error: /^\/flashboot: must be one of "OFF", /, when: (v) => typeof v === 'boolean', say: (e) => `${e} (POST /v1/endpoints takes a boolean; here true is "FLASHBOOT" and false "OFF")` },
  { error: /^\/type: must be one of "QUEUE", "LOAD_BALANCER"$/, when: (v) => v === 'QB', say: (e) => `${e} (RunPod's "QB" is "QUEUE" here)` },
  { error: /^\/type: must be one of "QUEUE", "LOAD_BALANCER"$/, when: (v) => v === 'LB', say: (e) => `${e} (RunPod's "LB" is "LOAD_BALANCER" here)` },
  // Another letter case or separator of an allowed value: "queue_delay", "flashboot", "Queue".
  {
    error: /^[^:]*: must be one of "/, when: (v) => typeof v === 'string' && v.length <= 64,
    say: (e, v) => {
      let allowed: unknown[];
      try {
        allowed = JSON.parse(`[${e.slice(e.indexOf(': must be one of ') + 17)}]`) as unknown[];
      } catch {
        return e;
      }
      const meant = allowed.find((a) => typeof a === 'string' && normalizeName(a) === normalizeName(v as string));
      return meant === undefined ? e : `${e} (did you mean ${JSON.stringify(meant)}?)`;
    },
  },
  {
    error: /^[^:]*: must be (integer|number)$/, when: (v) => typeof v === 'string' && QUOTED_NUMBER.test(v),
    // "1.5" for an integer: the schema's words say enough.
    say: (e, v) => (e.endsWith('integer') && String(v).includes('.') ? e : `${e} (a JSON number: ${String(v)}, not the string "${String(v)}")`),
  },
  { error: /^[^:]*: must be boolean$/, when: (v) => v === 'true' || v === 'false', say: (e, v) => `${e} (${String(v)}, not the string "${String(v)}")` },
  {
    error: /^\/(cmd|entrypoint): must be array$/, when: (v) => typeof v === 'string',
    say: (e) => `${e} (a JSON array of arguments such as ["python", "handler.py"]; a whole command line as one string goes in args)`,
  },
  { error: /^[^:]*: must be array$/, when: (v) => typeof v === 'string', say: (e) => `${e} (a JSON array of strings, not one comma-separated string)` },
  { error: /^\/cpu: must be array or null$/, when: isObject, say: (e) => `${e} (a list, even of one: [{"id": "cpu3c", "vcpuCount": 2}])` },
  { error: /^\/mounts\/(network|global)\/\d+: must be object$/, when: (v) => typeof v === 'string', say: (e) => `${e} ({"volumeId": ID}, not the id alone)` },
  { error: /^\/env\/[^:]+: must be string$/, when: (v) => typeof v === 'number' || typeof v === 'boolean', say: (e) => `${e} (every env value is a string: put numbers and booleans in quotes)` },
  // Seconds here and in RunPod's idleTimeout; a value in ms (as executionTimeoutMs is) is over the hour.
  {
    error: /^\/(workers\/)?idleTimeout: must be <= 3600$/, when: (v) => typeof v === 'number',
    say: (e, v) => `${e} (it is in seconds, not milliseconds${Number.isInteger((v as number) / 1000) && (v as number) / 1000 <= 3600 ? `: did you mean ${(v as number) / 1000}?` : ''})`,
  },
  // RunPod's names one level down, where withFieldPlaces (top level only) does not look.
  {
    error: /^\/scaling\/(value|scalerValue): unknown property$/, when: () => true,
    say: (e) => `${e}; here it is scaling.queueDelay (seconds, for QUEUE_DELAY) or scaling.requestCount (for REQUEST_COUNT)`,
  },
  { error: /^\/workers\/workersMin: unknown property$/, when: () => true, say: (e) => `${e}; here it is workers.min` },
  { error: /^\/workers\/workersMax: unknown property$/, when: () => true, say: (e) => `${e}; here it is workers.max` },
  { error: /^\/gpu\/gpuCount: unknown property$/, when: () => true, say: (e) => `${e}; here it is gpu.count` },
  { error: /^\/gpu\/gpuIds: unknown property$/, when: () => true, say: (e) => `${e}; here it is gpu.pools with gpu.excludedTypes` },
  {
    error: /^\/gpu\/gpuTypeIds: unknown property$/, when: () => true,
    say: (e) => `${e}; here it is gpu.pools with gpu.excludedTypes (GPU type ids go in gpuTypeIds of POST /v1/endpoints)`,
  },
];

/** The value a JSON pointer of a schema entry names in `raw` (undefined when there is none). */
function valueAt(raw: unknown, pointer: string): unknown {
  let v = raw;
  for (const token of pointer.split('/').slice(1)) {
    const key = token.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(v)) v = /^\d+$/.test(key) ? v[Number(key)] : undefined;
    else if (isObject(v) && Object.hasOwn(v, key)) v = v[key];
    else return undefined;
  }
  return v;
}

/**
 * `check()`, with each schema entry that {@link SHAPE_HINTS} knows for the value sent told what
 * the field takes (RunPod GraphQL's `env` list of `{key, value}`, `/v1`'s boolean `flashboot`, a
 * number as a string, a comma-separated list, an idle timeout in ms, "QB"), instead of the
 * schema's bare words. The first hint that applies to an entry wins.
 */
export function withShapeHints<T>(check: () => T, raw: unknown): T {
  try {
    return check();
  } catch (err) {
    if (!(err instanceof AgentError) || !err.errors) throw err;
    let hinted = false;
    const errors = err.errors.map((e) => {
      const pointer = e.startsWith('/') ? e.slice(0, e.indexOf(': ')) : undefined;
      if (pointer === undefined) return e;
      const value = valueAt(raw, pointer);
      for (const h of SHAPE_HINTS) {
        if (!h.error.test(e) || !h.when(value)) continue;
        const said = h.say(e, value);
        if (said === e) continue;
        hinted = true;
        return said;
      }
      return e;
    });
    throw hinted ? validationError(errors) : err;
  }
}

/** The schema check of a template body, RunPod's REST template names pointed at their place here. */
export function assertTemplateBody<T>(schema: 'TemplateCreate' | 'TemplateUpdate', raw: unknown): T {
  return withShapeHints(() => withFieldPlaces(() => assertSchema<T>(schema, raw), [{ fields: REST_TEMPLATE_FIELDS, origin: REST_TEMPLATE }], schema), raw);
}

/** The schema check of an endpoint body, RunPod's names for its fields pointed at their `/v2` place. */
function assertEndpointBody(schema: 'EndpointCreate' | 'EndpointUpdate', raw: unknown): EndpointBody {
  return withShapeHints(() => withFieldPlaces(() => assertWithTimeoutHint<EndpointBody>(schema, raw, 'timeout'), ENDPOINT_NAME_SOURCES, schema), raw);
}

/**
 * Rule 2: CUDA constraints on a CPU endpoint are a 422, whether they come top level or as a
 * `gpu` object holding only CUDA fields. The schema runs first, so a body with other mistakes
 * gets the 400 listing them all; schema errors at the CUDA fields themselves (a malformed
 * floor, and the missing `gpu.pools` of a CUDA-only `gpu` object) are left out of it, since
 * any value there is refused. Otherwise valid, the body gets the 422.
 */
function validateWithCudaRule(schema: 'EndpointCreate' | 'EndpointUpdate', raw: unknown, resultIsCpu: (body: Record<string, unknown>) => boolean): EndpointBody {
  const check = (): EndpointBody => assertEndpointBody(schema, raw);
  if (!isObject(raw) || !resultIsCpu(raw)) return check();
  const topLevel = CUDA_KEYS.filter((k) => raw[k] !== undefined);
  const gpu = raw['gpu'];
  const gpuOnlyCuda = isObject(gpu) && Object.keys(gpu).length > 0 && Object.keys(gpu).every((k) => (CUDA_KEYS as readonly string[]).includes(k));
  if (!topLevel.length && !gpuOnlyCuda) return check();
  const where = [...topLevel.map((k) => `/${k}`), ...(gpuOnlyCuda ? Object.keys(gpu).map((k) => `/gpu/${k}`) : [])];
  const covered = [...topLevel.map((k) => `/${k}`), ...(gpuOnlyCuda ? ['/gpu'] : [])];
  try {
    check();
  } catch (err) {
    if (!(err instanceof AgentError)) throw err;
    const others = (err.errors ?? []).filter((e) => !covered.some((p) => e.startsWith(`${p}: `) || e.startsWith(`${p}/`)));
    if (others.length) throw validationError(others);
  }
  throw validationError(where.map((p) => `${p}: CUDA constraints apply only to GPU endpoints; this endpoint uses cpu`), 422);
}

function checkGpu(gpu: GpuSpec, errors: string[], hostModels: readonly string[]): void {
  const types = new Set<string>();
  gpu.pools.forEach((pool, i) => {
    const members = poolTypes(pool);
    if (members) {
      members.forEach((t) => types.add(t));
      return;
    }
    // A type id, or the display name /v2/catalog/gpus shows ("RTX 4090") in any letter case.
    const exact = gpuType(pool);
    const asType = exact ?? gpuTypeMeant(pool);
    const what = exact ? `"${pool}" is a GPU type id` : `"${pool}" names the GPU type "${asType?.id}"`;
    errors.push(asType
      ? `/gpu/pools/${i}: ${what}, not a pool id${asType.pool
        ? `; use pool "${asType.pool}" (and excludedTypes for the others)`
        : `; it belongs to no RunPod serverless pool: use pool "${OTHER_POOL}" (flashd only; excludedTypes for the others)`}`
      : `/gpu/pools/${i}: unknown pool "${pool}"; pools are ${POOL_IDS.join(', ')}`);
  });
  // OTHER also holds every model the catalog does not know, so such a name may be excluded too,
  // and some type always remains. A name that differs only in case from a type of the pools or
  // a model of this host would exclude nothing (names are matched exactly): refused.
  const other = gpu.pools.includes(OTHER_POOL);
  const known = [...types, ...(other ? hostModels : [])];
  const seen = new Set<string>();
  gpu.excludedTypes.forEach((t, i) => {
    if (seen.has(t)) errors.push(`/gpu/excludedTypes/${i}: duplicate GPU type "${t}" (after trimming white space)`);
    seen.add(t);
    if (errors.some((e) => e.startsWith('/gpu/pools')) || known.includes(t)) return;
    const meant = known.find((k) => k.toLowerCase() === t.toLowerCase());
    if (meant !== undefined || !(other && gpuTypeForName(t) === undefined)) {
      // A type named by its displayName ("RTX 4090", as /v2/catalog/gpus shows it) gets its id.
      const named = meant === undefined ? gpuTypeMeant(t)?.id : undefined;
      const hint = meant !== undefined ? `; did you mean "${meant}" (names are case-sensitive)?`
        : named !== undefined && known.includes(named) ? `; did you mean "${named}"?` : '';
      errors.push(`/gpu/excludedTypes/${i}: "${t}" is not a GPU type in the selected pools (${gpu.pools.join(', ')})${hint}`);
    }
  });
  if (!other && types.size > 0 && [...types].every((t) => seen.has(t))) {
    errors.push('/gpu/excludedTypes: excludes every GPU type of the selected pools; at least one must remain');
  }
  if (gpu.allowedCudaVersions.length > 0 && gpu.minCudaVersion !== null) {
    errors.push('/gpu: allowedCudaVersions and minCudaVersion cannot be combined; send an empty allowedCudaVersions with a floor, or list the versions');
  }
}

/** Exact for every integer a JSON number can hold (bitwise tricks wrap at 2^31). */
const isPowerOfTwo = (n: number): boolean => n >= 1 && Number.isInteger(Math.log2(n));

function checkCpu(cpu: CpuSpec[], errors: string[]): void {
  const seen = new Map<string, number>();
  cpu.forEach((item, i) => {
    const key = `${item.id}\u0000${item.vcpuCount}`;
    const first = seen.get(key);
    if (first !== undefined) errors.push(`/cpu/${i}: duplicate of /cpu/${first} (${item.id} with ${item.vcpuCount} vCPUs); the same flavor may repeat only with another vcpuCount`);
    else seen.set(key, i);
    const flavor = cpuFlavor(item.id);
    if (!flavor) {
      errors.push(`/cpu/${i}/id: unknown CPU flavor "${item.id}"; flavors are cpu3c, cpu3g, cpu5c, cpu5g`);
      return;
    }
    if (!isPowerOfTwo(item.vcpuCount)) {
      errors.push(`/cpu/${i}/vcpuCount: must be a power of two, got ${item.vcpuCount}`);
    } else if (!flavor.vcpuCounts.includes(item.vcpuCount)) {
      errors.push(`/cpu/${i}/vcpuCount: ${item.vcpuCount} is not offered for ${flavor.id}; choose one of ${flavor.vcpuCounts.join(', ')}`);
    }
  });
}

function checkWorkers(workers: WorkersSpec, errors: string[]): void {
  if (workers.min > workers.max) errors.push(`/workers: min (${workers.min}) must not exceed max (${workers.max})`);
}

function checkScaling(type: EndpointSpec['type'], scaling: Scaling, errors: string[]): void {
  if (type === 'LOAD_BALANCER' && scaling.type !== 'REQUEST_COUNT') {
    errors.push('/scaling/type: LOAD_BALANCER endpoints scale on REQUEST_COUNT');
  }
}

/** RFC 3986 path-absolute characters: pchar (unreserved, sub-delims, ":", "@", %HH) and "/". */
const URI_PATH = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*$/;

function checkEnv(spec: EndpointSpec, errors: string[]): void {
  const path = spec.env['HEALTH_CHECK_PATH'];
  if (path !== undefined && !path.startsWith('/')) errors.push('/env/HEALTH_CHECK_PATH: must start with "/"');
  else if (path !== undefined && !URI_PATH.test(path)) {
    // It becomes the path of requestUrls.health, which must be a URI.
    errors.push('/env/HEALTH_CHECK_PATH: must be a URI path: letters, digits, "/" and -._~!$&\'()*+,;=:@ or %XX escapes (no space, "?" or "#")');
  }
  for (const name of ['PORT', 'PORT_HEALTH']) {
    const v = spec.env[name];
    if (v !== undefined && !(/^[0-9]{1,5}$/.test(v) && Number(v) >= 1 && Number(v) <= 65535)) errors.push(`/env/${name}: must be a port number from 1 to 65535`);
  }
}

/**
 * Mount rules, plus the references every body can carry. 404 for ids the caller cannot see.
 * `networkPointer` is where the network list came from (`/networkVolumes` when only the
 * deprecated field was sent), so errors point into the body as sent.
 */
function checkReferences(spec: EndpointSpec, ctx: ValidationContext, errors: string[], networkPointer = '/mounts/network', registryFromTemplate = false): void {
  spec.dataCenterIds.forEach((dc, i) => {
    if (!ctx.knownDataCenters.includes(dc)) errors.push(`/dataCenterIds/${i}: unknown data center "${dc}"; this installation has ${ctx.knownDataCenters.join(', ')}`);
  });
  const { network, global } = spec.mounts;
  if (network.length > 0 && global.length > 0) errors.push('/mounts: network and global volumes cannot both be mounted; send [] for one kind to switch');
  if (global.length > 0 && spec.gpu === null) errors.push('/mounts/global: global volumes are for GPU endpoints only');
  if (global.length > 1) errors.push('/mounts/global: at most one global volume');
  // Each missing reference: its errors[] entry, and the words the detail lists it by.
  const missing: { error: string; what: string }[] = [];
  const notFound = (pointer: string, what: string, hint = ''): void => {
    missing.push({ error: `${pointer}: ${what} not found or not accessible${hint && `; ${hint}`}`, what: hint ? `${what} (${hint})` : what });
  };
  const perDc = new Map<string, string>();
  const firstAt = new Map<string, number>();
  network.forEach((id, i) => {
    // A repeat is its own error, before any look-up: it is not a second volume in the same
    // data center, and an unknown id listed twice is not two missing volumes.
    const first = firstAt.get(id);
    if (first !== undefined) {
      errors.push(`${networkPointer}/${i}: duplicate of ${networkPointer}/${first} (network volume ${id} is listed more than once)`);
      return;
    }
    firstAt.set(id, i);
    const vol = ctx.networkVolume(id);
    if (!vol) {
      notFound(`${networkPointer}/${i}`, `network volume ${id}`);
      return;
    }
    const other = perDc.get(vol.dataCenterId);
    if (other !== undefined) errors.push(`${networkPointer}/${i}: at most one network volume per data center; ${other} and ${id} are both in ${vol.dataCenterId}`);
    perDc.set(vol.dataCenterId, id);
    if (spec.dataCenterIds.length > 0 && !spec.dataCenterIds.includes(vol.dataCenterId)) {
      errors.push(`${networkPointer}/${i}: volume ${id} is in ${vol.dataCenterId}, which is not among dataCenterIds`);
    }
  });
  global.forEach((id, i) => {
    if (!ctx.globalVolumeExists(id)) notFound(`/mounts/global/${i}`, `global volume ${id}`);
  });
  if (spec.registry !== null && !ctx.registryExists(spec.registry)) {
    // A public template may name its owner's credential, which other accounts cannot use.
    if (registryFromTemplate) notFound('/templateId', `the template's registry credential ${spec.registry}`, 'set registry, or null, in the body');
    else notFound('/registry', `registry credential ${spec.registry}`);
  }
  if (errors.length) throw validationError(errors);
  if (missing.length) {
    // The detail says "not found" once, before the list: an entry with a hint keeps it in brackets.
    throw new AgentError('NOT_FOUND', `Not found or not accessible: ${missing.map((m) => m.what).join(', ')}.`, { errors: missing.map((m) => m.error) });
  }
}

/** `network` may come with the deprecated `networkVolumes` only when the two agree exactly. */
function resolveNetwork(body: EndpointBody, errors: string[]): string[] | undefined {
  const fromMounts = body.mounts?.network?.map((m) => m.volumeId);
  const legacy = body.networkVolumes;
  if (fromMounts !== undefined && legacy !== undefined) {
    const same = fromMounts.length === legacy.length && fromMounts.every((id, i) => id === legacy[i]);
    if (!same) errors.push('/networkVolumes: must equal mounts.network exactly when both are sent (networkVolumes is deprecated; send only mounts.network)');
  }
  return fromMounts ?? legacy;
}

/**
 * Only the three command fields, copied: callers spread the result into a spec, so returning
 * `current` itself (a whole stored spec on update) would overwrite the fields set before it.
 */
function command(current: Pick<EndpointSpec, 'args' | 'entrypoint' | 'cmd'>, body: EndpointBody, errors: string[]): StoredCommand {
  let result: StoredCommand = current;
  try {
    result = applyCommand(current, { args: body.args, cmd: body.cmd, entrypoint: body.entrypoint });
  } catch (err) {
    if (!(err instanceof CommandError)) throw err;
    errors.push(`/${err.field}: ${err.message}`);
  }
  return { args: result.args, entrypoint: [...result.entrypoint], cmd: [...result.cmd] };
}

/**
 * A QUEUE endpoint's worker must take jobs: runpod-python's local-test flags (`--test_input`,
 * `--rp_serve_api`) keep it from ever doing so. Only the halves of the command the body sets are
 * checked, each error pointing where the body set it; `otherPointer` is where the halves it does
 * not set came from (`/templateId` on create), or null to leave them alone (a PATCH keeps them).
 */
function checkLocalTestFlags(result: StoredCommand, body: EndpointBody, errors: string[], otherPointer: string | null): void {
  if (body.args !== undefined) {
    const hit = findLocalTestFlag([...result.entrypoint, ...result.cmd]);
    if (hit) errors.push(`/args: ${localTestFlagMessage(hit.flag)}`);
    return;
  }
  for (const half of ['entrypoint', 'cmd'] as const) {
    const given = body[half] !== undefined;
    if (!given && otherPointer === null) continue;
    const hit = findLocalTestFlag(result[half]);
    if (hit) errors.push(`${given ? `/${half}/${hit.index}` : otherPointer}: ${localTestFlagMessage(hit.flag)}`);
  }
}

function normalizeGpu(input: GpuInput, base: GpuSpec | null): GpuSpec {
  const pools = input.pools ?? base?.pools ?? [];
  // pools and excludedTypes are one selection: new pools without exclusions clear them.
  const excluded = input.excludedTypes ?? (input.pools !== undefined ? [] : base?.excludedTypes ?? []);
  return {
    pools: [...pools],
    excludedTypes: excluded.map((t) => t.trim()),
    count: input.count ?? base?.count ?? 1,
    allowedCudaVersions: [...(input.allowedCudaVersions ?? base?.allowedCudaVersions ?? [])],
    minCudaVersion: input.minCudaVersion !== undefined ? input.minCudaVersion : base?.minCudaVersion ?? null,
  };
}

/** The same pools and exclusions, each in any order. */
function sameSelection(a: GpuSpec | null, b: GpuSpec | null): boolean {
  const set = (l: readonly string[]) => JSON.stringify([...new Set(l)].sort());
  return a !== null && b !== null && set(a.pools) === set(b.pools) && set(a.excludedTypes) === set(b.excludedTypes);
}

/** Builds the stored spec of a new endpoint from a create body. */
export function buildEndpoint(raw: unknown, ctx: ValidationContext): EndpointSpec {
  const body = validateWithCudaRule('EndpointCreate', raw, (b) => Array.isArray(b['cpu']) && !(isObject(b['gpu']) && 'pools' in b['gpu']));
  const errors: string[] = [];
  for (const k of CUDA_KEYS) {
    if (body[k] !== undefined) errors.push(`/${k}: unknown property; CUDA constraints go inside gpu`);
  }
  const hasGpu = body.gpu !== undefined && body.gpu !== null;
  const hasCpu = body.cpu !== undefined && body.cpu !== null;
  if (hasGpu === hasCpu) {
    errors.push(hasGpu ? '/cpu: send exactly one of gpu and cpu, not both' : '/gpu: send exactly one of gpu or cpu (neither was given)');
    throw validationError(errors);
  }

  // Rule 7: resolve the template first; explicit body fields win over it.
  let template: TemplateSpec | undefined;
  if (body.templateId !== undefined) {
    template = ctx.template(body.templateId);
    if (!template) {
      throw new AgentError('NOT_FOUND', `Template ${body.templateId} not found or not accessible.`, {
        errors: [`/templateId: template ${body.templateId} not found or not accessible`],
      });
    }
    if (!template.isServerless) throw new AgentError('UNPROCESSABLE', `Template ${body.templateId} is not a serverless template.`, { errors: ['/templateId: template is not serverless'] });
  }
  const image = body.image ?? template?.image;
  if (image === undefined) errors.push('/image: is required unless templateId is set');

  // The template's command is the starting point; body fields override it field by field
  // (`args` as a whole, or `cmd`/`entrypoint` each keeping the template's other half).
  const none = { args: '', entrypoint: [], cmd: [] };
  const fromTemplate = command(template ? command(none, { args: template.args }, errors) : none, body, errors);

  let gpu: GpuSpec | null = null;
  if (hasGpu) {
    const input = body.gpu as GpuInput;
    gpu = normalizeGpu(input, null);
    if (template && input.allowedCudaVersions === undefined && (input.minCudaVersion ?? null) === null) {
      gpu.allowedCudaVersions = [...template.allowedCudaVersions];
    }
    checkGpu(gpu, errors, ctx.hostGpuModels);
  }
  const cpu = hasCpu ? (body.cpu as CpuSpec[]).map((c) => ({ id: c.id, vcpuCount: c.vcpuCount })) : null;
  if (cpu) checkCpu(cpu, errors);

  const type = body.type as EndpointSpec['type'];
  if (type !== 'LOAD_BALANCER') checkLocalTestFlags(fromTemplate, body, errors, '/templateId');
  const scaling = body.scaling as Scaling;
  checkScaling(type, scaling, errors);
  if (!idleTimeoutApplies(type, scaling) && body.workers?.idleTimeout !== undefined) {
    errors.push('/workers/idleTimeout: does not apply to QUEUE endpoints that scale on REQUEST_COUNT');
  }
  const workers: WorkersSpec = { ...DEFAULT_WORKERS, ...body.workers };
  checkWorkers(workers, errors);
  const network = resolveNetwork(body, errors) ?? [];
  const networkPointer = body.mounts?.network === undefined && body.networkVolumes !== undefined ? '/networkVolumes' : '/mounts/network';

  const spec: EndpointSpec = {
    name: body.name as string,
    type,
    image: image ?? '',
    ...fromTemplate,
    disk: body.disk ?? template?.disk ?? null,
    ports: [...(body.ports ?? template?.ports ?? [])],
    env: { ...template?.env, ...body.env },
    registry: body.registry !== undefined ? body.registry : template?.registry ?? null,
    gpu,
    cpu,
    workers,
    scaling,
    dataCenterIds: [...(body.dataCenterIds ?? [])],
    mounts: { network: [...network], global: (body.mounts?.global ?? []).map((m) => m.volumeId) },
    timeout: body.timeout ?? DEFAULT_TIMEOUT_MS,
    flashboot: body.flashboot ?? 'OFF',
    templateId: body.templateId ?? null,
  };
  checkEnv(spec, errors);
  checkReferences(spec, ctx, errors, networkPointer, body.registry === undefined && template?.registry != null);
  return spec;
}

export interface UpdateOutcome {
  spec: EndpointSpec;
  /** Changed fields that active workers only pick up after a restart. */
  restartReasons: string[];
}

// A running container's mounts cannot change: a new volume reaches only new workers, and with
// workers.min above 0 there might never be one.
const RESTART_FIELDS = ['image', 'args', 'env', 'disk', 'ports', 'registry', 'gpu', 'cpu', 'dataCenterIds', 'mounts', 'flashboot'] as const;

/**
 * The restart reasons that change what a worker runs: its image, its command (`args`, with
 * `entrypoint` and `cmd` its parsed form) and its environment.
 */
export const LAUNCH_REASONS: ReadonlySet<string> = new Set(['image', 'args', 'env']);

/**
 * The restart reasons that only a container uses: its disk limit, its ports, its image pull
 * credential, its volume and whether it is kept for a FlashBoot restart. A host process (the
 * process runtime) has none of them, so there a change of these alone replaces nobody.
 */
export const CONTAINER_ONLY_REASONS: ReadonlySet<string> = new Set(['disk', 'ports', 'registry', 'mounts', 'flashboot']);

/** Whether an update body names any field of what a worker runs (changed or not). */
export function namesLaunchField(body: unknown): boolean {
  return isObject(body) && ['image', 'args', 'entrypoint', 'cmd', 'env'].some((k) => body[k] !== undefined);
}

/** Applies a PATCH body to a stored spec (spec, "Update semantics"). */
export function updateEndpoint(current: EndpointSpec, raw: unknown, ctx: ValidationContext): UpdateOutcome {
  const body = validateWithCudaRule('EndpointUpdate', raw,
    (b) => Array.isArray(b['cpu']) || (current.cpu !== null && !(isObject(b['gpu']) && 'pools' in b['gpu'])));
  const errors: string[] = [];
  for (const k of CUDA_KEYS) {
    if (body[k] !== undefined) errors.push(`/${k}: unknown property; CUDA constraints go inside gpu`);
  }
  if (body.type !== undefined && body.type !== current.type) errors.push(`/type: the endpoint type is fixed at creation (${current.type})`);

  let gpu = current.gpu;
  let cpu = current.cpu;
  const gpuGiven = body.gpu !== undefined && body.gpu !== null;
  const cpuGiven = body.cpu !== undefined && body.cpu !== null;
  if (gpuGiven && cpuGiven) errors.push('/cpu: send gpu or cpu, not both');
  if (cpuGiven) {
    cpu = (body.cpu as CpuSpec[]).map((c) => ({ id: c.id, vcpuCount: c.vcpuCount }));
    gpu = null;
    checkCpu(cpu, errors);
  } else if (gpuGiven) {
    const input = body.gpu as GpuInput;
    if (current.gpu === null && input.pools === undefined) errors.push('/gpu/pools: is required to switch a CPU endpoint to GPU');
    gpu = normalizeGpu(input, current.gpu);
    cpu = null;
    checkGpu(gpu, errors, ctx.hostGpuModels);
  } else if ((body.gpu === null && current.gpu !== null) || (body.cpu === null && current.cpu !== null)) {
    errors.push(`${body.gpu === null ? '/gpu' : '/cpu'}: an endpoint needs gpu or cpu; switch by sending the other one`);
  }

  const scaling = body.scaling ?? current.scaling;
  checkScaling(current.type, scaling, errors);
  if (!idleTimeoutApplies(current.type, scaling) && body.workers?.idleTimeout !== undefined) {
    errors.push('/workers/idleTimeout: does not apply to QUEUE endpoints that scale on REQUEST_COUNT');
  }
  const workers: WorkersSpec = { ...current.workers, ...body.workers };
  checkWorkers(workers, errors);

  const network = resolveNetwork(body, errors) ?? current.mounts.network;
  const networkPointer = body.mounts?.network === undefined && body.networkVolumes !== undefined ? '/networkVolumes' : '/mounts/network';
  const global = body.mounts?.global !== undefined ? body.mounts.global.map((m) => m.volumeId) : current.mounts.global;
  const cmd = command(current, body, errors);
  if (current.type !== 'LOAD_BALANCER') checkLocalTestFlags(cmd, body, errors, null);

  const spec: EndpointSpec = {
    ...current,
    name: body.name ?? current.name,
    image: body.image ?? current.image,
    ...cmd,
    disk: body.disk ?? current.disk,
    ports: body.ports ?? current.ports,
    env: body.env ?? current.env,
    registry: body.registry !== undefined ? body.registry : current.registry,
    gpu,
    cpu,
    workers,
    scaling,
    dataCenterIds: body.dataCenterIds ?? current.dataCenterIds,
    mounts: { network: [...network], global: [...global] },
    timeout: body.timeout ?? current.timeout,
    flashboot: body.flashboot ?? current.flashboot,
    // A new hardware selection (other pools or exclusions, or cpu) drops the older REST priority
    // order; a gpu that changes only count or CUDA fields, or sends the same selection again
    // (what GET shows), keeps it.
    gpuTypePriority: cpuGiven || (gpuGiven && !sameSelection(current.gpu, gpu)) ? [] : current.gpuTypePriority ?? [],
  };
  checkEnv(spec, errors);
  checkReferences(spec, ctx, errors, networkPointer);
  // Key order is not a change (an env sent again in another order restarts nothing), nor is an
  // `args` that parses to the same command (other whitespace, its JSON form): a worker runs
  // `entrypoint` and `cmd`, never the string.
  const restartReasons = RESTART_FIELDS.filter((f) => f === 'args'
    ? sortedJson([spec.entrypoint, spec.cmd]) !== sortedJson([current.entrypoint, current.cmd])
    : sortedJson(spec[f]) !== sortedJson(current[f]));
  if (spec.workers.max < current.workers.max) restartReasons.push('workers' as never);
  return { spec, restartReasons: restartReasons as string[] };
}
