import type { Agent } from '../app.js';
import type { FlashdConfig } from '../config/index.js';
import { resolve } from 'node:path';
import { storageFailureCode } from '../core/errors.js';
import { createLogger } from '../core/logger.js';
import { listenForSignals, onStopSignal } from './signals.js';

/** How long a second signal waits for the engine to remove flashd's containers before exiting. */
const KILL_NOW_BOUND_MS = 5000;

/**
 * Runs until SIGINT, SIGTERM or SIGHUP, then closes every component in reverse order. A second signal
 * during that (Ctrl-C pressed again) stops at once: process workers are killed, containers
 * force-removed (waiting for the engine at most 5 s), and the exit code is 1. A signal while
 * flashd is still starting stops it as soon as it has started.
 */
export async function serve(config: FlashdConfig): Promise<number> {
  // The signal listeners are flashd's whole life (cli/signals.ts): one that comes while flashd is
  // still starting is held, and handed to `stop` below once it has started.
  listenForSignals();
  let agent: Agent;
  try {
    // Loaded here, not at the top: app.ts loads the native addons (uWS at module init), which the
    // single binary first unpacks; a failure there is one `cannot start` line, not a stack trace.
    const { createAgent } = await import('../app.js');
    agent = await createAgent({ config });
  } catch (err) {
    cannotStart(config, err);
    return 1;
  }
  return new Promise((resolve) => {
    let stopping = false;
    let began = 0;
    let over = false;
    // The last line before the exit: the data directory is free for the next start once it is
    // logged (a second signal's exit frees it as the process ends, right after). Once: a second
    // signal's exit comes before the first one's close ends.
    const stopped = (exitCode: number) => {
      if (over) return;
      over = true;
      agent.log.info('stopped', { ms: Date.now() - began, exitCode });
      resolve(exitCode);
    };
    const stop = (signal: string) => {
      if (stopping) {
        // Not `once`: after it the default action would kill flashd and leave its workers running.
        agent.log.warn('second signal: stopping now, without waiting for workers or requests; the next start reclaims their jobs', { signal });
        // Containers are removed through the engine: a moment, bounded, so a hung engine cannot hold the exit.
        const bound = new Promise<void>((r) => setTimeout(r, KILL_NOW_BOUND_MS).unref());
        void Promise.race([agent.killWorkersNow().catch(() => undefined), bound]).then(() => stopped(1));
        return;
      }
      stopping = true;
      began = Date.now();
      agent.log.info('shutting down', { signal });
      agent.close().then(() => stopped(0), (err: unknown) => {
        agent.log.error('shutdown failed', { err });
        stopped(1);
      });
    };
    onStopSignal(stop, (signal) => {
      agent.log.info('signal ignored', { signal, why: 'flashd reloads nothing, reopens no logs and opens no debugger on a signal; SIGTERM stops it' });
    });
  });
}

/**
 * The last line of a start that failed, in the chosen log format: `flashd: cannot start: …`, or
 * with --log-format json one JSON line (level error, `err.message` as other lines have it) that a
 * log shipper parses like the lines before it. Whatever --log-level says: it is why flashd exits 1.
 * A write the disk refused (SQLite's bare "database or disk is full", ENOSPC) names the data
 * directory, as the lines of a running flashd do.
 */
function cannotStart(config: FlashdConfig, err: unknown): void {
  const { code } = err as NodeJS.ErrnoException;
  let { message } = err as Error;
  const storage = storageFailureCode(err) ?? (code === 'ENOSPC' ? code : undefined);
  const dataDir = resolve(config.dataDir);
  if (storage !== undefined && !message.includes(dataDir)) {
    message = `${message}${message.includes(storage) ? '' : ` (${storage})`}, writing the data directory ${dataDir}`
      + (storage === 'SQLITE_FULL' || storage === 'ENOSPC' ? ': free space on the disk holding it, or choose another --data-dir' : '');
  }
  // No stack: as the text line, the message says what to change.
  if (config.logFormat === 'json') createLogger({ format: 'json' }).error('cannot start', { err: { message, ...(code === undefined ? {} : { code }) } });
  else process.stderr.write(`flashd: cannot start: ${message}\n`);
}
