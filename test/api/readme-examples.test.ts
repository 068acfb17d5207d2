/**
 * The endpoint bodies README.md gives to copy (`curl … /v2/serverless … -d '{…}'` with a literal
 * JSON body), sent as they are: each must create its endpoint. The examples of "Errors" (a
 * conflicting body) and "API keys" (`{}` sent with a read-only key) are refused on purpose and are
 * left out.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';

interface Example {
  section: string;
  body: string;
}

/** Every single-quoted `-d` body of a curl to `/v2/serverless` that has no shell variable in it. */
function examples(readme: string): Example[] {
  const out: Example[] = [];
  let section = '';
  let inCode = false;
  const lines = readme.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    if (line.startsWith('```')) inCode = !inCode;
    if (!inCode && /^#{2,4} /.test(line)) section = line.replace(/^#+ /, '');
    if (!inCode || !/curl .*\/v2\/serverless["\s]/.test(line)) continue;
    // The command runs to the last line that ends with a backslash, or to the body's closing quote.
    let command = line;
    let j = i;
    while (!/-d '[\s\S]*'\s*(\|.*)?$/.test(command) && j + 1 < lines.length && (/\\$/.test(lines[j] as string) || /-d '[^']*$/.test(command))) {
      command += '\n' + lines[++j];
    }
    const m = /-d '([^']*)'/.exec(command);
    if (m && !(m[1] as string).includes('$')) out.push({ section, body: m[1] as string });
  }
  return out;
}

const refusedOnPurpose = new Set(['Errors', 'API keys']);
const found = examples(readFileSync(`${REPO_ROOT}/README.md`, 'utf8')).filter((e) => !refusedOnPurpose.has(e.section));

t.test('README endpoint bodies create their endpoints as written', async (t) => {
  t.ok(found.some((e) => e.section === 'Containers'), 'the Containers example is among them');
  const a = await startAgent(t);
  for (const e of found) {
    const r = await a.req('POST', '/v2/serverless', { raw: e.body, headers: { 'content-type': 'application/json' } });
    t.equal(r.status, 201, `${e.section}: ${JSON.parse(e.body).name}: ${r.status === 201 ? 'created' : r.json?.detail}`);
  }
});
