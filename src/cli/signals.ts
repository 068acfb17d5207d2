/**
 * flashd's SIGINT, SIGTERM and SIGHUP listeners (and SIGUSR1's and SIGUSR2's, which ignore them: see below):
 * added by main.ts before the rest of flashd is loaded (which takes a while: the bundle's
 * modules, schemas, native addons) and never removed.
 *
 * - Before a command has claimed them, a signal is held; a second one exits 1 at once.
 * - `flashd serve` claims them (onStopSignal): a held signal is handed over at once, so one sent
 *   at any point of the start stops flashd once it has started.
 * - Other commands give them back (defaultSignals): a signal then ends the process as Node's
 *   default action would, and a held one does so at once.
 *
 * Never removed while serving: removing a signal's last listener closes libuv's handle for it,
 * and a signal it had caught but not yet delivered (the loop had not turned since) is dropped
 * with it. This module imports nothing, so main.ts can load it first.
 */
/**
 * SIGHUP stops flashd as SIGTERM does: it comes when the terminal or ssh session flashd runs in
 * closes, and flashd has no configuration to reload, so Node's default action (exit at once,
 * workers left running, no log line) is what it must not take.
 */
type StopSignal = 'SIGINT' | 'SIGTERM' | 'SIGHUP';

/**
 * SIGUSR1 is ignored, for flashd's whole life and every command: Node's default for it opens the
 * inspector (127.0.0.1:9229), through which anyone who can connect runs code as flashd's user
 * (root, often), and a logrotate recipe written for nginx sends it to reopen logs. A listener of
 * our own replaces Node's handler, so the inspector stays closed (test/cli/signals.test.ts).
 *
 * SIGUSR2 too: Node's default for it ends the process at once, with no stop and its workers left
 * running, and those who send it mean a reload or a log reopen (unicorn- and puma-style reloads,
 * nginx's binary upgrade), never a stop. flashd has nothing to reload, so it logs and ignores it;
 * SIGTERM (or SIGHUP) stops it.
 */
type IgnoredSignal = 'SIGUSR1' | 'SIGUSR2';
let onIgnored: ((signal: IgnoredSignal) => void) | undefined;
const onSigusr1 = () => onIgnored?.('SIGUSR1');
const onSigusr2 = () => onIgnored?.('SIGUSR2');

let installed = false;
let held: StopSignal | undefined;
let handler: ((signal: StopSignal) => void) | undefined;
let defaultAction = false;

const onSigint = () => onSignal('SIGINT');
const onSigterm = () => onSignal('SIGTERM');
const onSighup = () => onSignal('SIGHUP');

function onSignal(signal: StopSignal): void {
  if (handler !== undefined) return handler(signal);
  if (defaultAction) return raise(signal);
  if (held !== undefined) process.exit(1);
  held = signal;
}

/** Ends the process by `signal` as Node's default action would (status 128 + n to a shell). */
function raise(signal: StopSignal): void {
  process.off('SIGINT', onSigint);
  process.off('SIGTERM', onSigterm);
  process.off('SIGHUP', onSighup);
  process.kill(process.pid, signal);
}

/** Adds the listeners (once). main.ts calls it first; serve() again, for callers that skip main.ts. */
export function listenForSignals(): void {
  if (installed) return;
  installed = true;
  process.on('SIGINT', onSigint);
  process.on('SIGTERM', onSigterm);
  process.on('SIGHUP', onSighup);
  process.on('SIGUSR1', onSigusr1);
  process.on('SIGUSR2', onSigusr2);
}

/**
 * From now on each signal goes to `stop`; one held since the start is handed over at once.
 * `ignored` hears of an ignored signal (SIGUSR1, SIGUSR2), to log it.
 */
export function onStopSignal(stop: (signal: StopSignal) => void, ignored?: (signal: IgnoredSignal) => void): void {
  listenForSignals();
  handler = stop;
  onIgnored = ignored;
  if (held !== undefined) {
    const signal = held;
    held = undefined;
    stop(signal);
  }
}

/** For commands other than serve: signals take Node's default action again, a held one at once. */
export function defaultSignals(): void {
  if (!installed || handler !== undefined) return;
  defaultAction = true;
  if (held !== undefined) raise(held);
}
