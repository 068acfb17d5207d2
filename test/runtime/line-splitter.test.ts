/** lineSplitter: worker output (pipe chunks) into log lines, with nothing corrupted or dropped. */
import t from 'tap';
import { lineSplitter } from '../../src/runtime/line-splitter.js';

const split = (chunks: Buffer[], maxLine?: number) => {
  const lines: string[] = [];
  const s = lineSplitter((l) => lines.push(l), maxLine);
  for (const c of chunks) s.push(c);
  s.end();
  return lines;
};

t.test('a character split across two chunks stays whole', (t) => {
  const bytes = Buffer.from('xé€😀\nnext\n', 'utf8');
  for (let cut = 1; cut < bytes.length; cut++) {
    t.same(split([bytes.subarray(0, cut), bytes.subarray(cut)]), ['xé€😀', 'next'], `cut at byte ${cut}`);
  }
  t.end();
});

t.test('a line longer than maxLine is kept whole, as consecutive records', (t) => {
  const long = 'a'.repeat(70_000);
  const buf = Buffer.from(`${long}\r\nshort\n`);
  const chunks = [];
  for (let i = 0; i < buf.length; i += 65_536) chunks.push(buf.subarray(i, i + 65_536));
  const lines = split(chunks, 16_384);
  t.equal(lines.slice(0, -1).join(''), long, 'nothing of it dropped');
  t.ok(lines.slice(0, -1).every((l) => l.length <= 16_384), 'each record at most maxLine');
  t.equal(lines[lines.length - 1], 'short', 'CRLF handled, the next line follows');
  const emoji = split([Buffer.from(`${'b'.repeat(9)}😀😀\n`)], 10);
  t.ok(emoji.every((l) => (l as unknown as { isWellFormed(): boolean }).isWellFormed()), 'never cut inside a surrogate pair');
  t.equal(emoji.join(''), `${'b'.repeat(9)}😀😀`);
  t.same(split([Buffer.from('no newline at the end')]), ['no newline at the end']);
  t.same(split([Buffer.from('\n\n')]), ['', ''], 'empty lines stay');
  t.end();
});
