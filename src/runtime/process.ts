/**
 * Process runtime (`--runtime process`): workers are host processes running the endpoint's
 * command with the endpoint env plus the worker env. For development and machines without a
 * container engine only: the code runs with flashd's own user and sees the host. Trusted code
 * only.
 *
 * Workers get their own process group, so a stop reaches their children too. Their pids are
 * recorded in `<data-dir>/process-workers.pids`, each with its start time, the boot it
 * started in and its worker id; after a crash of flashd the next start stops the ones still
 * running (after checking /proc that they are those very processes, not others that got their
 * pids since), and what is left of the process group of one whose main process died meanwhile,
 * so none leak, whichever runtime that start uses (`reapOrphanProcessWorkers`, called by createAgent).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type { Logger } from '../core/logger.js';
import { lineSplitter } from './line-splitter.js';
import { withPodHostname } from './pod-hostname.js';
import { bootId, startTicks } from './process-identity.js';
import type { LaunchResult, LaunchSpec, WorkerEvents, WorkerRuntime } from './types.js';

/** Host variables a worker inherits; nothing else of flashd's environment (it may hold secrets). */
const INHERITED_ENV = ['PATH', 'HOME', 'LANG', 'LC_ALL', 'TZ', 'TMPDIR', 'USER'];
const PID_FILE = 'process-workers.pids';
/** Linux's USER_HZ, the unit of /proc/<pid>/stat times: 100 on every architecture Node supports. */
const CLOCK_TICKS_PER_S = 100;

/** The processes of process group `pgid` (field 5 of /proc/<pid>/stat), zombies left out. */
function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return out;
  }
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (fields[0] !== 'Z' && Number(fields[2]) === pgid) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Whether process group `pgid` still has a process (a zombie not reaped yet counts). */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

function environOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'utf8');
  } catch {
    return '';
  }
}

/**
 * Whether the process now holding `pid` is the worker a line of the pid file recorded: the same
 * start time in the same boot. A line with a pid alone (written by a flashd that did not record
 * start times yet) matches a process that started before the file was last written, which a
 * process that took the pid since (after a reboot, or after the worker ended) did not.
 */
function isRecordedWorker(pid: number, fields: string[], fileWrittenMs: number, boot: string): boolean {
  const ticks = startTicks(pid);
  if (ticks === undefined) return false;
  if (fields.length >= 3) return fields[1] === ticks && fields[2] === boot;
  const btime = /^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1];
  if (btime === undefined) return false;
  // btime is whole seconds: a second of slack.
  return (Number(btime) + Number(ticks) / CLOCK_TICKS_PER_S) * 1000 <= fileWrittenMs + 1000;
}

/**
 * Stops process workers left behind by a previous run of flashd that did not shut down cleanly
 * (their process groups, after checking /proc that each is the process recorded, by start time
 * and boot, and a flashd worker), and empties the pid file. Called at every start, whatever
 * `--runtime` is now: an orphan would otherwise keep serving jobs with a stdout nobody reads.
 * A recorded pid that now belongs to another process (after a reboot, or reused once the
 * worker had ended) is left alone. A worker whose main process died while flashd was down (a
 * crash, the OOM killer, a write to the stdout nobody read any more) may have left processes it
 * started (a model server, a helper) in its process group: the group is stopped when one of
 * them has that worker's id in its environment, in the same boot (a line that records the
 * worker id). Linux does not hand out a pid that is still some group's id, so the group id
 * names that group until its last process ends. `killed` is the log line per process (a second
 * Ctrl-C kills this run's own workers, which are no orphans).
 */
