/**
 * The last request close() waits for, answered from inside a uWS callback, gets its reply:
 * the server closes after the cork buffer is flushed, not in that callback's microtasks.
 */
import t from 'tap';
import { connect } from 'node:net';
import { createHttpServer } from '../../src/http/index.js';
import { createLogger } from '../../src/core/logger.js';

const log = createLogger({ level: 'error', sink: { write: () => undefined } });

t.test('the last request answered during close gets its reply', async (t) => {
  const server = createHttpServer({
    host: '127.0.0.1', port: 0, log,
    resolve: () => ({ maxBodyBytes: 1024, handle: async (req) => ({ status: 200, headers: { 'content-type': 'text/plain' }, body: `got ${req.body.length}` }) }),
    onEarlyError: (kind, detail) => ({ status: 503, body: `${kind} ${detail}` }),
  });
  const { port } = await server.listen();
  const socket = connect(port, '127.0.0.1');
  await new Promise((resolve) => socket.once('connect', resolve));
  let reply = '';
  socket.on('data', (d: Buffer) => (reply += d.toString()));
  const closed = new Promise((resolve) => socket.once('close', resolve));
  socket.write('POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345');
  await new Promise((resolve) => setTimeout(resolve, 50));
  const closing = server.close();
  await new Promise((resolve) => setTimeout(resolve, 20));
  socket.write('67890');
  await closing;
  await closed;
  t.match(reply, /^HTTP\/1\.1 200[\s\S]*got 10$/, `the reply arrived (got ${JSON.stringify(reply)})`);
});
