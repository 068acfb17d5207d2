/**
 * Command encoding (spec, "Command encoding"). `args` is one raw string: a shell-style string
 * is the CMD split into arguments; a JSON object string `{"entrypoint": [...], "cmd": [...]}`
 * sets either or both; a JSON array (Docker's exec form) is refused. `entrypoint` overrides the image's ENTRYPOINT; `cmd` is the argument
 * list passed to it.
 */
export interface Command {
  /** null: not set (the image's own ENTRYPOINT applies). */
  entrypoint: string[] | null;
  /** null: not set (the image's own CMD applies). */
  cmd: string[] | null;
}

/** `field` names the body field at fault, for the JSON pointer of the error. */
export class CommandError extends Error {
  readonly field: 'args' | 'cmd' | 'entrypoint';
  constructor(message: string, field: 'args' | 'cmd' | 'entrypoint' = 'args') {
    super(message);
    this.name = 'CommandError';
    this.field = field;
  }
}

/** Splits a shell-style string into arguments: quotes and backslash escapes, no expansion. */
export function shellSplit(input: string): string[] {
  const out: string[] = [];
  let cur = '';
  let inWord = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < input.length; i++) {
    const ch = input[i] as string;
    if (quote === "'") {
      if (ch === "'") quote = null;
      else cur += ch;
      continue;
    }
    if (quote === '"') {
      if (ch === '"') quote = null;
      else if (ch === '\\' && i + 1 < input.length && '"\\$`\n'.includes(input[i + 1] as string)) cur += input[++i];
      else cur += ch;
      continue;
    }
    if (ch === "'" || ch === '"') {
      quote = ch;
      inWord = true;
    } else if (ch === '\\') {
      if (i + 1 >= input.length) throw new CommandError('args ends with a lone backslash');
      cur += input[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) out.push(cur);
      cur = '';
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (quote) throw new CommandError(`args has an unterminated ${quote === '"' ? 'double' : 'single'} quote`);
  if (inWord) out.push(cur);
  return out;
}

const isStringArray = (v: unknown): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string');

/** Deconstructs a stored `args` string. Throws CommandError with a readable reason. */
export function parseArgs(args: string): Command {
  const trimmed = args.trim();
  if (trimmed === '') return { entrypoint: null, cmd: null };
  if (trimmed.startsWith('{')) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(trimmed);
    } catch {
      throw new CommandError('args starts with "{" but is not valid JSON; use {"entrypoint": [...], "cmd": [...]} or a plain command string');
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new CommandError('args JSON must be an object');
    const obj = parsed as Record<string, unknown>;
    const extra = Object.keys(obj).filter((k) => k !== 'entrypoint' && k !== 'cmd');
    if (extra.length) throw new CommandError(`args JSON may only have "entrypoint" and "cmd", not ${extra.map((k) => JSON.stringify(k)).join(', ')}`);
    if (obj['entrypoint'] !== undefined && !isStringArray(obj['entrypoint'])) throw new CommandError('args JSON "entrypoint" must be an array of strings');
    if (obj['cmd'] !== undefined && !isStringArray(obj['cmd'])) throw new CommandError('args JSON "cmd" must be an array of strings');
    for (const k of ['entrypoint', 'cmd'] as const) {
      // No process argument can hold a NUL: every start of the worker would fail.
      if ((obj[k] as string[] | undefined)?.some((x) => x.includes('\0'))) throw new CommandError(`args JSON "${k}" must not contain a NUL character (\\u0000)`);
    }
    const entrypoint = (obj['entrypoint'] as string[] | undefined) ?? null;
    const cmd = (obj['cmd'] as string[] | undefined) ?? null;
    return { entrypoint: entrypoint && entrypoint.length ? entrypoint : null, cmd: cmd && cmd.length ? cmd : null };
  }
  if (trimmed.startsWith('[') && isJsonArray(trimmed)) {
    // Docker's exec form; split as shell words it would run a program named `[echo,hi]`.
    throw new CommandError('args is a JSON array (Docker\'s exec form), which args does not take; use {"entrypoint": [...], "cmd": [...]} (["a", "b"] is {"cmd": ["a", "b"]}), the array itself as cmd, or a plain command string');
  }
  const cmd = shellSplit(trimmed);
  return { entrypoint: null, cmd: cmd.length ? cmd : null };
}

/** Whether `text` is a JSON array; a shell string such as `[ -f /x ] && …` is not. */
function isJsonArray(text: string): boolean {
  try {
    return Array.isArray(JSON.parse(text));
  } catch {
    return false;
  }
}

