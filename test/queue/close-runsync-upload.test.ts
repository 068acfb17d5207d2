/**
 * A /runsync whose body finishes arriving after close() began gets an answer (a 503: the queue
 * takes no new work) rather than a silent wait, and no job is stored that nobody was told of.
 */
import t from 'tap';
import { connect } from 'node:net';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { startAgent, cpuBody, ADMIN_KEY } from '../helpers/agent.js';

t.test('a /runsync mid-upload at close gets a reply (an id or a 503), and no unknown job is stored', async (t) => {
  const a = await startAgent(t, { takeHoldMs: 60_000 });
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody({ workers: { min: 0, max: 0 } }) })).json.id as string;
  const port = new URL(a.url).port;
  const socket = connect(Number(port), '127.0.0.1');
  await new Promise((resolve) => socket.once('connect', resolve));
  let reply = '';
  socket.on('data', (d: Buffer) => (reply += d.toString()));
  const closed = new Promise((resolve) => socket.once('close', resolve));
  const body = JSON.stringify({ input: { n: 1 } });
  socket.write(`POST /v2/${ep}/runsync?wait=60000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`);
  await new Promise((resolve) => setTimeout(resolve, 100));
  const started = Date.now();
  const closing = a.agent.close();
  await new Promise((resolve) => setTimeout(resolve, 20));
  socket.write(body.slice(5));
  await closing;
  await closed;
  const took = Date.now() - started;
  t.match(reply, /^HTTP\/1\.1 (200|503)/, `a reply came (got ${JSON.stringify(reply.slice(0, 40))}); close took ${took} ms`);
  const db = new Database(join(a.dir, 'flashd.db'), { readonly: true });
  t.teardown(() => db.close());
  const rows = db.prepare('SELECT id, status FROM jobs').all() as { id: string }[];
  const told = /"id":"([^"]+)"/.exec(reply)?.[1];
  t.same(rows.map((r) => r.id).filter((id) => id !== told), [], 'no stored job whose id nobody was told');
});
