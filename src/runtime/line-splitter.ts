/** Splits a byte stream into lines (last partial line kept until more arrives or the end). */
export function lineSplitter(onLine: (line: string) => void, maxLine = 16_384): { push(chunk: Buffer): void; end(): void } {
  let rest = '';
  return {
    push(chunk) {
      rest += chunk.toString('utf8');
      let i: number;
      while ((i = rest.indexOf('\n')) >= 0) {
        onLine(rest.slice(0, i).replace(/\r$/, '').slice(0, maxLine));
        rest = rest.slice(i + 1);
      }
      if (rest.length > maxLine) {
        onLine(rest.slice(0, maxLine));
        rest = '';
      }
    },
    end() {
      if (rest) onLine(rest);
      rest = '';
    },
  };
}
