/**
 * Child processes of the bench and the chaos test: flashd, redis-server, workers. Every child
 * is registered so that it is killed when the parent exits, normally or not, and every wait
 * is bounded in time.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { call } from './http.mjs';

export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const FLASHD = fileURLToPath(new URL('../../dist/flashd.mjs', import.meta.url));

const children = new Set();

function killAll() {
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) {
      try {
        c.kill('SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}
process.once('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => {
    killAll();
    process.exit(130);
  });
}

/** Registers a child so it is killed when this process exits. */
export function track(child) {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let tasksetOk;
/** Whether `taskset` exists and there are at least 2 CPUs to split. */
export function canPin() {
  if (tasksetOk === undefined) {
    const r = spawnSync('taskset', ['-p', String(process.pid)], { encoding: 'utf8' });
    tasksetOk = r.status === 0 && (globalThis.navigator?.hardwareConcurrency ?? 2) >= 2;
  }
  return tasksetOk;
}

/** Pins this process (all its threads) to `cpu`; returns whether it worked. */
export function pinSelf(cpu) {
  if (!canPin()) return false;
  return spawnSync('taskset', ['-a', '-cp', String(cpu), String(process.pid)], { encoding: 'utf8' }).status === 0;
}

/** argv prefixed with taskset when pinning is possible. */
export function pinned(cpu, command, args) {
  return cpu !== undefined && canPin() ? ['taskset', ['-c', String(cpu), command, ...args]] : [command, args];
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Waits until `pattern` shows up in the stream's text, or rejects after `ms`. */
function waitFor(stream, pattern, ms, what, child) {
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (c) => {
      text += c;
      if (text.length > 200_000) text = text.slice(-100_000);
      const m = pattern.exec(text);
      if (m) {
        done();
        resolve(m);
      }
    };
    const onExit = (code, sig) => {
      done();
      reject(new Error(`${what} exited (${code ?? sig}) before it was ready:\n${text.slice(-4000)}`));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`${what} not ready within ${ms} ms:\n${text.slice(-4000)}`));
    }, ms);
    const done = () => {
      clearTimeout(timer);
      stream.off('data', onData);
      child.off('exit', onExit);
    };
    stream.on('data', onData);
    child.once('exit', onExit);
  });
}

/**
 * Starts `node dist/flashd.mjs` (optionally pinned) and resolves once it listens.
 * opts: { port, dataDir, adminKey, sync: 'full'|'normal', leaseMs, takeHoldMs, cpu, extra: [], entry }
 */
export async function startFlashd(opts) {
  const entry = opts.entry ?? FLASHD;
  if (!existsSync(entry)) throw new Error(`${entry} is missing: run npm run build first`);
  const args = ['--port', String(opts.port), '--data-dir', opts.dataDir, '--sqlite-synchronous', opts.sync ?? 'full'];
  if (opts.leaseMs) args.push('--lease-ms', String(opts.leaseMs));
  if (opts.takeHoldMs) args.push('--take-hold-ms', String(opts.takeHoldMs));
  if (opts.extra) args.push(...opts.extra);
  const [cmd, argv] = pinned(opts.cpu, process.execPath, [entry, ...args]);
  const env = { ...process.env, FLASHD_ADMIN_API_KEY: opts.adminKey };
  delete env.NODE_OPTIONS;
  const t0 = performance.now();
  const child = track(spawn(cmd, argv, { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] }));
  child.stdout.setEncoding('utf8').resume();
  child.stderr.setEncoding('utf8');
  let tail = '';
  child.stderr.on('data', (c) => {
    tail = (tail + c).slice(-20_000);
  });
  await waitFor(child.stderr, /flashd listening url=(\S+)/, opts.startTimeoutMs ?? 30_000, 'flashd', child);
  const url = `http://127.0.0.1:${opts.port}`;
  const exited = new Promise((r) => child.once('exit', (code, sig) => r(code ?? sig)));
  return {
    child,
    pid: child.pid,
    url,
    startMs: performance.now() - t0,
    stderrTail: () => tail,
    exited,
    /** SIGKILL, resolves when gone. */
    kill: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      return exited;
    },
    /** SIGTERM, then SIGKILL after `ms`. */
    stop: async (ms = 10_000) => {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), ms);
      const r = await exited;
      clearTimeout(t);
      return r;
    },
  };
}

