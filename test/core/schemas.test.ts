/**
 * flashd compiles its schemas without checking them against the JSON Schema meta-schema (that
 * check compiled the meta-schema at every start). This test is that check, for every file in
 * schema/: a misspelt type or a bound of the wrong type fails here, not silently at run time.
 */
import t from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';

const dir = join(import.meta.dirname, '../../schema');
const files = readdirSync(dir).filter((f) => f.endsWith('.json'));

const checker = (): Ajv2020 => {
  const ajv = new Ajv2020({ strict: false });
  ajv.addVocabulary(['x-flag', 'x-env', 'x-secret', 'x-pattern-hint', 'x-not-hint', 'x-minimum-hint']);
  return ajv;
};

t.ok(files.length >= 6, `the schema files are found (${files.join(', ')})`);
for (const file of files) {
  t.test(file, async (t) => {
    const ajv = checker();
    const ok = ajv.validateSchema(JSON.parse(readFileSync(join(dir, file), 'utf8')));
    t.ok(ok, `valid against the draft 2020-12 meta-schema${ok ? '' : `: ${ajv.errorsText(ajv.errors)}`}`);
  });
}

t.test('the check finds a broken schema', async (t) => {
  const ajv = checker();
  t.notOk(ajv.validateSchema({ $defs: { A: { type: 'strnig' } } }), 'an unknown type');
  t.notOk(ajv.validateSchema({ type: 'integer', minimum: '5' }), 'a bound that is not a number');
});