export function reapOrphanProcessWorkers(dataDir: string, log: Logger, killed = 'stopped orphaned worker process'): void {
  const file = join(dataDir, PID_FILE);
  if (!existsSync(file)) return;
  const writtenMs = statSync(file).mtimeMs;
  const boot = bootId();
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const fields = line.trim().split(/\s+/);
    const pid = Number(fields[0]);
    if (!Number.isInteger(pid) || pid <= 1) continue;
    // The worker id, where the line records one (a pid alone is an older flashd's line).
    const workerId = fields[3]?.startsWith('wkr_') ? fields[3] : undefined;
    try {
      if (isRecordedWorker(pid, fields, writtenMs, boot) && environOf(pid).includes('VENDOR_POD_ID=wkr_')) {
        process.kill(-pid, 'SIGKILL');
        log.warn(killed, { pid, workerId });
        continue;
      }
      // Its main process is gone (or a zombie nobody reaped): what is left of its group, if any.
      const leaderGone = startTicks(pid) === undefined || fields[1] === startTicks(pid);
      if (leaderGone && workerId !== undefined && fields[2] === boot) {
        const left = groupMembers(pid);
        if (left.some((p) => environOf(p).split('\0').includes(`VENDOR_POD_ID=${workerId}`))) {
          process.kill(-pid, 'SIGKILL');
          log.warn(killed, { pid, workerId, leftInGroup: left.length });
        }
        continue;
      }
      if (startTicks(pid) !== undefined) log.info('a recorded worker pid now belongs to another process; left alone', { pid });
    } catch {
      // gone already, or not ours
    }
  }
  try {
    writeFileSync(file, '', { mode: 0o600 });
  } catch {
    // read-only data dir: the next start tries again
  }
}

interface Running {
  child: ChildProcess;
  /** Its start time (startTicks), read once it has spawned. */
  startTicks?: string;
  stopping: boolean;
  /** When a stop's grace runs out (performance.now()): the SIGKILL of its group. */
  killAt?: number;
  exited: Promise<void>;
}

export class ProcessRuntime implements WorkerRuntime {
  readonly name = 'process';
  readonly runsOnHost = true;
  readonly #pidFile: string;
  readonly #workdir: string;
  readonly #log: Logger;
  readonly #workers = new Map<string, Running>();

  constructor(options: { dataDir: string; workdir: string | null; log: Logger }) {
    this.#pidFile = join(options.dataDir, PID_FILE);
    this.#workdir = options.workdir ?? process.cwd();
    this.#log = options.log;
  }

