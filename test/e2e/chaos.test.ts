/**
 * The crash test (`npm run chaos`, bench/chaos.mjs) in small: 300 jobs while flashd and worker
 * processes are SIGKILLed and restarted. Every job that got a 200 from /run must complete
 * exactly once, and every third one's webhook (to a receiver inside the script) must arrive at
 * least once with the job's final status and output. flashd is bundled into a directory of this test's own, so the CLI tests that
 * rebuild dist/flashd.mjs at the same time cannot pull the file from under it; ports are free
 * ones picked by the script.
 */
import t from 'tap';
import { spawn, spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { cleanEnv, REPO_ROOT } from '../helpers/spawn-flashd.js';

const dir = join(REPO_ROOT, 'dist', `chaos-test-${process.pid}`);
const entry = join(dir, 'flashd.mjs');

t.teardown(() => rmSync(dir, { recursive: true, force: true }));

t.test('chaos: kill -9 of workers and flashd loses and duplicates nothing, webhooks included', async (t) => {
  const built = spawnSync(process.execPath, ['--input-type=module', '-e', `const { bundle } = await import(${JSON.stringify(join(REPO_ROOT, 'build/bundle.mjs'))}); await bundle({ outfile: ${JSON.stringify(entry)} });`], {
    cwd: REPO_ROOT, env: cleanEnv(), encoding: 'utf8', timeout: 60_000,
  });
  t.equal(built.status, 0, `flashd bundled for the test${built.status === 0 ? '' : `: ${built.stderr}`}`);

  const env = cleanEnv({
    CHAOS_JOBS: '300', CHAOS_KILLS: '6', CHAOS_WORKERS: '4', CHAOS_SECONDS: '10', CHAOS_FLASHD: entry,
    // A loaded CI box: wider bounds than the defaults, all well inside tap's 120 s.
    CHAOS_REQUEUE_LIMIT_MS: '15000', CHAOS_TIMEOUT_S: '100',
  });
  const child = spawn(process.execPath, [join(REPO_ROOT, 'bench/chaos.mjs')], { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (out += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (out += c));
  const killer = setTimeout(() => child.kill('SIGKILL'), 110_000);
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  clearTimeout(killer);

  const summary = /^lost=\d+ duplicated=\d+ .*$/m.exec(out)?.[0] ?? '';
  t.equal(code, 0, 'bench/chaos.mjs exits 0');
  t.match(summary, /^lost=0 duplicated=0 unexpected=0 /, 'lost=0 duplicated=0 unexpected=0');
  t.match(out, /^chaos: \d+ passed, 0 failed$/m, 'every chaos check passed');
  t.match(summary, /integrity=ok/, 'integrity_check ok');
  t.notMatch(summary, /flashdKills=0 workerKills=0 selfKills=0\/0\/0/, 'something was killed');
  const hooks = /^webhooks: owed=(\d+) delivered=(\d+) missing=\d+ .*$/m.exec(out);
  t.match(hooks?.[0] ?? '', /^webhooks: owed=[1-9]\d* delivered=\d+ missing=0 extra=\d+ unexpected=0 mismatched=0 malformed=0 /,
    'every owed webhook delivered, none unexpected, every body agrees with /status');
  t.equal(hooks?.[2], hooks?.[1], 'delivered equals owed');
  if (code !== 0 || !summary) t.comment(out.slice(-6000));
});
