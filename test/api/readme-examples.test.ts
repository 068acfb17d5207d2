/**
 * The endpoint bodies README.md gives to copy (`curl … /v2/serverless … -d '{…}'` with a literal
 * JSON body), sent as they are: each must create its endpoint. The examples of "Errors" (a
 * conflicting body) and "API keys" (`{}` sent with a read-only key) are refused on purpose and are
 * left out. With a container engine (podman, as `.ci/run` starts it), README's worker Dockerfile
 * is built, FROM the local test worker image instead of python:*-slim (no registry here), and
 * takes a job.
 */
import { execFile } from 'node:child_process';
import { cpSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { cpuBody, startAgent } from '../helpers/agent.js';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

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

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'];
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'];
const run = promisify(execFile);
const podman = await run('podman', ['--version']).then(() => true, () => false);

t.test('README\'s worker Dockerfile builds an image whose worker takes a job', {
  skip: SOCKET && IMAGE && podman ? false : 'needs podman and FLASHD_TEST_CONTAINER_SOCKET, FLASHD_TEST_WORKER_IMAGE (set by .ci/run)',
}, async (t) => {
  const readme = readFileSync(`${REPO_ROOT}/README.md`, 'utf8');
  const dockerfile = /```dockerfile\n([\s\S]*?)```/.exec(readme)?.[1];
  const handler = /cat > handler\.py <<'PY'\n([\s\S]*?)\nPY\n/.exec(readme)?.[1];
  if (!dockerfile || !handler) return t.fail(`README has a Dockerfile (${!!dockerfile}) and the handler.py it copies (${!!handler})`);
  t.match(dockerfile, /^FROM python:\S+-slim$/m, 'FROM an official Python image');
  const ctx = testDataDir(t);
  writeFileSync(join(ctx, 'Dockerfile'), dockerfile.replace(/^FROM .*$/m, `FROM ${IMAGE}`));
  writeFileSync(join(ctx, 'handler.py'), handler + '\n');
  cpSync(join(REPO_ROOT, 'python/vendor_flash'), join(ctx, 'vendor_flash'), { recursive: true, filter: (p) => !p.includes('__pycache__') });
  const tag = `localhost/flashd-readme-worker:${process.pid}`;
  const engine = ['--url', `unix://${SOCKET}`];
  await run('podman', [...engine, 'build', '-q', '-t', tag, ctx], { timeout: 300_000 });
  t.teardown(() => run('podman', [...engine, 'rmi', '-f', tag]).catch(() => undefined));

  const a = await startAgent(t, { runtime: 'docker', containerSocket: SOCKET, takeHoldMs: 1000 });
  // The base image's PYTHONPATH holds its own SDK copy: only the one the Dockerfile copied may be imported.
  const ep = await a.req('POST', '/v2/serverless', { body: cpuBody({ image: tag, env: { PYTHONPATH: '/nonexistent' }, workers: { min: 0, max: 1, idleTimeout: 5 } }) });
  t.equal(ep.status, 201, ep.status === 201 ? 'endpoint created' : ep.text);
  const r = await a.req('POST', `/v2/${ep.json.id}/runsync?wait=120000`, { body: { input: { hello: 'world' } } });
  t.equal(r.json?.status, 'COMPLETED', JSON.stringify(r.json));
  t.same(r.json?.output, { echo: { hello: 'world' } }, 'the README handler answered');
});
