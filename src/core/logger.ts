/**
 * A small structured logger: fixed lower-case messages, data in fields, one child per component.
 * `text` prints one readable line per event; `json` prints one JSON object per line for shippers.
 * Secrets never reach it: callers pass ids and counts, never keys, passwords or env values.
 */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';
export type LogFormat = 'text' | 'json';

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export interface LogSink {
  write(line: string): void;
}

export interface Logger {
  /**
   * True when debug lines are written. Read once by a caller on a hot path, which then builds a
   * debug line's fields only when it is: a disabled debug line costs one boolean check.
   */
  readonly debugEnabled: boolean;
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(bindings: Record<string, unknown>): Logger;
}

export interface LoggerOptions {
  level?: LogLevel;
  format?: LogFormat;
  sink?: LogSink;
}

/** stdout and stderr once a write to them failed (EPIPE: whoever read them went away). */
const failed = new WeakSet<NodeJS.WriteStream>();

/**
 * Losing the reader of flashd's stdout or stderr (a closed pipe: `2> >(head)`, a `| tee` that
 * was killed, a log shipper that restarts) must not end the server: Node reports the EPIPE as an
 * 'error' event, which without a listener is an uncaught exception that exits 1 (with nothing
 * closed: no checkpoint, process workers left running). With this the failure is noted, the
 * logger stops writing there, and flashd goes on serving. Idempotent.
 */
export function survivePipeLoss(): void {
  for (const stream of [process.stdout, process.stderr]) {
    if (stream.listeners('error').includes(noteFailed)) continue;
    stream.on('error', noteFailed);
  }
}

function noteFailed(this: NodeJS.WriteStream): void {
  failed.add(this);
}

/** The default sink: stderr, until a write to it failed. */
const stderrSink: LogSink = {
  write(line) {
    if (!failed.has(process.stderr)) process.stderr.write(line);
  },
};

function formatValue(value: unknown): string {
  if (value instanceof Error) return JSON.stringify(value.message);
  if (typeof value === 'string') return /[\s="]/.test(value) || value === '' ? JSON.stringify(value) : value;
  return JSON.stringify(value) ?? 'undefined';
}

export function createLogger(options: LoggerOptions = {}, bindings: Record<string, unknown> = {}): Logger {
  const threshold = RANK[options.level ?? 'info'];
  const format = options.format ?? 'text';
  if (options.sink === undefined) survivePipeLoss();
  const sink = options.sink ?? stderrSink;

  const emit = (level: Exclude<LogLevel, 'silent'>, msg: string, fields?: Record<string, unknown>): void => {
    if (RANK[level] < threshold) return;
    const all: Record<string, unknown> = { ...bindings, ...fields };
    for (const [k, v] of Object.entries(all)) {
      if (v instanceof Error) all[k] = { message: v.message, code: (v as { code?: unknown }).code, stack: v.stack };
    }
    const time = new Date().toISOString();
    if (format === 'json') {
      sink.write(JSON.stringify({ time, level, msg, ...all }) + '\n');
      return;
    }
    const { component, ...rest } = all;
    const pairs = Object.entries(rest)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${k}=${formatValue(v)}`)
      .join(' ');
    const comp = component === undefined ? '' : `[${String(component)}] `;
    sink.write(`${time} ${level.padEnd(5)} ${comp}${msg}${pairs ? ' ' + pairs : ''}\n`);
  };

  return {
    debugEnabled: RANK.debug >= threshold,
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
    child: (more) => createLogger(options, { ...bindings, ...more }),
  };
}
