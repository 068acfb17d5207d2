#!/usr/bin/env node
/**
 * Entry point: adds the signal listeners, then loads the rest of flashd and hands argv to the
 * CLI. The CLI and app.ts are imported dynamically, after the listeners are in: loading them
 * takes a while (under a second, longer on a busy host), and a SIGTERM in that time would
 * otherwise take Node's default action and end flashd with nothing closed (cli/signals.ts).
 */
import { listenForSignals } from './cli/signals.js';

listenForSignals();
Promise.all([import('./cli/index.js'), import('./app.js')])
  .then(([{ main }, { VERSION }]) => main(process.argv.slice(2), process.env, VERSION))
  .then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`flashd: ${(err as Error).stack ?? String(err)}\n`);
      process.exit(1);
    },
  );
