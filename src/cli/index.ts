/**
 * `flashd [serve] [flags]` runs the server; `flashd --help` describes every flag. Exit codes:
 * 0 clean shutdown, 1 runtime failure, 2 bad usage or configuration.
 */
import { closestName, configHelp, loadConfig, strayArguments } from '../config/index.js';
import { AgentError } from '../core/errors.js';
import { survivePipeLoss } from '../core/logger.js';
import { defaultSignals } from './signals.js';
import { workerEnvCommand } from './worker-env.js';

const USAGE = `flashd: self-hosted serverless GPU endpoints

Usage:
  flashd [serve] [flags]     run the server (management API, queue API, workers)
  flashd worker-env <id>     print the environment an external worker needs (see flashd worker-env --help)
  flashd --help              show this help (flashd help worker-env: that command's)
  flashd --version           print the version

Settings come from embedded defaults, then a JSON file (--config FILE), then FLASHD_* environment
variables, then flags; later ones win. On first start flashd creates an admin API key, prints it
once and saves it to <data-dir>/admin-api-key (mode 0600); set FLASHD_ADMIN_API_KEY to choose it.

Flags:
  --config <file>
      JSON file with any of the settings below, by the name on their "config file:" line
      (e.g. {"port": 9000, "sessionTtlSeconds": 3600}). The admin key is not read from it.
${configHelp()}

Exit codes: 0 clean shutdown, 1 runtime failure, 2 invalid usage or configuration.
`;

/** A usage error: one line on stderr, exit 2. */
function usage(message: string): number {
  process.stderr.write(`flashd: ${message} (see flashd --help)\n`);
  return 2;
}

export async function main(argv: readonly string[], env: NodeJS.ProcessEnv, version: string): Promise<number> {
  survivePipeLoss();
  const args = [...argv];
  if (args[0] === 'worker-env') {
    defaultSignals();
    return workerEnvCommand(args.slice(1), env);
  }
  const command = args[0] !== undefined && !args[0].startsWith('-') ? (args.shift() as string) : 'serve';
  if (command === 'help') {
    // `flashd help worker-env`: that command's help; `help serve` is this one.
    const topic = args[0] !== undefined && !args[0].startsWith('-') ? args.shift() : undefined;
    if (topic === 'worker-env' && strayArguments(args).length === 0) return workerEnvCommand(['--help'], env);
    const stray = topic === undefined || topic === 'serve' || topic === 'worker-env' ? strayArguments(args)[0] : topic;
    if (stray !== undefined) return usage(`unexpected argument ${JSON.stringify(stray)}: help takes a command (serve, worker-env) or nothing`);
    process.stdout.write(USAGE);
    return 0;
  }
  if (command !== 'serve') {
    // `flashd server`, `flashd worker_env`: the command meant, as an unknown flag gets its flag.
    const meant = closestName(command, ['serve', 'worker-env', 'help']);
    process.stderr.write(`flashd: unknown command "${command}" (${meant === undefined ? '' : `did you mean ${meant}? `}see flashd --help)\n`);
    return 2;
  }
  // --help and --version read no flags, but a bare word among them is a mistake, as it is
  // without them (`flashd --version extra` printed the version, exit 0).
  const asked = args.find((a) => a === '--help' || a === '-h') ?? args.find((a) => a === '--version' || a === '-v');
  if (asked !== undefined) {
    const stray = strayArguments(args.filter((a) => !['--help', '-h', '--version', '-v'].includes(a)))[0];
    if (stray !== undefined) return usage(`unexpected argument ${JSON.stringify(stray)}: ${asked} takes none`);
    process.stdout.write(asked === '--help' || asked === '-h' ? USAGE : `flashd ${version}\n`);
    return 0;
  }
  let config;
  try {
    config = loadConfig({ argv: args, env });
  } catch (err) {
    if (err instanceof AgentError) {
      process.stderr.write(`flashd: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  // Loaded only here: app.ts loads the native addons (cli/serve.ts).
  const { serve } = await import('./serve.js');
  return serve(config);
}
