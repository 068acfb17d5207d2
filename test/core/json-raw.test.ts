/**
 * rawMember slices a member's source text out of a JSON object; the slice must parse to
 * exactly what JSON.parse gives for that member, whatever the formatting, escapes or nesting.
 */
import t from 'tap';
import fc from 'fast-check';
import { jsonDepth, jsonStringBytes, nonFiniteToNull, rawMember, rawMemberDepth } from '../../src/core/json-raw.js';

const SEED = process.env['FUZZ_SEED'] === undefined ? undefined : Number(process.env['FUZZ_SEED']);
const params = (numRuns: number) => ({ numRuns, ...(SEED === undefined ? {} : { seed: SEED }) });

/** Re-renders JSON text with random whitespace between tokens (strings untouched). */
function spaced(text: string, ws: string[]): string {
  let out = '';
  let k = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i] as string;
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j;
    } else {
      out += c;
      if ('{}[],:'.includes(c)) out += ws[k++ % ws.length] ?? '';
    }
  }
  return (ws[0] ?? '') + out;
}

t.test('the slice parses to the member JSON.parse returns', (t) => {
  fc.assert(
    fc.property(
      fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 4 }), { minKeys: 1, maxKeys: 6 }),
      fc.array(fc.constantFrom('', ' ', '\n', '\t ', '\r\n  '), { minLength: 1, maxLength: 5 }),
      (obj, ws) => {
        const text = spaced(JSON.stringify(obj), ws);
        const parsed = JSON.parse(text) as Record<string, unknown>;
        for (const key of Object.keys(parsed)) {
          const raw = rawMember(text, key);
          if (raw === undefined) return false;
          if (JSON.stringify(JSON.parse(raw)) !== JSON.stringify(parsed[key])) return false;
        }
        return rawMember(text, '\u0000not-a-key') === undefined;
      },
    ),
    params(500),
  );
  t.pass('500 generated objects');
  t.end();
});

t.test('edge cases', (t) => {
  t.equal(rawMember('{"input":{"a":"x\\"}y"},"b":1}', 'input'), '{"a":"x\\"}y"}', 'escaped quote and brace inside a string');
  t.equal(rawMember('{"input":"a\\\\","b":2}', 'b'), '2', 'string ending in an escaped backslash');
  t.equal(rawMember('{"a":1,"a":[2,{"c":"]"}]}', 'a'), '[2,{"c":"]"}]', 'the last of duplicate keys wins, like JSON.parse');
  t.equal(rawMember('{"\\u0069nput":true}', 'input'), 'true', 'escaped key');
  t.equal(rawMember('{}', 'input'), undefined);
  t.equal(rawMember('[1,2]', 'input'), undefined, 'not an object');
  t.equal(rawMember(' { "output" : -1.5e3 } ', 'output'), '-1.5e3');
  t.equal(rawMember('{"output":null}', 'output'), 'null');
  t.end();
});

t.test('nonFiniteToNull: the NaN and Infinity Python writes become null, strings untouched', (t) => {
  t.equal(nonFiniteToNull('{"a":1}'), undefined, 'nothing to replace');
  const fixed = nonFiniteToNull('{"a": NaN, "b": [Infinity, -Infinity, -1.5], "s": "NaN, Infinity \\" -Infinity", "n":NaN}');
  t.same(JSON.parse(fixed as string), { a: null, b: [null, null, -1.5], s: 'NaN, Infinity " -Infinity', n: null });
  t.equal(nonFiniteToNull('NaN'), 'null');
  t.end();
});

/** The depth of a parsed value: arrays and objects, its own level counting 1. */
const depthOf = (v: unknown): number =>
  v !== null && typeof v === 'object' ? 1 + Math.max(0, ...Object.values(v as object).map(depthOf)) : 0;

t.test('rawMemberDepth is the depth of the member rawMember returned, measured by the same scan', async (t) => {
  t.equal((rawMember('{"input":{"a":[[1]]},"z":[[[[[]]]]]}', 'input'), rawMemberDepth()), 3, 'its own, not a later member');
  t.equal((rawMember('{"input":[],"input":[[2]]}', 'input'), rawMemberDepth()), 2, 'the last of duplicates, as JSON.parse takes');
  t.equal((rawMember('{"input":"[[[{{{"}', 'input'), rawMemberDepth()), 0, 'a string with brackets');
  t.equal((rawMember('{"x":[[]]}', 'input'), rawMemberDepth()), 0, 'no member');
  t.equal(jsonDepth(' [{"a":"]]"},[[{}]]]'), 4);
  fc.assert(fc.property(fc.jsonValue({ maxDepth: 12 }), (v) => {
    const text = `{"input":${JSON.stringify(v)},"after":[[[[]]]]}`;
    rawMember(text, 'input');
    return rawMemberDepth() === depthOf(v) && jsonDepth(JSON.stringify(v)) === depthOf(v);
  }), params(300));
});

t.test('jsonStringBytes is the UTF-8 length of JSON.stringify(s) without its quotes, for any string', async (t) => {
  const exact = (s: string) => Buffer.byteLength(JSON.stringify(s)) - 2;
  for (const s of ['', 'plain ascii', '\u0000', '\n\t\r\b\f', '\u001f\u007f', '"\\', '\u00e9', '\u20ac\ufffd', '\u2028\u2029', '\ud83d\ude00', '\ud83d', '\ude00', 'a\ud83d', '\ude00\ud83d', '\ud83d\ud83d\ude00']) {
    // Named by character codes in hex: a raw U+2028/U+2029 in an assertion's name ends tap's line early.
    t.equal(jsonStringBytes(s), exact(s), `[${[...s].map((c) => c.charCodeAt(0).toString(16)).join(' ')}]`);
  }
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 64 }), (s) => jsonStringBytes(s) === exact(s)), params(2000));
  fc.assert(fc.property(fc.array(fc.integer({ min: 0, max: 0xffff }), { maxLength: 64 }), (codes) => {
    const s = String.fromCharCode(...codes);
    return jsonStringBytes(s) === exact(s);
  }), params(2000));
});