  /** One line per worker: `pid startTicks bootId workerId` (see reapOrphanProcessWorkers). */
  #savePids(): void {
    const boot = bootId();
    const lines = [...this.#workers.entries()]
      .filter(([, w]) => w.child.pid !== undefined && w.startTicks !== undefined)
      .map(([id, w]) => `${w.child.pid} ${w.startTicks} ${boot} ${id}\n`);
    try {
      writeFileSync(this.#pidFile, lines.join(''), { mode: 0o600 });
    } catch (err) {
      this.#log.warn('cannot record worker pids', { file: this.#pidFile, reason: (err as Error).message });
    }
  }

  launch(spec: LaunchSpec, events: WorkerEvents): Promise<LaunchResult> {
    const argv = [...spec.entrypoint, ...spec.cmd];
    if (argv.length === 0) {
      return Promise.reject(new Error('the endpoint has no command: set args (or entrypoint/cmd) to run a process worker'));
    }
    const env: Record<string, string> = {};
    for (const k of INHERITED_ENV) if (process.env[k] !== undefined) env[k] = process.env[k] as string;
    // A host process runs on this host: its name, as a RunPod pod's container hostname is.
    Object.assign(env, withPodHostname(spec.env, hostname()));
    // A host process sees every GPU, and CUDA takes an unset list for all of them: always set,
    // after the endpoint env, so a GPU worker uses only its own and a CPU worker ("") none, not
    // one the ledger gave another worker. NVIDIA_VISIBLE_DEVICES as the container runtime sets it.
    env['CUDA_VISIBLE_DEVICES'] = spec.gpuDeviceIds.join(',');
    env['NVIDIA_VISIBLE_DEVICES'] = spec.gpuDeviceIds.length > 0 ? spec.gpuDeviceIds.join(',') : 'void';
    return new Promise((resolve, reject) => {
      const child = spawn(argv[0] as string, argv.slice(1), { cwd: this.#workdir, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
      let started = false;
      child.once('spawn', () => {
        started = true;
        const running = this.#workers.get(spec.workerId);
        // Read while the pid is surely its own: it cannot be reused before flashd reaps the child.
        if (running && child.pid !== undefined) running.startTicks = startTicks(child.pid);
        this.#savePids();
        resolve({ workerId: spec.workerId, reused: false });
      });
      const out = lineSplitter((l) => events.log('stdout', l));
      const err = lineSplitter((l) => events.log('stderr', l));
      child.stdout?.on('data', (c: Buffer) => out.push(c));
      child.stderr?.on('data', (c: Buffer) => err.push(c));
      const exited = new Promise<void>((done) => {
        // 'exit', not 'close': a descendant that inherited stdout/stderr (a helper the handler
        // started, possibly in its own session) keeps the pipes open after the worker is gone.
        child.once('exit', (code, signal) => {
          const pid = child.pid;
          let finished = false;
          let closed = false;
          let cut: NodeJS.Timeout | undefined;
          const finish = () => {
            if (finished) return;
            finished = true;
            clearTimeout(cut);
            out.end();
            err.end();
            const running = this.#workers.get(spec.workerId);
            this.#workers.delete(spec.workerId);
            this.#savePids();
            if (started) events.exit({ code, signal, requested: running?.stopping ?? false });
            done();
          };
          child.once('close', () => {
            closed = true;
            if (cut !== undefined) finish();
          });
          const settle = () => {
            try {
              if (pid !== undefined) process.kill(-pid, 'SIGKILL'); // what is left of its group goes with it
            } catch {
              // no group left
            }
            if (closed) return finish();
            // Give the pipes a moment to drain the worker's last lines, then stop reading them.
            cut = setTimeout(() => {
              child.stdout?.destroy();
              child.stderr?.destroy();
              finish();
            }, 1000);
          };
          // A stop sent SIGTERM to the whole group. A shell that ran the worker without `exec`
          // dies of it at once, while the worker under it, which got it too, finishes its jobs:
          // the rest of the group has what is left of the stop grace (then stop's SIGKILL).
          const running = this.#workers.get(spec.workerId);
          const killAt = running?.stopping ? running.killAt : undefined;
          if (killAt === undefined || pid === undefined) return settle();
          const wait = () => {
            if (!groupAlive(pid) || performance.now() >= killAt) return settle();
            setTimeout(wait, 50);
          };
          wait();
        });
      });
      child.once('error', (e) => {
        this.#workers.delete(spec.workerId);
        if (!started) reject(new Error(`cannot start ${JSON.stringify(argv[0])}: ${e.message}`));
      });
      this.#workers.set(spec.workerId, { child, stopping: false, exited });
    });
  }

  async stop(workerId: string, graceMs: number): Promise<void> {
    const w = this.#workers.get(workerId);
    if (!w) return;
    w.stopping = true;
    w.killAt = Math.min(w.killAt ?? Number.POSITIVE_INFINITY, performance.now() + graceMs);
    const pid = w.child.pid;
    const signal = (sig: NodeJS.Signals) => {
      try {
        if (pid !== undefined) process.kill(-pid, sig);
      } catch {
        // already gone
      }
    };
    signal('SIGTERM');
    const timer = setTimeout(() => signal('SIGKILL'), graceMs);
    await w.exited;
    clearTimeout(timer);
  }

  capacity(): number {
    return Number.POSITIVE_INFINITY;
  }

  async close(): Promise<void> {
    await Promise.all([...this.#workers.keys()].map((id) => this.stop(id, 2000)));
  }
}
