/**
 * S9 (perf-anchors §7): cold start of a container worker, FlashBoot OFF against FLASHBOOT.
 *
 * Starts (or reuses, FLASHD_BENCH_CONTAINER_SOCKET) a rootful podman Docker-API service on a
 * socket of its own (as .ci/run does: runc, cgroupfs, no default ulimits), builds or reuses the
 * worker image with build/worker-image.sh (or FLASHD_BENCH_WORKER_IMAGE), starts flashd with
 * `--runtime docker` on a free loopback port and a fresh data dir, and for each mode creates a
 * QUEUE endpoint (cpu3c ×2 vCPU, workers 0..1, idleTimeout 1 s). Per run: wait until the
 * endpoint has no worker and its container is removed (OFF) or kept stopped (FLASHBOOT), then
 * time `POST /runsync` from send to result. flashd's JSON log gives, per run, the runtime's
 * own split (`container started … imageMs createMs startMs totalMs reused`); the job's
 * delayTime gives the moment of its job-take, hence launch → first job-take.
 *
 * No container engine (or not root and no socket given): prints why and exits 0, so
 * `npm run bench` still succeeds. Everything it started is stopped, also on failure.
 *
 * Env: COLD_START_RUNS (default 20), COLD_START_WARMUP (default 2).
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { call } from './lib/http.mjs';
import { handleArgs, headerUsage } from './lib/args.mjs';
import { FLASHD, REPO_ROOT, benchKey, freePort, sleep, startFlashd, track } from './lib/procs.mjs';

handleArgs('bench:cold-start', headerUsage(import.meta.url));

const RUNS = Number(process.env.COLD_START_RUNS ?? 20);
const WARMUP = Number(process.env.COLD_START_WARMUP ?? 2);
const MODES = ['OFF', 'FLASHBOOT'];
const ADMIN = 'bench-admin-key-cold-start-0123456789';
const TARGET_MS = 500;
const LABEL_MANAGED = 'dev.flashd.managed';
const LABEL_INSTANCE = 'dev.flashd.instance';
const LABEL_ENDPOINT = 'dev.flashd.endpoint';

const say = (...a) => console.error('[cold-start]', ...a);
const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' }).status === 0;
const sh = (cmd, args, opts = {}) => spawnSync(cmd, args, { encoding: 'utf8', timeout: 30_000, ...opts });

// ---------------------------------------------------------------------------------------------
// Docker Engine API over the unix socket (loopback only)

function engine(sock, method, p, timeoutMs = 10_000) {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: sock, method, path: p, timeout: timeoutMs }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (text += c));
      res.on('end', () => {
        let body = text;
        try { body = text ? JSON.parse(text) : null; } catch { /* plain text */ }
        resolve({ status: res.statusCode, body });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${p}: timeout`)));
    req.on('error', reject);
    req.end();
  });
}

async function containers(sock, labels) {
  const filters = encodeURIComponent(JSON.stringify({ label: [`${LABEL_MANAGED}=true`, ...labels] }));
  const r = await engine(sock, 'GET', `/containers/json?all=true&filters=${filters}`);
  if (r.status !== 200) throw new Error(`list containers: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

async function pingUntil(sock, ms) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      if ((await engine(sock, 'GET', '/_ping', 2000)).status === 200) return true;
    } catch { /* not yet */ }
    if (Date.now() > until) return false;
    await sleep(200);
  }
}

// ---------------------------------------------------------------------------------------------
// Stats

function pct(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}
function summary(values) {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const mid = v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  return { n: v.length, median: mid, p90: pct(v, 90), min: v[0], max: v[v.length - 1] };
}
const f0 = (x) => (x === null || x === undefined ? '-' : Math.round(x).toString());

// ---------------------------------------------------------------------------------------------

function machine(podmanVersion) {
  const lscpu = sh('lscpu', []).stdout ?? '';
  return {
    nproc: Number((sh('nproc', []).stdout ?? '').trim()) || os.cpus().length,
    cpuModel: /Model name:\s*(.+)/.exec(lscpu)?.[1]?.trim() ?? os.cpus()[0]?.model ?? null,
    memGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    kernel: os.release(),
    podman: podmanVersion,
    node: process.version,
  };
}

