import { StringDecoder } from 'node:string_decoder';

/**
 * Splits a byte stream into lines (the last partial line kept until more arrives or the end).
 * Bytes are decoded with a StringDecoder, so a character split across two chunks of a pipe
 * stays whole. A line longer than `maxLine` characters is delivered as consecutive records of at
 * most `maxLine` (never inside a surrogate pair), none of it dropped.
 */
export function lineSplitter(onLine: (line: string) => void, maxLine = 16_384): { push(chunk: Buffer): void; end(): void } {
  const decoder = new StringDecoder('utf8');
  let rest = '';
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
  const take = (text: string): void => {
    rest += text;
    let i: number;
    while ((i = rest.indexOf('\n')) >= 0) {
      emit(rest.slice(0, i).replace(/\r$/, ''));
      rest = rest.slice(i + 1);
    }
    while (rest.length > maxLine) {
      const n = cutAt(rest);
      onLine(rest.slice(0, n));
      rest = rest.slice(n);
    }
  };
  return {
    push(chunk) {
      take(decoder.write(chunk));
    },
    end() {
      take(decoder.end());
      if (rest) onLine(rest);
      rest = '';
    },
  };
}
