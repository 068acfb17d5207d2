/**
 * A /stream poll hands out at most STREAM_POLL_BYTES of chunk text; the rest wait in SQLite for
 * the next poll. A generator that nobody polled for a while can leave gigabytes of chunks, and
 * one reply with all of them held them all in memory at once (600 MB of chunks: a 500 past V8's
 * longest string, and the chunks were lost, marked read before the reply failed).
 */
import t from 'tap';
import { startAgent, cpuBody } from '../helpers/agent.js';
import { TestWorker } from '../helpers/worker.js';
import { STREAM_POLL_BYTES } from '../../src/queue/job-queue.js';

t.test('a poll hands out a bounded share of a large backlog of chunks; the next polls get the rest, in order, none lost', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  const CHUNKS = 40;
  const pad = 'p'.repeat(900_000); // under the 1 MB split: one chunk each
  for (let i = 0; i < CHUNKS; i++) t.equal(await w.stream(id, `${i}:${pad}`), 200, `chunk ${i} acknowledged`);
  t.equal((await w.done(id, { output: [] })).status, 200);

  const seen: number[] = [];
  const sizes: number[] = [];
  const statuses: string[] = [];
  for (let polls = 0; polls < CHUNKS + 2; polls++) {
    // ?wait=0: answered at once, not paced as a poll right after the last one is.
    const r = await a.req('GET', `/v2/${ep}/stream/${id}?wait=0`);
    t.equal(r.status, 200);
    const body = r.json as { status: string; stream: { output: string }[] };
    statuses.push(body.status);
    if (body.stream.length === 0) break;
    sizes.push(r.text.length);
    for (const c of body.stream) seen.push(Number(c.output.slice(0, c.output.indexOf(':'))));
  }
  // A client that stops at a final status (runpod-sdk's stream()) must not stop while chunks
  // are left: each poll that leaves some says IN_PROGRESS; the one with the last says COMPLETED.
  const last = sizes.length - 1;
  t.same(statuses.slice(0, last), Array(last).fill('IN_PROGRESS'), 'polls that left chunks for the next one say IN_PROGRESS');
  t.same(statuses.slice(last), statuses.slice(last).map(() => 'COMPLETED'), 'the poll with the last chunks, and any after it, say COMPLETED');
  t.same(seen, Array.from({ length: CHUNKS }, (_, i) => i), 'every chunk once, in order');
  t.ok(sizes.length > 1, `the ${CHUNKS} chunks (${(CHUNKS * pad.length / 1048576).toFixed(0)} MB) came in ${sizes.length} polls`);
  t.ok(Math.max(...sizes) <= STREAM_POLL_BYTES + 1_000_000, `the largest poll was ${(Math.max(...sizes) / 1048576).toFixed(1)} MB`);
  t.equal(a.agent.db.prepare('SELECT count(*) FROM job_chunks WHERE job_id = ?').pluck().get(id), 0, 'read chunks are deleted');
});

t.test('the poll bound counts bytes, not characters: chunks of non-ASCII text do not make a reply 3 times larger', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 300 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  const CHUNKS = 20;
  const pad = '€'.repeat(330_000); // 3 bytes each in UTF-8: about 1 MB a chunk, one chunk each, 0.33 M characters
  for (let i = 0; i < CHUNKS; i++) t.equal(await w.stream(id, `${i}:${pad}`), 200, `chunk ${i} acknowledged`);
  t.equal((await w.done(id, { output: [] })).status, 200);

  const seen: number[] = [];
  const bytes: number[] = [];
  for (let polls = 0; polls < CHUNKS + 2; polls++) {
    const r = await a.req('GET', `/v2/${ep}/stream/${id}`);
    t.equal(r.status, 200);
    const body = r.json as { status: string; stream: { output: string }[] };
    if (body.stream.length === 0) break;
    bytes.push(Buffer.byteLength(r.text, 'utf8'));
    for (const c of body.stream) {
      t.equal(c.output.length, pad.length + `${seen.length}:`.length, 'whole');
      seen.push(Number(c.output.slice(0, c.output.indexOf(':'))));
    }
  }
  t.same(seen, Array.from({ length: CHUNKS }, (_, i) => i), 'every chunk once, in order');
  t.ok(Math.max(...bytes) <= STREAM_POLL_BYTES + 1_048_576, `the largest poll was ${(Math.max(...bytes) / 1048576).toFixed(1)} MiB of UTF-8 (the bound is ${STREAM_POLL_BYTES / 1048576} MiB)`);
  t.ok(bytes.length > 1, `the ${(CHUNKS * pad.length * 3 / 1048576).toFixed(0)} MiB came in ${bytes.length} polls`);
});
