/**
 * README "Running jobs", /stream: "each /stream element, {"output":"…"} as served, is at most
 * 1 MB (1,048,576 bytes) of UTF-8". Pinned at the edge, where the element's own bytes
 * (`{"output":}`, and `,"metrics":` with metrics) decide whether a chunk is split: a chunk
 * served whole as exactly 1 MB stays one element, one byte more is split, with and without
 * metrics, for a string output and for an object one.
 */
import t from 'tap';
import { cpuBody, startAgent, type TestAgent } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';

const LIMIT = 1024 * 1024;
/**
 * Sizes of a chunk served whole, around the limit: up to 11 bytes over it (the element's
 * `{"output":}`) and 22 (with `,"metrics":` too) a chunk used to be served whole.
 */
const EDGES = [-10, -2, -1, 0, 1, 2, 10, 11, 12, 21, 22, 23].map((d) => LIMIT + d);

async function setup(t: Parameters<typeof startAgent>[0]): Promise<{ a: TestAgent; ep: string; w: TestWorker; id: string }> {
  const a = await startAgent(t, { takeHoldMs: 1000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  await w.take();
  return { a, ep, w, id };
}

/** Posts one chunk and returns the /stream elements it became, each as the JSON text served. */
async function chunkOf(a: TestAgent, ep: string, w: TestWorker, id: string, body: { output: unknown; metrics?: unknown }): Promise<string[]> {
  const res = await fetch(w.postUrl('stream', id), {
    method: 'POST', headers: { authorization: w.key, 'content-type': 'application/x-www-form-urlencoded' }, body: JSON.stringify(body),
  });
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`job-stream: ${res.status}`);
  const served = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as unknown[];
  // Compact ASCII JSON throughout: stringified again, each element is the text flashd served.
  return served.map((e) => JSON.stringify(e));
}

t.test('a string output: every element at most 1 MB as served, and as few as that allows', async (t) => {
  const { a, ep, w, id } = await setup(t);
  const metrics = { i: 1 };
  for (const withMetrics of [false, true]) {
    // What the chunk would be served as, whole: `{"output":"…"}` or `{"output":"…","metrics":{"i":1}}`.
    const wrapper = withMetrics ? `{"output":"","metrics":${JSON.stringify(metrics)}}`.length : '{"output":""}'.length;
    for (const whole of EDGES) {
      const output = 'a'.repeat(whole - wrapper);
      const els = await chunkOf(a, ep, w, id, withMetrics ? { output, metrics } : { output });
      const sizes = els.map((e) => Buffer.byteLength(e));
      const what = `${withMetrics ? 'with' : 'without'} metrics, ${whole - LIMIT} bytes from the limit served whole: ${sizes.join(', ')}`;
      t.ok(sizes.every((n) => n <= LIMIT), `each element at most 1 MB (${what})`);
      t.equal(els.length, whole <= LIMIT ? 1 : 2, `${whole <= LIMIT ? 'one element' : 'split in two'} (${what})`);
      const parsed = els.map((e) => JSON.parse(e) as { output: string; metrics?: unknown });
      t.equal(parsed.map((e) => e.output).join(''), output, `joined back they are the output (${what})`);
      if (withMetrics) t.same(parsed[0]?.metrics, metrics, `the metrics ride on the first element (${what})`);
      if (whole > LIMIT) t.equal(sizes[0], LIMIT, `the first element is full, its part and parts members included (${what})`);
    }
  }
});

t.test('an object output: served whole up to exactly 1 MB, split into pieces of its JSON text past it', async (t) => {
  const { a, ep, w, id } = await setup(t);
  for (const whole of EDGES) {
    const output = { pad: 'b'.repeat(whole - '{"output":{"pad":""}}'.length) };
    const els = await chunkOf(a, ep, w, id, { output });
    const sizes = els.map((e) => Buffer.byteLength(e));
    const what = `${whole - LIMIT} bytes from the limit served whole: ${sizes.join(', ')}`;
    t.ok(sizes.every((n) => n <= LIMIT), `each element at most 1 MB (${what})`);
    const parsed = els.map((e) => JSON.parse(e) as { output: unknown });
    if (whole <= LIMIT) t.same(parsed, [{ output }], `one element, the object as posted (${what})`);
    else {
      const strings = parsed.every((e) => typeof e.output === 'string');
      t.ok(strings, `split into string pieces (${what})`);
      if (strings) t.same(JSON.parse(parsed.map((e) => e.output as string).join('')), output, `pieces of its JSON text that join back (${what})`);
    }
  }
  // Metrics that fit with the object within the 1 MB go with it; a byte more and they are dropped,
  // the object kept whole while it fits alone.
  const metrics = { i: 1 };
  const metricsPart = `,"metrics":${JSON.stringify(metrics)}`.length;
  for (const whole of EDGES.filter((n) => n - metricsPart <= LIMIT)) {
    const output = { pad: 'c'.repeat(whole - `{"output":{"pad":""},"metrics":${JSON.stringify(metrics)}}`.length) };
    const els = await chunkOf(a, ep, w, id, { output, metrics });
    const what = `with metrics, ${whole - LIMIT} bytes from the limit served whole`;
    t.ok(els.every((e) => Buffer.byteLength(e) <= LIMIT), `each element at most 1 MB (${what})`);
    t.same(els.map((e) => JSON.parse(e)), whole <= LIMIT ? [{ output, metrics }] : [{ output }], `${whole <= LIMIT ? 'kept' : 'dropped'} (${what})`);
  }
});

t.test('the pieces of a split chunk say which chunk they belong to: part, parts and, for JSON text, json', async (t) => {
  const { a, ep, w, id } = await setup(t);
  // Four yields in a row, as a generator posts them: a big string, a small one, a big object, a small object.
  const big = 'x'.repeat(LIMIT + 200_000);
  const yields: unknown[] = [big, 'between', { big: 'y'.repeat(LIMIT + 200_000) }, { small: 1 }];
  for (const output of yields) {
    const res = await fetch(w.postUrl('stream', id), {
      method: 'POST', headers: { authorization: w.key, 'content-type': 'application/json' }, body: JSON.stringify({ output }),
    });
    await res.arrayBuffer();
    t.equal(res.status, 200, 'chunk stored');
  }
  const served = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: unknown; part?: number; parts?: number; json?: boolean }[];
  t.same(served.map((e) => [e.part, e.parts, e.json]), [[1, 2, undefined], [2, 2, undefined], [undefined, undefined, undefined], [1, 2, true], [2, 2, true], [undefined, undefined, undefined]],
    'pieces are numbered within their chunk; a chunk served whole has no marker');
  // What a client does: join the pieces of each chunk, parse them when they are JSON text.
  const rebuilt: unknown[] = [];
  let acc = '';
  for (const e of served) {
    if (e.part === undefined) { rebuilt.push(e.output); continue; }
    acc += e.output as string;
    if (e.part === e.parts) { rebuilt.push(e.json ? JSON.parse(acc) : acc); acc = ''; }
  }
  t.same(rebuilt, yields, 'each yield comes back as posted');
  t.ok(served.every((e) => Buffer.byteLength(JSON.stringify(e)) <= LIMIT), 'each element, its markers included, at most 1 MB');
  // Ten pieces or more: two-digit numbers, still within the limit and in order.
  const huge = 'z'.repeat(12 * LIMIT);
  const res = await fetch(w.postUrl('stream', id), { method: 'POST', headers: { authorization: w.key, 'content-type': 'application/json' }, body: JSON.stringify({ output: huge }) });
  await res.arrayBuffer();
  t.equal(res.status, 200, 'a 12 MB chunk stored');
  const many = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json.stream as { output: string; part: number; parts: number }[];
  t.same(many.map((e) => e.part), Array.from({ length: many.length }, (_, i) => i + 1), `numbered 1 to ${many.length}`);
  t.ok(many.length >= 12 && many.every((e) => e.parts === many.length), 'each says how many');
  t.ok(many.every((e) => Buffer.byteLength(JSON.stringify(e)) <= LIMIT), 'each at most 1 MB');
  t.equal(many.map((e) => e.output).join(''), huge, 'joined back they are the chunk');
});

t.test('a string that fits alone but not with its metrics (over half the limit) is served whole: no part members, metrics dropped', async (t) => {
  const { a, ep, w, id } = await setup(t);
  const metrics = { m: 'z'.repeat(1_100_000) };
  for (const output of ['y'.repeat(1000), 'y'.repeat(LIMIT - '{"output":""}'.length)]) {
    const els = await chunkOf(a, ep, w, id, { output, metrics });
    t.same(els.map((e) => JSON.parse(e)), [{ output }], `one element with the string alone, as a chunk served whole (${output.length} characters)`);
  }
  // An object in the same situation, as before.
  const els = await chunkOf(a, ep, w, id, { output: { a: 1 }, metrics });
  t.same(els.map((e) => JSON.parse(e)), [{ output: { a: 1 } }], 'an object: served whole, metrics dropped');
});
