import { createAgent, type Agent } from '../app.js';
import type { FlashdConfig } from '../config/index.js';

/** Runs until SIGINT/SIGTERM, then closes every component in reverse order. */
export async function serve(config: FlashdConfig): Promise<number> {
  let agent: Agent;
  try {
    agent = await createAgent({ config });
  } catch (err) {
    process.stderr.write(`flashd: cannot start: ${(err as Error).message}\n`);
    return 1;
  }
  return new Promise((resolve) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      agent.log.info('shutting down', { signal });
      agent.close().then(() => resolve(0), (err: unknown) => {
        agent.log.error('shutdown failed', { err });
        resolve(1);
      });
    };
    process.once('SIGINT', () => stop('SIGINT'));
    process.once('SIGTERM', () => stop('SIGTERM'));
  });
}