/** Admin setup on a fresh flashd: a rate-limit-exempt admin key for the load. */
export async function benchKey(url, adminKey) {
  const r = await call(url, 'POST', '/v2/api-keys', `Bearer ${adminKey}`, { name: 'bench', scopes: ['admin'], exempt: true });
  if (r.status !== 201 && r.status !== 200) throw new Error(`api-key create: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.key;
}

export async function createEndpoint(url, key, name = 'b') {
  const r = await call(url, 'POST', '/v2/serverless', `Bearer ${key}`, {
    name, type: 'QUEUE', scaling: { type: 'QUEUE_DELAY', queueDelay: 4 }, image: 'none',
    cpu: [{ id: 'cpu3c', vcpuCount: 2 }], workers: { min: 0, max: 0 },
  });
  if (r.status !== 201 && r.status !== 200) throw new Error(`endpoint create: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.id;
}

/** A new worker id and worker key for the endpoint. */
export async function workerEnv(url, key, endpointId) {
  const r = await call(url, 'GET', `/v2/serverless/${endpointId}/worker-env`, `Bearer ${key}`);
  if (r.status !== 200) throw new Error(`worker-env: ${r.status} ${JSON.stringify(r.body)}`);
  return { workerId: r.body.workerId, key: r.body.env.RUNPOD_AI_API_KEY, env: r.body.env };
}

/** utime+stime of a process in seconds (Linux /proc), or null. */
export function cpuSeconds(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return null;
  }
}

/** Resident set size in MB, or null. */
export function rssMb(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'latin1'));
    return m ? Math.round(Number(m[1]) / 1024) : null;
  } catch {
    return null;
  }
}

/** Starts redis-server (optionally pinned) on a free port; null when it is not installed. */
export async function startRedis(opts) {
  const which = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
  if (which.status !== 0) return null;
  const args = ['--port', String(opts.port), '--bind', '127.0.0.1', '--save', '', '--dir', opts.dir, '--protected-mode', 'yes', '--daemonize', 'no', '--loglevel', 'warning'];
  if (opts.aof) args.push('--appendonly', 'yes', '--appendfsync', 'always');
  else args.push('--appendonly', 'no');
  const [cmd, argv] = pinned(opts.cpu, 'redis-server', args);
  const child = track(spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] }));
  child.stderr.setEncoding('utf8').resume();
  child.stdout.setEncoding('utf8');
  const exited = new Promise((r) => child.once('exit', (code, sig) => r(code ?? sig)));
  // Ready when the port accepts connections.
  const deadline = Date.now() + 10_000;
  for (;;) {
    const ok = await new Promise((r) => {
      const s = net.connect({ host: '127.0.0.1', port: opts.port }, () => {
        s.destroy();
        r(true);
      });
      s.once('error', () => r(false));
    });
    if (ok) break;
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error('redis-server did not start');
    }
    await sleep(50);
  }
  child.stdout.resume();
  return {
    child, pid: child.pid, port: opts.port,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      return exited;
    },
  };
}

/** Busy CPU seconds of the whole machine (all CPUs, from /proc/stat), or null. */
export function machineBusySeconds() {
  try {
    const line = readFileSync('/proc/stat', 'latin1').split('\n')[0];
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] ?? 0)) / 100;
  } catch {
    return null;
  }
}

/**
 * CPU used by processes other than ours during a section: machine busy time minus this
 * process, the given server pids and their children. A busy neighbour on a 2-core box skews
 * every number, so the bench reports this next to them.
 */
export function foreignCpu(pids) {
  const ours = () => {
    let t = process.cpuUsage();
    let sum = (t.user + t.system) / 1e6;
    for (const pid of pids()) sum += cpuSeconds(pid) ?? 0;
    return sum;
  };
  const m0 = machineBusySeconds();
  const o0 = ours();
  const w0 = performance.now();
  return () => {
    const m1 = machineBusySeconds();
    const o1 = ours();
    const wall = (performance.now() - w0) / 1000;
    if (m0 === null || m1 === null || wall <= 0) return null;
    return Math.max(0, (m1 - m0 - (o1 - o0)) / wall);
  };
}
