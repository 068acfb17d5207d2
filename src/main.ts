#!/usr/bin/env node
/** Entry point: hands argv to the CLI and nothing else. */
import { main } from './cli/index.js';
import { VERSION } from './app.js';

main(process.argv.slice(2), process.env, VERSION).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`flashd: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
