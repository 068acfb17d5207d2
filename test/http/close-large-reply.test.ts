/**
 * A large reply still draining under backpressure when close() begins is sent whole: it counts
 * as answered only once its last byte went out.
 */
import t from 'tap';
import { connect } from 'node:net';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });
const SIZE = 32 * 1024 * 1024;

t.test('close lets a large reply under backpressure finish', async (t) => {
  const body = Buffer.alloc(SIZE, 0x61);
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: () => ({ maxBodyBytes: 1024, handle: () => ({ status: 200, headers: { 'content-type': 'text/plain' }, body }) }),
    onEarlyError: (kind, detail) => ({ status: 500, body: `${kind} ${detail}` }),
  });
  const { port } = await server.listen();
  const socket = connect(port, '127.0.0.1');
  await new Promise((resolve) => socket.once('connect', resolve));
  let received = 0;
  socket.on('data', (d: Buffer) => (received += d.length));
  socket.pause();
  socket.write('GET /big HTTP/1.1\r\nHost: x\r\n\r\n');
  await new Promise((resolve) => setTimeout(resolve, 200));
  const started = Date.now();
  const closing = server.close();
  await new Promise((resolve) => setTimeout(resolve, 50));
  socket.resume();
  await closing;
  await new Promise((resolve) => socket.once('close', resolve));
  t.ok(Date.now() - started < 3500, 'close within the grace');
  t.ok(received >= SIZE, `the whole body arrived (${received} of ${SIZE} bytes and a head)`);
});
