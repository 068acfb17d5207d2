/**
 * The JSON Schemas in `schema/` are the one contract: they validate requests here and become
 * the components of the OpenAPI document (api/openapi.ts). Validators are compiled once, at
 * first use, and their failures become one readable string each for problem+json `errors`.
 */
import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import endpointSchema from '../../schema/endpoint.schema.json' with { type: 'json' };
import resourcesSchema from '../../schema/resources.schema.json' with { type: 'json' };
import authSchema from '../../schema/auth.schema.json' with { type: 'json' };
import problemSchema from '../../schema/problem.schema.json' with { type: 'json' };
import jobsSchema from '../../schema/jobs.schema.json' with { type: 'json' };
import { validationError } from './errors.js';

/** Every schema document, keyed by file name. Their `$defs` names are unique across files. */
export const SCHEMA_DOCUMENTS: Readonly<Record<string, { $id: string; $defs: Record<string, unknown> }>> = {
  'endpoint.schema.json': endpointSchema as never,
  'resources.schema.json': resourcesSchema as never,
  'auth.schema.json': authSchema as never,
  'problem.schema.json': problemSchema as never,
  'jobs.schema.json': jobsSchema as never,
};

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => void;
// validateSchema off: checking these fixed documents against the draft 2020-12 meta-schema
// compiled that meta-schema at every start (about 100 ms of CPU before flashd listens, each
// restart). test/core/schemas.test.ts checks every file in schema/ against it instead.
const ajv = new Ajv2020({ allErrors: true, strict: true, discriminator: true, allowUnionTypes: true, validateSchema: false });
addFormats(ajv);
// `x-pattern-hint` beside a `pattern` says in words what the pattern wants (as in the config schema).
ajv.addVocabulary(['x-pattern-hint']);
const defLocation = new Map<string, string>();
for (const [file, doc] of Object.entries(SCHEMA_DOCUMENTS)) {
  ajv.addSchema(doc);
  for (const name of Object.keys(doc.$defs)) {
    if (defLocation.has(name)) throw new Error(`schema name ${name} defined twice (${defLocation.get(name)} and ${file})`);
    defLocation.set(name, `${doc.$id}#/$defs/${name}`);
  }
}

/** The pattern the schemas put on strings that reach a process (env values, commands) or the engine (registry password): no NUL. */
const NO_NUL_PATTERN = '^[^\\u0000]*$';
/** The pattern on strings the container engine takes as they are (registry user name): no control character. */
const NO_CONTROL_PATTERN = '^[^\\u0000-\\u001f\\u007f]*$';

/** The `x-pattern-hint` of every pattern that has one, for its failure's message (the value is never echoed). */
const patternHints = new Map<string, string>();
(function collectHints(node: unknown): void {
  if (typeof node !== 'object' || node === null) return;
  const o = node as Record<string, unknown>;
  if (typeof o['pattern'] === 'string' && typeof o['x-pattern-hint'] === 'string') patternHints.set(o['pattern'], o['x-pattern-hint']);
  for (const v of Object.values(o)) collectHints(v);
})(SCHEMA_DOCUMENTS);

const compiled = new Map<string, ValidateFunction>();

function validatorFor(name: string): ValidateFunction {
  let fn = compiled.get(name);
  if (!fn) {
    const ref = defLocation.get(name);
    if (!ref) throw new Error(`unknown schema ${name}`);
    fn = ajv.getSchema(ref);
    if (!fn) throw new Error(`cannot compile schema ${name}`);
    compiled.set(name, fn);
  }
  return fn;
}

export function hasSchema(name: string): boolean {
  return defLocation.has(name);
}