function resultPath(date) {
  const dir = path.join(REPO_ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  for (let i = 1; i < 100; i++) {
    const p = path.join(dir, `${date}-cold-start${i === 1 ? '' : `-${i}`}.json`);
    if (!existsSync(p)) return p;
  }
  throw new Error('too many result files for today');
}

async function main() {
  const reuseSock = process.env.FLASHD_BENCH_CONTAINER_SOCKET;
  if (!reuseSock) {
    if (!has('podman')) {
      console.log('cold-start (S9): skipped: podman is not installed (apt-get install -y podman runc debootstrap), and FLASHD_BENCH_CONTAINER_SOCKET names no engine socket');
      return 0;
    }
    if (process.getuid?.() !== 0) {
      console.log('cold-start (S9): skipped: not root, so no rootful podman service (set FLASHD_BENCH_CONTAINER_SOCKET to an engine socket)');
      return 0;
    }
  }
  if (!existsSync(FLASHD)) {
    console.log(`cold-start (S9): skipped: ${FLASHD} is missing (npm run build)`);
    return 0;
  }

  const tmp = mkdtempSync(path.join(os.tmpdir(), 'flashd-cold-start-'));
  const state = { podman: null, flashd: null, sock: reuseSock ?? null, instance: null, dataDir: path.join(tmp, 'data'), cleaned: false };
  // Last resort on SIGINT/exit: bench/lib/procs.mjs SIGKILLs flashd and the service; then
  // remove this instance's containers with the podman CLI (synchronous, bounded).
  process.once('exit', () => {
    if (state.cleaned || !state.instance || !has('podman')) return;
    const ids = sh('podman', ['ps', '-aq', '--filter', `label=${LABEL_INSTANCE}=${state.instance}`], { timeout: 10_000 }).stdout?.split(/\s+/).filter(Boolean) ?? [];
    if (ids.length) sh('podman', ['rm', '-f', ...ids], { timeout: 20_000 });
    rmSync(tmp, { recursive: true, force: true });
  });

  try {
    // 1. the engine
    const podmanEnv = { ...process.env };
    if (!reuseSock) {
      const conf = path.join(tmp, 'containers.conf');
      writeFileSync(conf, '[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = "cgroupfs"\n');
      podmanEnv.CONTAINERS_CONF = conf;
      state.sock = path.join(tmp, 'podman.sock');
      const logFd = path.join(tmp, 'podman-service.log');
      say(`starting podman system service on ${state.sock}`);
      const child = spawn('sh', ['-c', `exec podman --runtime runc system service --time=0 "unix://${state.sock}" >"${logFd}" 2>&1`], { env: podmanEnv, stdio: 'ignore' });
      state.podman = track(child);
      state.podmanExited = new Promise((r) => child.once('exit', r));
      if (!(await pingUntil(state.sock, 60_000))) {
        throw new Error(`podman service did not answer on ${state.sock}:\n${existsSync(logFd) ? readFileSync(logFd, 'utf8').slice(-2000) : ''}`);
      }
    } else if (!(await pingUntil(state.sock, 10_000))) {
      console.log(`cold-start (S9): skipped: no container engine answers on ${state.sock}`);
      return 0;
    }
    const ver = await engine(state.sock, 'GET', '/version');
    const podmanVersion = has('podman') ? (sh('podman', ['--version']).stdout ?? '').trim() : `engine API ${ver.body?.ApiVersion ?? '?'} (${ver.body?.Version ?? '?'})`;
    say(`${podmanVersion} on ${state.sock}`);

    // 2. the worker image
    let image = process.env.FLASHD_BENCH_WORKER_IMAGE;
    if (!image) {
      say('build/worker-image.sh (cached when built before)');
      const r = spawnSync('bash', [path.join(REPO_ROOT, 'build/worker-image.sh')], { cwd: REPO_ROOT, env: podmanEnv, encoding: 'utf8', timeout: 15 * 60_000, stdio: ['ignore', 'pipe', 'inherit'] });
      if (r.status !== 0) throw new Error(`build/worker-image.sh failed (${r.status ?? r.signal})`);
      image = r.stdout.trim().split('\n').pop();
    }
    say(`image ${image}`);

    // 3. flashd
    const port = await freePort();
    const srv = await startFlashd({
      port, dataDir: state.dataDir, adminKey: ADMIN, sync: 'normal', startTimeoutMs: 60_000,
      extra: ['--host', '127.0.0.1', '--runtime', 'docker', '--container-socket', state.sock],
    });
    state.flashd = srv;
    state.instance = readFileSync(path.join(state.dataDir, 'container-instance-id'), 'utf8').trim();
    const events = [];
    let buf = '';
    srv.child.stderr.on('data', (c) => {
      buf += c;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        // text log: `<ISO time> info  [component] <msg> k=v k=v`
        const m = /^(\S+) +\w+ +(?:\[[^\]]*\] )?(container started|worker starting|worker stopping)((?: \S+=\S+)*)$/.exec(line);
        if (!m) continue;
        const o = { msg: m[2], t: Date.parse(m[1]) };
        for (const [, k, v] of m[3].matchAll(/ (\w+)=(\S+)/g)) o[k] = v === 'true' ? true : v === 'false' ? false : /^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v;
        events.push(o);
      }
    });
    // a rate-limit-exempt admin key: the idle polling would hit the per-minute limit
    const auth = `Bearer ${await benchKey(srv.url, ADMIN)}`;

    // 4. the runs
    const results = { scenario: 'S9 cold start: idle endpoint → /runsync result, OFF vs FLASHBOOT', date: new Date().toISOString(), runs: RUNS, warmup: WARMUP, image, machine: machine(podmanVersion), command: 'npm run bench:cold-start', modes: {} };
    for (const mode of MODES) {
      const r = await call(srv.url, 'POST', '/v2/serverless', auth, {
        name: `cold-start-${mode.toLowerCase()}`, type: 'QUEUE', image, scaling: { type: 'QUEUE_DELAY', queueDelay: 4 },
        cpu: [{ id: 'cpu3c', vcpuCount: 2 }], workers: { min: 0, max: 1, idleTimeout: 1 }, flashboot: mode,
      });
      if (r.status !== 201 && r.status !== 200) throw new Error(`endpoint create (${mode}): ${r.status} ${JSON.stringify(r.body)}`);
      const ep = r.body.id;
      const rows = [];
      for (let i = 0; i < WARMUP + RUNS; i++) {
        // idle: no worker, and the container gone (OFF) or kept stopped (FLASHBOOT)
        const until = Date.now() + 60_000;
        let waited = 0;
        for (;;) {
          const h = await call(srv.url, 'GET', `/v2/${ep}/health`, auth);
          const w = h.body?.workers ?? {};
          const noWorker = (w.idle ?? 0) + (w.running ?? 0) + (w.initializing ?? 0) === 0;
          let settled = false;
          if (noWorker) {
            const list = await containers(state.sock, [`${LABEL_ENDPOINT}=${ep}`]);
            settled = i === 0 || mode === 'OFF' ? list.length === 0 : list.length === 1 && list[0].State !== 'running' && list[0].State !== 'stopping';
          }
          if (settled) break;
          if (Date.now() > until) throw new Error(`${mode} run ${i}: endpoint not idle within 60 s: ${JSON.stringify(h.body)}`);
          await sleep(50);
          waited += 50;
        }
        await sleep(200); // let the engine settle after the stop/remove
        const mark = events.length;
        const sendWall = Date.now();
        const t0 = performance.now();
        const res = await call(srv.url, 'POST', `/v2/${ep}/runsync?wait=120000`, auth, { input: { n: i } }, 130_000);
        const e2eMs = performance.now() - t0;
        if (res.status !== 200 || res.body?.status !== 'COMPLETED') throw new Error(`${mode} run ${i}: runsync ${res.status} ${JSON.stringify(res.body)}`);
        // flashd logs the launch before it answers the runsync in practice, but give it a moment
        const evUntil = Date.now() + 2000;
        let started;
        while (!(started = events.slice(mark).find((e) => e.msg === 'container started' && e.endpointId === ep)) && Date.now() < evUntil) await sleep(10);
        const starting = events.slice(mark).find((e) => e.msg === 'worker starting' && e.endpointId === ep);
        const takeWall = sendWall + res.body.delayTime; // job createdAt ≈ send (same clock, ms)
        const launchWall = started ? started.t - started.totalMs : null;
        const row = {
          run: i, warmup: i < WARMUP, e2eMs,
          delayTimeMs: res.body.delayTime, executionTimeMs: res.body.executionTime, workerId: res.body.workerId,
          reused: started?.reused ?? null, imageMs: started?.imageMs ?? null, createMs: started?.createMs ?? null, startMs: started?.startMs ?? null, launchTotalMs: started?.totalMs ?? null,
          sendToLaunchMs: launchWall === null ? null : launchWall - sendWall,
          launchToTakeMs: launchWall === null ? null : takeWall - launchWall,
          startedToTakeMs: started ? takeWall - started.t : null,
          idleWaitMs: waited,
        };
        rows.push(row);
        say(`${mode} ${row.warmup ? 'warm-up' : 'run'} ${i}: e2e ${f0(e2eMs)} ms, launch→take ${f0(row.launchToTakeMs)} ms, create ${f0(row.createMs)} start ${f0(row.startMs)} reused=${row.reused}`);
      }
      const measured = rows.filter((x) => !x.warmup);
      const keys = ['e2eMs', 'delayTimeMs', 'executionTimeMs', 'sendToLaunchMs', 'createMs', 'startMs', 'launchTotalMs', 'launchToTakeMs', 'startedToTakeMs'];
      results.modes[mode] = {
        endpointId: ep,
        reusedRuns: measured.filter((x) => x.reused === true).length,
        summary: Object.fromEntries(keys.map((k) => [k, summary(measured.map((x) => x[k]))])),
        rows,
      };
      await call(srv.url, 'DELETE', `/v2/serverless/${ep}`, auth);
    }

    const fb = results.modes.FLASHBOOT.summary.launchToTakeMs;
    results.target = { what: 'FLASHBOOT restart (launch) → first job-take, p50', targetMs: TARGET_MS, p50Ms: fb?.median ?? null, met: fb ? fb.median <= TARGET_MS : false };

    const file = resultPath(results.date.slice(0, 10));
    writeFileSync(file, JSON.stringify(results, null, 2) + '\n');

    // report
    const lines = [];
    lines.push(`S9 cold start, ${RUNS} runs per mode (+${WARMUP} warm-up), ms: median / p90 / min–max`);
    lines.push('');
    lines.push('| mode | runsync send → result | send → launch | create | start | launch → first job-take | start returned → job-take | reused |');
    lines.push('|---|---|---|---|---|---|---|---|');
    const cell = (s) => (s ? `${f0(s.median)} / ${f0(s.p90)} / ${f0(s.min)}–${f0(s.max)}` : '-');
    for (const mode of MODES) {
      const m = results.modes[mode];
      const s = m.summary;
      lines.push(`| ${mode} | ${cell(s.e2eMs)} | ${cell(s.sendToLaunchMs)} | ${cell(s.createMs)} | ${cell(s.startMs)} | ${cell(s.launchToTakeMs)} | ${cell(s.startedToTakeMs)} | ${m.reusedRuns}/${RUNS} |`);
    }
    lines.push('');
    lines.push(`Target (FlashBoot restart → first job-take ≤ ${TARGET_MS} ms p50): ${results.target.met ? 'met' : 'NOT met'} (p50 ${f0(results.target.p50Ms)} ms)`);
    lines.push(`raw: ${path.relative(REPO_ROOT, file)}`);
    console.log(lines.join('\n'));
    return 0;
  } finally {
    await cleanup(state, tmp);
  }
}

async function cleanup(state, tmp) {
  if (state.flashd) {
    say('stopping flashd');
    await state.flashd.stop(15_000).catch(() => undefined);
  }
  if (state.sock && state.instance) {
    try {
      const left = await containers(state.sock, [`${LABEL_INSTANCE}=${state.instance}`]);
      for (const c of left) await engine(state.sock, 'DELETE', `/containers/${c.Id}?force=true`, 20_000).catch(() => undefined);
      if (left.length) say(`removed ${left.length} leftover container(s)`);
    } catch (err) {
      say(`could not list leftover containers: ${err.message}`);
    }
  }
  if (state.podman) {
    say('stopping the podman service');
    const c = state.podman;
    if (c.exitCode === null && c.signalCode === null) {
      c.kill('SIGTERM');
      const t = setTimeout(() => c.kill('SIGKILL'), 10_000);
      await state.podmanExited;
      clearTimeout(t);
    }
  }
  state.cleaned = true;
  rmSync(tmp, { recursive: true, force: true });
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`cold-start (S9) failed: ${err.stack ?? err}`);
    process.exit(1);
  },
);