/** The stored `args` for a command given as arrays: the JSON-object form, or "" for none. */
export function encodeArgs(command: Command): string {
  const obj: Record<string, string[]> = {};
  if (command.entrypoint?.length) obj['entrypoint'] = command.entrypoint;
  if (command.cmd?.length) obj['cmd'] = command.cmd;
  return Object.keys(obj).length ? JSON.stringify(obj) : '';
}

const same = (a: string[] | null, b: string[] | null): boolean => {
  const x = a ?? [];
  const y = b ?? [];
  return x.length === y.length && x.every((v, i) => v === y[i]);
};

export interface CommandInput {
  args?: string | undefined;
  cmd?: string[] | undefined;
  entrypoint?: string[] | undefined;
}

export interface StoredCommand {
  args: string;
  entrypoint: string[];
  cmd: string[];
}

/**
 * Applies a create or update body to the current command. `args` wins as a whole; `cmd` and
 * `entrypoint` given beside it must describe the same command. Without `args`, a present
 * `cmd` or `entrypoint` replaces that half (`[]` clears it) and `args` is re-encoded.
 */
export function applyCommand(current: StoredCommand, input: CommandInput): StoredCommand {
  if (input.args !== undefined) {
    const parsed = parseArgs(input.args);
    if (input.entrypoint !== undefined && !same(input.entrypoint, parsed.entrypoint)) {
      throw new CommandError(`entrypoint ${JSON.stringify(input.entrypoint)} does not match the entrypoint in args (${JSON.stringify(parsed.entrypoint ?? [])})`, 'entrypoint');
    }
    if (input.cmd !== undefined && !same(input.cmd, parsed.cmd)) {
      throw new CommandError(`cmd ${JSON.stringify(input.cmd)} does not match the command in args (${JSON.stringify(parsed.cmd ?? [])})`, 'cmd');
    }
    return { args: input.args.trim() === '' ? '' : input.args, entrypoint: parsed.entrypoint ?? [], cmd: parsed.cmd ?? [] };
  }
  if (input.cmd === undefined && input.entrypoint === undefined) return current;
  const entrypoint = input.entrypoint ?? current.entrypoint;
  const cmd = input.cmd ?? current.cmd;
  return { args: encodeArgs({ entrypoint, cmd }), entrypoint: [...entrypoint], cmd: [...cmd] };
}

/**
 * runpod-python's local-test flags that keep a worker from ever taking a job from the queue
 * (worker-protocol.md §1.1): `--test_input` runs that one input and exits 0, so the worker is
 * restarted in a loop; `--rp_serve_api` serves a local HTTP test API instead. Its other flags
 * (`--rp_log_level`, `--rp_debugger`, `--rp_api_*`) are harmless. argparse also takes a unique
 * prefix (`--rp_serve`, `--test_in`) and `--flag=value`.
 */
const LOCAL_TEST_FLAGS = ['--test_input', '--rp_serve_api'] as const;
/** Every long option of runpod-python's parser: a prefix counts only when it names one of them. */
const RUNPOD_OPTIONS = ['--rp_log_level', '--rp_debugger', '--rp_serve_api', '--rp_api_port', '--rp_api_concurrency', '--rp_api_host', '--test_input'];

/** The local-test flag `word` is (exactly, as `--flag=value` or as a unique prefix), if any. */
function localTestFlagOf(word: string): string | undefined {
  const name = word.split('=', 1)[0] as string;
  if (!name.startsWith('--test_') && !name.startsWith('--rp_serve')) return undefined;
  const matches = RUNPOD_OPTIONS.filter((o) => o.startsWith(name));
  const flag = matches.includes(name) ? name : matches.length === 1 ? matches[0] : undefined;
  return (LOCAL_TEST_FLAGS as readonly string[]).includes(flag ?? '') ? flag : undefined;
}

/**
 * The first local-test flag in `words` and the index of the word holding it. A word with white
 * space in it (a `bash -c` script) is searched for the flags spelt out in full.
 */
export function findLocalTestFlag(words: readonly string[]): { index: number; flag: string } | undefined {
  for (const [index, word] of words.entries()) {
    const flag = /\s/.test(word)
      ? word.split(/[\s'";&|()]+/).map((w) => w.split('=', 1)[0] as string).find((w) => (LOCAL_TEST_FLAGS as readonly string[]).includes(w))
      : localTestFlagOf(word);
    if (flag) return { index, flag };
  }
  return undefined;
}

/** Why `flag` is refused in a queue worker's command, and what to do instead. */
export function localTestFlagMessage(flag: string): string {
  const why = flag === '--test_input'
    ? 'runpod-python runs that one test input and exits, so the worker is restarted over and over and never takes a queued job'
    : 'runpod-python then serves its local HTTP test API and never takes a job from the queue';
  return `${flag} is runpod-python's local-test flag: ${why}; drop it (the worker takes its jobs from flashd), and use ${flag} only when testing the handler locally`;
}
