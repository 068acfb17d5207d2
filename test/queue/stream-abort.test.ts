/**
 * A /stream poll whose client went away hands out nothing: its chunks stay for the next poll.
 * A poll waits for the writes in flight to be durable before it reads (`queue.durable()`, an
 * fdatasync on libuv's thread pool); a client that left during that wait must not have the
 * chunks drained into a reply nobody reads. The wait is made long on purpose by filling the
 * thread pool with reads of a FIFO, so the client's departure surely falls inside it.
 */
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync, read, writeSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { ADMIN_KEY, cpuBody, startAgent } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { TestWorker } from '../helpers/worker.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Occupies every libuv thread-pool thread until the returned function is called. */
function blockThreadPool(dir: string): () => void {
  const fifo = join(dir, 'pool-block.fifo');
  execFileSync('mkfifo', [fifo]);
  // O_RDWR: opening does not wait for a writer, and reads block until bytes come.
  const fd = openSync(fifo, constants.O_RDWR);
  const threads = Math.max(4, Number(process.env['UV_THREADPOOL_SIZE'] ?? 4));
  let pending = threads;
  for (let i = 0; i < threads; i++) read(fd, Buffer.alloc(1), 0, 1, null, () => void (--pending === 0 && closeSync(fd)));
  let released = false;
  return () => {
    if (released) return;
    released = true;
    writeSync(fd, Buffer.alloc(threads));
  };
}

t.test('a client that leaves a /stream poll while it waits for durability loses no chunk', async (t) => {
  const dir = testDataDir(t);
  const a = await startAgent(t, { takeHoldMs: 300 }, { dir });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const w = await TestWorker.create(a, ep);
  const id = (await a.req('POST', `/v2/${ep}/run`, { body: { input: {} } })).json.id as string;
  t.equal((await w.take())?.id, id);
  t.equal(await w.stream(id, 'c1'), 200, 'a chunk acknowledged (durable)');

  const release = blockThreadPool(dir);
  // Before the agent closes (teardowns run last first): a failed assertion must not leave it blocked.
  t.teardown(release);
  // A write whose sync cannot finish while the pool is blocked: every poll now waits for it.
  const pendingRun = a.req('POST', `/v2/${ep}/run`, { body: { input: { n: 2 } } });
  await sleep(100);
  const sock = connect(new URL(a.url).port as unknown as number, '127.0.0.1');
  let got = '';
  sock.on('data', (d) => (got += d.toString()));
  sock.on('error', () => undefined);
  sock.write(`GET /v2/${ep}/stream/${id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n\r\n`);
  await sleep(300);
  t.equal(got, '', 'the poll is waiting for the sync');
  sock.destroy();
  await sleep(200);
  release();
  t.equal((await pendingRun).status, 200, 'the blocked write completes');
  await a.agent.queue.durable();

  const next = (await a.req('GET', `/v2/${ep}/stream/${id}`)).json;
  t.same(next, { status: 'IN_PROGRESS', stream: [{ output: 'c1' }] }, 'the chunk is handed to the next poll');
  t.same((await a.req('GET', `/v2/${ep}/stream/${id}`)).json, { status: 'IN_PROGRESS', stream: [] }, 'once');
});
