/**
 * Runs flashd as a separate process, the way a user does (`node dist/flashd.mjs` or the
 * single binary `dist/flashd`), and reads the bound address from its `flashd listening
 * url=...` log line on stderr. Used by the CLI and e2e tests; in-process tests use agent.ts.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';

export const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** A TCP port free on 127.0.0.1 now, for a server the test starts itself (nginx, on-gpu.py's flashd). */
export const freePort = (): Promise<number> => new Promise<number>((resolve, reject) => {
  const s = createServer().listen(0, '127.0.0.1', () => {
    const { port } = s.address() as { port: number };
    s.close(() => resolve(port));
  }).on('error', reject);
});

/** The parent's environment without tap's loader options and without any FLASHD_* setting. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k.startsWith('FLASHD_')) continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

export interface RunResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion (for --help, --version and bad usage). */
export function run(command: string, args: readonly string[], env: NodeJS.ProcessEnv = cleanEnv()): RunResult {
  const r = spawnSync(command, args, { cwd: REPO_ROOT, env, encoding: 'utf8', timeout: 60_000 });
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

export interface RunningFlashd {
  child: ChildProcess;
  /** http://host:port from the listening line. */
  url: string;
  stdout(): string;
  /**
   * stdout once it holds `text` (or as it is after `timeoutMs`): stdout and stderr are two pipes, read in whichever order they are
   * ready, so a line printed before the listening line (the admin key banner) may arrive after it.
   */
  stdoutHolding(text: string | RegExp, timeoutMs?: number): Promise<string>;
  stderr(): string;
  /** Sends `signal` and resolves with the exit code (null when killed by a signal). */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/** Starts flashd and waits for its listening line; kills it on teardown if still running. */
export function startFlashd(t: Test, command: string, args: readonly string[], env: NodeJS.ProcessEnv, timeoutMs = 30_000): Promise<RunningFlashd> {
  const child = spawn(command, args, { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (out += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (err += c));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`flashd did not report listening within ${timeoutMs} ms; stderr:\n${err}`)), timeoutMs);
    const onData = (): void => {
      // Text format: `flashd listening url=http://…`; json format: `"msg":"flashd listening","url":"http://…"`.
      const m = /flashd listening url=(\S+)/.exec(err) ?? /"msg":"flashd listening","url":"([^"]+)"/.exec(err);
      if (!m) return;
      clearTimeout(timer);
      child.stderr.off('data', onData);
      resolve({
        child,
        url: m[1] as string,
        stdout: () => out,
        stdoutHolding: async (text, ms = 10_000) => {
          const holds = (): boolean => (typeof text === 'string' ? out.includes(text) : text.test(out));
          const deadline = Date.now() + ms;
          while (!holds()) {
            if (Date.now() > deadline) return out; // the caller's assertion says what is missing
            await new Promise((r) => setTimeout(r, 20));
          }
          return out;
        },
        stderr: () => err,
        stop: (signal = 'SIGTERM') => {
          child.kill(signal);
          return exited;
        },
      });
    };
    child.stderr.on('data', onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`flashd exited with ${code} before listening; stderr:\n${err}`));
    });
  });
}
