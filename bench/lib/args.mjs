import { readFileSync } from 'node:fs';

/**
 * The command-line arguments of a benchmark script that takes its settings from the environment
 * only (`npm run bench`, `npm run chaos`, …). `--help` (or `-h`) prints `usage` and exits 0
 * before anything starts; any other argument exits 2 naming it, rather than being ignored while
 * minutes of load start (`npm run bench -- --quick` is `BENCH_QUICK=1 npm run bench`).
 *
 * @param {string} name  the npm script, as the user types it (`bench`, `chaos`)
 * @param {string} usage the text --help prints
 * @param {string[]} [argv] the arguments, default process.argv.slice(2)
 */
export function handleArgs(name, usage, argv = process.argv.slice(2)) {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(usage.endsWith('\n') ? usage : `${usage}\n`);
    process.exit(0);
  }
  if (argv.length > 0) {
    process.stderr.write(
      `npm run ${name}: unexpected argument "${argv[0]}": it takes no arguments, its settings are environment variables ` +
        `(such as ${name === 'chaos' ? 'CHAOS_JOBS=500 npm run chaos' : 'BENCH_QUICK=1 npm run bench'}); see npm run ${name} -- --help\n`,
    );
    process.exit(2);
  }
}

/**
 * The first doc comment of a script, as plain text: the usage a script whose header documents
 * its environment variables prints for --help.
 *
 * @param {string | URL} file the script (import.meta.url)
 */
export function headerUsage(file) {
  const src = readFileSync(typeof file === 'string' && file.startsWith('file:') ? new URL(file) : file, 'utf8');
  const m = /\/\*\*([\s\S]*?)\*\//.exec(src);
  if (!m) return '';
  return m[1].split('\n').map((l) => l.replace(/^\s*\* ?/, '')).join('\n').trim() + '\n';
}
