import { StringDecoder } from 'node:string_decoder';

/** How often a `\r`-ended line (a progress bar's update) is kept, at most: one a second. */
export const PROGRESS_EVERY_MS = 1000;

export interface ProgressOptions {
  /** At most one `\r`-ended line per this many ms (the latest is held back meanwhile). @defaultValue 1000 */
  everyMs?: number;
  /** Monotonic milliseconds (tests move it by hand). @defaultValue performance.now */
  now?: () => number;
}

/**
 * Splits a byte stream into lines (the last partial line kept until more arrives or the end).
 * Bytes are decoded with a StringDecoder, so a character split across two chunks of a pipe
 * stays whole. A line longer than `maxLine` characters is delivered as consecutive records of at
 * most `maxLine` (never inside a surrogate pair), none of it dropped.
 *
 * A line ends at `\n` (`\r\n`, or `\r\r\n`, is one line end) and also at a lone `\r`, which a
 * progress bar (tqdm, pip, curl, a model download) writes before each redraw: without it such a
 * bar showed nothing until its `\n`, minutes later, and then as records of 16,384 characters of
 * bars run together. Those `\r`-ended lines are thinned out: at most one every `everyMs` (the
 * first at once, then the latest of each interval once it is over), the one held back when a
 * `\n`-ended line comes always before that line, and a blank one (a bar's clearing) dropped.
 * One splitter per stream of a worker, so this is per worker and stream.
 */
export function lineSplitter(onLine: (line: string) => void, maxLine = 16_384, progress: ProgressOptions = {}): { push(chunk: Buffer): void; end(): void } {
  const everyMs = progress.everyMs ?? PROGRESS_EVERY_MS;
  const now = progress.now ?? (() => performance.now());
  const decoder = new StringDecoder('utf8');
  let rest = '';
  /** Whether `rest` began right after a `\r`: a redraw that its next `\r` (or `\n`) will end. */
  let afterCr = false;
  /** The latest `\r` line held back (`heldInRest`: the redraw still in `rest`), and when the last one was delivered. */
  let held: string | undefined;
  let heldInRest = false;
  /** The redraw still in `rest` already delivered: not delivered again when its line end comes. */
  let shown: string | undefined;
  let lastProgressAt = Number.NEGATIVE_INFINITY;
  let timer: NodeJS.Timeout | undefined;
  let ended = false;
  /** Where to cut `s` at most `maxLine` in, not between the halves of a surrogate pair. */
  const cutAt = (s: string): number => {
    const c = s.charCodeAt(maxLine - 1);
    return c >= 0xd800 && c <= 0xdbff ? maxLine - 1 : maxLine;
  };
  const emit = (line: string): void => {
    while (line.length > maxLine) {
      const n = cutAt(line);
      onLine(line.slice(0, n));
      line = line.slice(n);
    }
    onLine(line);
  };
  const deliver = (line: string, inRest: boolean): void => {
    clearTimeout(timer);
    timer = undefined;
    held = undefined;
    lastProgressAt = now();
    shown = inRest ? line : undefined;
    emit(line);
  };
  const flushHeld = (): void => {
    clearTimeout(timer);
    timer = undefined;
    if (held !== undefined) deliver(held, heldInRest);
  };
  const progressLine = (line: string, inRest: boolean): void => {
    if (line.trim() === '') return;
    if (now() - lastProgressAt >= everyMs) return deliver(line, inRest);
    held = line;
    heldInRest = inRest;
    if (timer === undefined && !ended) {
      timer = setTimeout(flushHeld, Math.max(0, lastProgressAt + everyMs - now()));
      timer.unref();
    }
  };
  /** A line ended by `\n` (`byCr` false) or a lone `\r`. */
  const ends = (line: string, byCr: boolean): void => {
    const already = line === shown;
    shown = undefined;
    if (byCr) {
      if (!already) progressLine(line, false);
      return;
    }
    if (held === line) held = undefined;
    flushHeld();
    if (!already) emit(line);
  };
  const take = (text: string): void => {
    rest += text;
    // Each line end found once, from where the last one was (not rest re-sliced and re-scanned
    // per line: a 64 KiB chunk of short lines would cost its length times its lines).
    const found = /[\r\n]/g;
    let from = 0;
    let m: RegExpExecArray | null;
    while ((m = found.exec(rest)) !== null) {
      const i = m.index;
      if (rest.charCodeAt(i) === 10) {
        ends(rest.slice(from, i), false);
        from = i + 1;
        afterCr = false;
        continue;
      }
      // A run of \r: a line end of its own, unless a \n follows it (CRLF), which the next chunk may bring.
      let j = i;
      while (rest.charCodeAt(j) === 13) j++;
      if (j === rest.length) break;
      const crlf = rest.charCodeAt(j) === 10;
      ends(rest.slice(from, i), !crlf);
      from = crlf ? j + 1 : j;
      afterCr = !crlf;
      found.lastIndex = from;
    }
    rest = rest.slice(from);
    while (rest.length > maxLine) {
      const c = cutAt(rest);
      onLine(rest.slice(0, c));
      rest = rest.slice(c);
      afterCr = false;
      shown = undefined;
    }
    // The redraw under way (tqdm writes `\r` + bar, so a bar's latest state has no line end
    // after it until the next redraw): shown as the latest, or it would lag one redraw behind,
    // for good when a download stalls or the bar is the last output for a while.
    const redraw = rest.replace(/\r+$/, '');
    if (afterCr && redraw !== shown) progressLine(redraw, true);
  };
  return {
    push(chunk) {
      take(decoder.write(chunk));
    },
    end() {
      take(decoder.end());
      ended = true;
      const tail = rest.replace(/\r+$/, '');
      rest = '';
      if (tail === '' || tail === shown || (afterCr && tail.trim() === '')) return flushHeld();
      if (held === tail) held = undefined;
      flushHeld();
      emit(tail);
    },
  };
}
