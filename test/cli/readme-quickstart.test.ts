/**
 * README "A first job", run as written: the bash block of that section, in a directory that has
 * the checkout's `dist/` and `python/` as README's "this directory" has, against a flashd
 * started the way `npm start` starts it on its first start (no FLASHD_ADMIN_API_KEY, so the
 * block reads the generated key from `data/admin-api-key`). The one change is the address: the
 * block's `http://127.0.0.1:8000` becomes this flashd's (another test may hold port 8000), and
 * `worker-env` gets the same through FLASHD_URL, as README says for another port. The block's
 * last `# {…}` line is the reply README shows: the real reply must have exactly its fields.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { cleanEnv, REPO_ROOT, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');

/** The first ```bash block after the heading `### A first job`. */
function firstJobBlock(): string {
  const at = readme.indexOf('\n### A first job\n');
  if (at < 0) throw new Error('README has no "### A first job" section');
  const m = /```bash\n([\s\S]*?)```/.exec(readme.slice(at));
  if (!m) throw new Error('README "A first job" has no bash block');
  return m[1] as string;
}

function runBash(script: string, cwd: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-e', '-o', 'pipefail', '-c', script], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

t.test('README "A first job" runs as written and gets the reply it shows', async (t) => {
  const block = firstJobBlock();
  t.match(block, /http:\/\/127\.0\.0\.1:8000/, 'the block talks to the default address');
  t.match(block, /data\/admin-api-key/, 'the block reads the key that the first start saved');

  const dir = testDataDir(t);
  const cwd = join(dir, 'checkout');
  mkdirSync(cwd);
  symlinkSync(join(REPO_ROOT, 'dist'), join(cwd, 'dist'));
  symlinkSync(join(REPO_ROOT, 'python'), join(cwd, 'python'));
  const flashd = await startFlashd(t, process.execPath, ['dist/flashd.mjs', '--port', '0', '--data-dir', join(cwd, 'data')], cleanEnv());
  t.teardown(() => flashd.stop('SIGKILL'));
  t.match(await flashd.stdoutHolding('fd_usr_'), /First start: created an admin API key/, 'a first start, as in the Quick start');

  // The worker started in the background is stopped once the block is done with it.
  const script = block.replaceAll('http://127.0.0.1:8000', flashd.url) + '\nkill $! 2>/dev/null || true\n';
  const r = await runBash(script, cwd, cleanEnv({ FLASHD_URL: flashd.url }), 90_000);
  t.equal(r.code, 0, `the block exits 0; stderr:\n${r.stderr}`);

  const lines = r.stdout.trim().split('\n');
  const reply = JSON.parse(lines[lines.length - 1] as string) as Record<string, unknown>;
  t.equal(reply['status'], 'COMPLETED', `the job completed: ${r.stdout}`);
  t.same(reply['output'], { echo: { hello: 'world' } }, "the handler's output came back");
  t.match(reply['workerId'], /^wkr_/, 'the worker that ran it is named');

  const shown = [...block.matchAll(/^# (\{.*\})$/gm)].pop();
  t.ok(shown, 'the block shows the reply');
  const shownKeys = [...(shown?.[1] ?? '').matchAll(/"(\w+)":/g)].map((m) => m[1]).filter((k) => k !== 'echo' && k !== 'hello');
  t.same(shownKeys, Object.keys(reply), 'README shows the reply with its fields, in their order');
});
