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

/** lineSplitter with a clock tests move by hand (its timer for a held `\r` line is real). */
const progressSplit = (everyMs: number) => {
  const lines: string[] = [];
  const clock = { ms: 0 };
  const s = lineSplitter((l) => lines.push(l), 16_384, { everyMs, now: () => clock.ms });
  return { lines, clock, push: (text: string) => s.push(Buffer.from(text)), end: () => s.end() };
};

t.test('a \\r ends a line too (progress bars: tqdm, pip, curl), at most one such line a second, the last before a \\n always kept', (t) => {
  const all = progressSplit(0);
  all.push('Downloading model\n\r 10%|#  |\r 20%|## |\r\r 30%|###|\nloaded\r\n');
  all.end();
  t.same(all.lines, ['Downloading model', ' 10%|#  |', ' 20%|## |', ' 30%|###|', 'loaded'], 'each \\r ends one; CRLF and \\r\\r\\n are one line end; blank \\r segments dropped');

  const s = progressSplit(1000);
  s.push('\r 1%\r 2%\r 3%\r 4%');
  t.same(s.lines, [' 1%'], 'the first at once, shown before any \\n; the next within the second held back');
  s.clock.ms = 400;
  s.push('\r 5%');
  t.same(s.lines, [' 1%'], 'still within the second');
  s.push('\r 6%\ndone\n');
  t.same(s.lines, [' 1%', ' 5%', ' 6%', 'done'], 'the latest held one comes before the \\n line, which is kept whole');
  s.end();

  // Ten minutes of a progress bar, a \r line every 250 ms, no \n: no 16,384-character records of
  // bars run together, about one line a second.
  const long = progressSplit(1000);
  for (let i = 0; i < 2400; i++) {
    long.clock.ms = i * 250;
    long.push(`\rmodel.safetensors: ${String(i).padStart(4)}/2400 MB`);
  }
  long.push('\n');
  long.end();
  t.ok(long.lines.every((l) => /^model\.safetensors: +\d+\/2400 MB$/.test(l)), 'every line one whole bar');
  t.ok(long.lines.length >= 590 && long.lines.length <= 610, `about one a second: ${long.lines.length}`);
  t.equal(long.lines.at(-1), 'model.safetensors: 2399/2400 MB', 'the last one kept');
  t.end();
});

t.test('a held \\r line comes by itself once its second is over', async (t) => {
  const lines: string[] = [];
  const s = lineSplitter((l) => lines.push(l), 16_384, { everyMs: 100 });
  s.push(Buffer.from('\rA\rB\rC\r'));
  t.same(lines, ['A'], 'B and C held back');
  await new Promise((r) => setTimeout(r, 300));
  t.same(lines, ['A', 'C'], 'the latest, C, once 100 ms have passed, with no more output');
  s.push(Buffer.from('\rD'));
  await new Promise((r) => setTimeout(r, 300));
  t.same(lines, ['A', 'C', 'D'], 'a redraw with no line end after it yet (tqdm writes \\r + bar) shows too, not a redraw behind');
  s.push(Buffer.from('\n'));
  s.end();
  t.same(lines, ['A', 'C', 'D'], 'and is not repeated when its \\n comes');
});