/** One line per failure, pointing at the offending place in the body (JSON Pointer). */
export function formatSchemaErrors(errors: readonly ErrorObject[]): string[] {
  const out: string[] = [];
  // A member that may also be null (`anyOf: [X, {type: null}]`) whose value fails X also fails the
  // null branch: that "must be null" is noise beside what X says, and a wrong type there is
  // "must be X or null".
  const nullBranches = new Set<ErrorObject>();
  const orNull = new Set<ErrorObject>();
  for (const e of errors) {
    if (e.keyword !== 'type' || (e.params as Record<string, unknown>)['type'] !== 'null' || !/\/(anyOf|oneOf)\/\d+\/type$/.test(e.schemaPath)) continue;
    const others = errors.filter((o) => o !== e && o.keyword !== 'anyOf' && o.keyword !== 'oneOf'
      && (o.instancePath === e.instancePath || o.instancePath.startsWith(`${e.instancePath}/`)));
    if (others.length === 0) continue;
    nullBranches.add(e);
    for (const o of others) if (o.keyword === 'type' && o.instancePath === e.instancePath) orNull.add(o);
  }
  for (const e of errors) {
    if (nullBranches.has(e)) continue;
    const at = e.instancePath || '(body)';
    const p = e.params as Record<string, unknown>;
    let line: string;
    // A rule on an object's keys (`propertyNames`: env names): name the key, which the path cannot.
    if (e.keyword === 'propertyNames') continue; // "property name must be valid": the error before it says which and why
    if (e.propertyName !== undefined) {
      line = `${at}: the name ${JSON.stringify(e.propertyName)} ${e.message ?? 'is invalid'}`;
      if (!out.includes(line)) out.push(line);
      continue;
    }
    switch (e.keyword) {
      case 'additionalProperties':
        line = `${e.instancePath || ''}/${String(p['additionalProperty'])}: unknown property`;
        break;
      case 'required':
        line = `${e.instancePath || ''}/${String(p['missingProperty'])}: is required`;
        break;
      case 'enum':
        line = `${at}: must be one of ${(p['allowedValues'] as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
        break;
      case 'const':
        line = `${at}: must be ${JSON.stringify(p['allowedValue'])}`;
        break;
      case 'discriminator':
        // A missing tag is already reported by `required`; say it once.
        if (p['error'] !== 'mapping' && errors.some((o) => o.keyword === 'required' && o.instancePath === e.instancePath && o.params['missingProperty'] === p['tag'])) continue;
        line = p['error'] === 'mapping'
          ? `${at}/${String(p['tag'])}: must be one of "QUEUE_DELAY", "REQUEST_COUNT"`
          : `${at}/${String(p['tag'])}: is required and must be a string`;
        break;
      case 'uniqueItems':
        line = `${at}: must not contain duplicate items (items ${String(p['j'])} and ${String(p['i'])} are equal)`;
        break;
      case 'pattern':
        // The schemas' NUL and control-character guards, and patterns with an x-pattern-hint: say what is wrong, not the regex.
        line = p['pattern'] === NO_NUL_PATTERN ? `${at}: must not contain a NUL character (\\u0000)`
          : p['pattern'] === NO_CONTROL_PATTERN ? `${at}: must not contain a control character (U+0000 to U+001F, U+007F)`
          : patternHints.has(String(p['pattern'])) ? `${at}: must be ${patternHints.get(String(p['pattern']))}`
          : `${at}: ${e.message ?? 'is invalid'}`;
        break;
      case 'minLength':
      case 'minItems': {
        // Ajv's "must NOT have fewer than 1 characters": say it as a person would.
        const n = Number(p['limit']);
        line = n === 1 ? `${at}: must not be empty`
          : e.keyword === 'minLength' ? `${at}: must be at least ${n} characters long` : `${at}: must have at least ${n} items`;
        break;
      }
      case 'maxLength':
        line = `${at}: must be at most ${String(p['limit'])} characters long`;
        break;
      case 'maxItems':
        line = `${at}: must have at most ${String(p['limit'])} items`;
        break;
      case 'anyOf':
      case 'oneOf':
        continue; // the branch errors around it say more
      case 'type': {
        const types = [...String(p['type']).split(','), ...(orNull.has(e) ? ['null'] : [])];
        line = `${at}: must be ${types.join(' or ')}`;
        break;
      }
      default:
        line = `${at}: ${e.message ?? 'is invalid'}`;
    }
    if (!out.includes(line)) out.push(line);
  }
  return out.length ? out : ['(body): is invalid'];
}

/** Validates `value` against the named schema; throws a 400 with every failure listed. */
export function assertSchema<T>(name: string, value: unknown): T {
  const fn = validatorFor(name);
  if (!fn(value)) throw validationError(formatSchemaErrors(fn.errors ?? []));
  return value as T;
}

/** Compiles every schema (tests call this so a strict-mode mistake fails CI, not a request). */
export function compileAllSchemas(): string[] {
  for (const name of defLocation.keys()) validatorFor(name);
  return [...defLocation.keys()];
}
