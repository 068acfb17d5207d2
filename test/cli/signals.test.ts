/**
 * Signals and stdio as an operator meets them, on the bundle `dist/flashd.mjs` started as its own
 * process: a signal at any moment of the start, and a log reader that goes away.
 */
import t from 'tap';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { cleanEnv, REPO_ROOT, startFlashd } from '../helpers/spawn-flashd.js';
import { testDataDir } from '../helpers/data-dir.js';

const BUNDLE = join(REPO_ROOT, 'dist/flashd.mjs');
const node = process.execPath;

t.before(() => {
  if (!existsSync(BUNDLE)) throw new Error('dist/flashd.mjs is missing: run `npm run build` (npm test does) first');
});

t.test('a closed stderr pipe does not end flashd: it goes on serving and stops cleanly on SIGTERM', async (t) => {
  // `flashd 2> >(head -n 4 > f)`, a killed `| tee`, a log shipper restarting: the next log line
  // met EPIPE, an uncaught 'error' that exited 1 with nothing closed.
  const dir = testDataDir(t);
  const f = await startFlashd(t, node, [BUNDLE, '--port', '0', '--data-dir', dir, '--runtime', 'none'], cleanEnv());
  const key = readFileSync(join(dir, 'admin-api-key'), 'utf8').trim();
  f.child.stderr?.destroy();
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  for (let i = 0; i < 3; i++) {
    // Each logs `api key created` to the closed pipe.
    const created = await fetch(`${f.url}/v2/api-keys`, { method: 'POST', headers: auth, body: JSON.stringify({ name: `k${i}`, scopes: ['endpoints:read'] }) });
    t.equal(created.status, 201, `request ${i} after the pipe closed is served`);
  }
  t.equal((await fetch(`${f.url}/healthz`)).status, 200, '/healthz answers');
  t.equal(f.child.exitCode, null, 'still running');
  t.equal(await f.stop('SIGTERM'), 0, 'SIGTERM still exits 0 (its log lines go nowhere)');
  t.notOk(existsSync(join(dir, 'flashd.db-wal')) && statSync(join(dir, 'flashd.db-wal')).size > 0, 'the WAL was checkpointed by the clean close');
});

/**
 * Starts flashd, sends SIGTERM `after` ms after `milestone` appears on its stderr, and reports how it
 * ended. A plain node process watches, not this test: tap's own process, busy with its loader,
 * reacted tens of milliseconds late, after the window that lost the signal had closed. It is
 * started through `env -i`: tap's process-info hook wraps child_process.spawn and puts its
 * `--import` back into every child's NODE_OPTIONS whatever env is given, and that hook adds
 * signal listeners of its own to flashd, so serve() never removed the last one and no signal was
 * lost: without the fix, the test then passed.
 */
const SIGNAL_AT = `
import { spawn } from 'node:child_process';
const [bundle, milestone, after, dir] = process.argv.slice(1);
const child = spawn(process.execPath, [bundle, '--port', '0', '--data-dir', dir, '--runtime', 'none'], { stdio: ['ignore', 'ignore', 'pipe'] });
let stderr = '';
let sent = false;
child.stderr.on('data', (c) => {
  stderr += c;
  if (!sent && stderr.includes(milestone)) { sent = true; setTimeout(() => child.kill('SIGTERM'), Number(after)); }
});
const lost = setTimeout(() => child.kill('SIGKILL'), 10_000);
child.on('exit', (code, signal) => { clearTimeout(lost); process.stdout.write(JSON.stringify({ sent, code, signal, stderr })); });
`;

t.test('a SIGTERM sent at each start-up log line, and at steps after the last one before listening, stops flashd cleanly (none is lost)', async (t) => {
  // The end of the start, from shortly after the `hardware` line to serve()'s handing over to its
  // running listeners, has no turn of the loop: a signal caught then waited in libuv, and was
  // dropped when serve() removed its start-up listeners, so flashd kept running (every try at
  // 2 to 20 ms after `hardware` on a 2-vCPU host).
  const points: [string, number][] = [['store created', 0], ['hardware', 0], ['hardware', 2], ['hardware', 5], ['hardware', 10], ['hardware', 20], ['flashd listening', 0]];
  for (const [milestone, after] of points) {
    const watcher = spawn('env', ['-i', `PATH=${process.env.PATH ?? ''}`, node, '--input-type=module', '-e', SIGNAL_AT, BUNDLE, milestone, String(after), testDataDir(t)], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    watcher.stdout.on('data', (c: Buffer) => (out += c.toString()));
    await once(watcher, 'exit');
    const r = JSON.parse(out) as { sent: boolean; code: number | null; signal: string | null; stderr: string };
    const what = `SIGTERM ${after} ms after "${milestone}"`;
    t.ok(r.sent, `${what}: sent`);
    t.equal(r.signal, null, `${what}: neither killed by it nor still running 10 s later\n${r.stderr}`);
    t.equal(r.code, 0, `${what}: exit 0`);
    t.match(r.stderr, /shutting down signal=SIGTERM/, `${what}: shutting down`);
    t.match(r.stderr.trimEnd().split('\n').at(-1), /info +stopped ms=\d+ exitCode=0$/, `${what}: stopped is the last line`);
  }
});
