#!/usr/bin/env node
/**
 * Entry point: adds the signal listeners, then loads the CLI and hands argv to it. The CLI is
 * imported dynamically, after the listeners are in: loading flashd takes a while (under a
 * second, longer on a busy host), and a SIGTERM in that time would otherwise take Node's
 * default action and end flashd with nothing closed (cli/signals.ts). app.ts, and with it the
 * native addons, is loaded only by `serve` (cli/serve.ts): `--help`, `--version` and
 * `worker-env` need neither, and run where the addons cannot be unpacked.
 */
import pkg from '../package.json' with { type: 'json' };
import { listenForSignals } from './cli/signals.js';

listenForSignals();
import('./cli/index.js')
  .then(({ main }) => main(process.argv.slice(2), process.env, pkg.version))
  .then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`flashd: ${(err as Error).stack ?? String(err)}\n`);
      process.exit(1);
    },
  );
