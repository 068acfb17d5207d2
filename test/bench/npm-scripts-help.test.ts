/**
 * `npm run bench -- --help` and `npm run chaos -- --help`, as a new user types them, print what
 * the script does and which environment variables it takes, and exit 0 at once. npm appends
 * the arguments after `--` to the last command of a script only, and `bench` chained
 * `bench/run.mjs && bench/cold-start.mjs`: `--help` reached cold-start.mjs alone, after the
 * whole 7-minute benchmark had run. Arguments the scripts do not take are refused (exit 2)
 * rather than ignored while minutes of load start. Each run is in its own process group,
 * killed whole on the timeout, so a script that ignores --help leaves nothing behind.
 */
import { spawn } from 'node:child_process';
import t from 'tap';
import { REPO_ROOT } from '../helpers/spawn-flashd.js';

function npmRun(args: string[], timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string; timedOut: boolean }> {
  return new Promise((resolve, reject) => {
    const child = spawn('npm', ['run', '--silent', ...args], { cwd: REPO_ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    const timer = setTimeout(() => {
      timedOut = true;
      try { process.kill(-(child.pid as number), 'SIGKILL'); } catch { /* gone */ }
    }, timeoutMs);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, timedOut });
    });
  });
}

t.test('npm run bench -- --help prints its usage and runs no benchmark', async (t) => {
  const r = await npmRun(['bench', '--', '--help'], 20_000);
  t.equal(r.timedOut, false, 'answers at once rather than starting the benchmark');
  t.equal(r.code, 0, r.stderr);
  t.match(r.stdout, /BENCH_QUICK=1/, 'names the settings, which are environment variables');
  t.match(r.stdout, /COLD_START_RUNS/, 'and those of the cold-start part');
  t.notMatch(r.stdout, /built dist\/flashd\.mjs/, 'nothing built, nothing run');
});

t.test('npm run bench -- --quick is refused, naming the variable to use', async (t) => {
  const r = await npmRun(['bench', '--', '--quick'], 20_000);
  t.equal(r.timedOut, false);
  t.equal(r.code, 2);
  t.match(r.stderr, /--quick/);
  t.match(r.stderr, /BENCH_QUICK=1/);
});

t.test('npm run chaos -- --help prints its usage and runs no crash test', async (t) => {
  const r = await npmRun(['chaos', '--', '--help'], 20_000);
  t.equal(r.timedOut, false, 'answers at once rather than starting the crash test');
  t.equal(r.code, 0, r.stderr);
  t.match(r.stdout, /CHAOS_JOBS/);
  t.match(r.stdout, /lost=0 duplicated=0/);
});

t.test('npm run chaos -- --jobs 100 is refused, naming the environment variables', async (t) => {
  const r = await npmRun(['chaos', '--', '--jobs', '100'], 20_000);
  t.equal(r.timedOut, false);
  t.equal(r.code, 2);
  t.match(r.stderr, /--jobs/);
  t.match(r.stderr, /CHAOS_JOBS/);
});
