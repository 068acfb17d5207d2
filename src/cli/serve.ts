import { createAgent, type Agent } from '../app.js';
import type { FlashdConfig } from '../config/index.js';

/** How long a second signal waits for the engine to remove flashd's containers before exiting. */
const KILL_NOW_BOUND_MS = 5000;

/**
 * Runs until SIGINT/SIGTERM, then closes every component in reverse order. A second signal
 * during that (Ctrl-C pressed again) stops at once: process workers are killed, containers
 * force-removed (waiting for the engine at most 5 s), and the exit code is 1. A signal while
 * flashd is still starting stops it as soon as it has started.
 */
export async function serve(config: FlashdConfig): Promise<number> {
  // Listened for before the start, which takes a while (migrations, recovery, hardware): a
  // signal then would otherwise take Node's default action, exit 143 with nothing closed. It
  // stops flashd once it has started; a second one during the start exits 1 at once.
  let early: string | undefined;
  const onEarly = (signal: string) => {
    if (early !== undefined) process.exit(1);
    early = signal;
  };
  const onEarlyInt = () => onEarly('SIGINT');
  const onEarlyTerm = () => onEarly('SIGTERM');
  process.on('SIGINT', onEarlyInt);
  process.on('SIGTERM', onEarlyTerm);
  let agent: Agent;
  try {
    agent = await createAgent({ config });
  } catch (err) {
    process.stderr.write(`flashd: cannot start: ${(err as Error).message}\n`);
    return 1;
  } finally {
    process.off('SIGINT', onEarlyInt);
    process.off('SIGTERM', onEarlyTerm);
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
    process.on('SIGINT', () => stop('SIGINT'));
    process.on('SIGTERM', () => stop('SIGTERM'));
    if (early !== undefined) stop(early);
  });
}
