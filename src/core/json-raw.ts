/**
 * Raw JSON slicing: the source text of one member of a JSON object, so a job's `input` and a
 * worker's `output` travel as the bytes the client sent instead of being parsed into objects
 * and serialised again (`JSON.stringify` of a 1 KB input costs more than the SQLite insert of
 * its row; perf-anchors §7.3 "keep job input/output as raw bytes end to end").
 *
 * The text must already have been accepted by `JSON.parse`: the scanner trusts its structure
 * and only finds boundaries. Like `JSON.parse`, it takes the last of duplicate keys.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;

function skipWs(text: string, i: number): number {
  for (;;) {
    const c = text.charCodeAt(i);
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return i;
    i++;
  }
}

/** `text[i]` is an opening quote: the index just past the closing one. */
function stringEnd(text: string, i: number): number {
  let from = i + 1;
  for (;;) {
    const q = text.indexOf('"', from);
    let backslashes = 0;
    for (let b = q - 1; text.charCodeAt(b) === BACKSLASH; b--) backslashes++;
    if (backslashes % 2 === 0) return q + 1;
    from = q + 1;
  }
}

/**
 * How deep the last value valueEnd scanned nests: arrays and objects, the value's own level
 * counting 1 (0 for a string, number, true, false or null). A module variable, not a returned
 * pair, so the scan stays allocation-free.
 */
let scannedDepth = 0;

/** `text[i]` starts a value: the index just past it (and its nesting depth in scannedDepth). */
function valueEnd(text: string, i: number): number {
  const c = text.charCodeAt(i);
  scannedDepth = 0;
  if (c === QUOTE) return stringEnd(text, i);
  if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
    // A plain character loop (strings are skipped with indexOf): one pass, no allocation.
    let depth = 0;
    let max = 0;
    for (let j = i; ; j++) {
      const ch = text.charCodeAt(j);
      if (ch === QUOTE) j = stringEnd(text, j) - 1;
      else if (ch === OPEN_OBJECT || ch === OPEN_ARRAY) {
        if (++depth > max) max = depth;
      } else if ((ch === CLOSE_OBJECT || ch === CLOSE_ARRAY) && --depth === 0) {
        scannedDepth = max;
        return j + 1;
      }
    }
  }
  // number, true, false, null
  let j = i + 1;
  for (;;) {
    const d = text.charCodeAt(j);
    if (Number.isNaN(d) || d === COMMA || d === CLOSE_OBJECT || d === CLOSE_ARRAY || d === 0x20 || d === 0x0a || d === 0x0d || d === 0x09) return j;
    j++;
  }
}

/**
 * The source text of the top-level member `key` of the object in `text`, or undefined when
 * `text` is not an object or has no such member.
 */
export function rawMember(text: string, key: string): string | undefined {
  memberDepth = 0;
  let i = skipWs(text, 0);
  if (text.charCodeAt(i) !== OPEN_OBJECT) return undefined;
  i = skipWs(text, i + 1);
  if (text.charCodeAt(i) === CLOSE_OBJECT) return undefined;
  let found: string | undefined;
  for (;;) {
    const keyEnd = stringEnd(text, i);
    const rawKey = text.slice(i + 1, keyEnd - 1);
    const name = rawKey.includes('\\') ? (JSON.parse(text.slice(i, keyEnd)) as string) : rawKey;
    i = skipWs(text, skipWs(text, keyEnd) + 1);
    const end = valueEnd(text, i);
    if (name === key) {
      found = text.slice(i, end);
      memberDepth = scannedDepth;
    }
    i = skipWs(text, end);
    if (text.charCodeAt(i) !== COMMA) return found;
    i = skipWs(text, i + 1);
  }
}

let memberDepth = 0;

/**
 * How deep the member the last rawMember call returned nests (arrays and objects, the member's
 * own level counting 1; 0 for a scalar or when it found none), measured by the same scan that
 * sliced it: a job's `input` is checked against its depth limit without a second walk.
 */
export function rawMemberDepth(): number {
  return memberDepth;
}

/** How deep the JSON text of one value nests, as rawMemberDepth counts it (the text must be valid JSON). */
export function jsonDepth(text: string): number {
  valueEnd(text, skipWs(text, 0));
  return scannedDepth;
}

/**
 * Python's `json.dumps` writes `NaN`, `Infinity` and `-Infinity` by default (allow_nan=True),
 * so a runpod-python worker whose handler returns a float('nan') posts text JSON.parse refuses.
 * Returns the text with those tokens (outside strings) replaced by `null`, as JavaScript's
 * JSON.stringify writes non-finite numbers; undefined when there is none to replace.
 */
export function nonFiniteToNull(text: string): string | undefined {
  let out = '';
  let from = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
      continue;
    }
    if (c === QUOTE) {
      inString = true;
      continue;
    }
    const len = c === 0x4e /* N */ && text.startsWith('NaN', i) ? 3
      : c === 0x49 /* I */ && text.startsWith('Infinity', i) ? 8
        : c === 0x2d /* - */ && text.startsWith('-Infinity', i) ? 9 : 0;
    if (len === 0) continue;
    out += `${text.slice(from, i)}null`;
    i += len - 1;
    from = i + 1;
  }
  return from === 0 ? undefined : out + text.slice(from);
}

/**
 * JSON text with every object's keys sorted: two values that differ only in key order (an
 * `env` sent again in another order) give the same text, for comparisons and hashes.
 */
export function sortedJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return v;
    const sorted: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) sorted[k] = (v as Record<string, unknown>)[k];
    return sorted;
  });
}

/** Any character that `JSON.stringify` escapes or that takes more than one byte in UTF-8. */
const NOT_PLAIN = /[\u0000-\u001f"\\\u007f-\uffff]/;

/**
 * The UTF-8 byte length of `s` as `JSON.stringify(s)` writes it, quotes left out: what a string
 * really costs in a JSON reply. A control character is 2 bytes (`\n`) or 6 (`\u0000`), a lone
 * surrogate 6 (`\udc80`), a character from U+0800 up (U+FFFD, what invalid UTF-8 decodes to) 3.
 * Plain ASCII, the common case, is its length, found by one regex test and no copy.
 */
export function jsonStringBytes(s: string): number {
  if (!NOT_PLAIN.test(s)) return s.length;
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20) n += c === 0x08 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d ? 2 : 6;
    else if (c === 0x22 || c === 0x5c) n += 2;
    else if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && s.charCodeAt(i + 1) >= 0xdc00 && s.charCodeAt(i + 1) <= 0xdfff) {
      n += 4;
      i++;
    } else if (c >= 0xd800 && c <= 0xdfff) n += 6;
    else n += 3;
  }
  return n;
}
