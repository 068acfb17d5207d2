/**
 * Two Content-Length headers with different values (RFC 9112 §6.3: an unrecoverable framing
 * error). uWS takes the first and leaves the rest of the bytes to be read as the next request,
 * where a proxy in front that took the other value would disagree on where requests start.
 * flashd answers 400 problem+json and closes the connection.
 */
import t from 'tap';
import { connect } from 'node:net';
import { ADMIN_KEY, startAgent } from '../helpers/agent.js';

/** Writes `raw`, then `later` 50 ms after (a read of its own), and reports what came back. */
function exchange(port: number, raw: string, later = '', ms = 800): Promise<{ data: string; closed: boolean }> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let data = '';
    let closed = false;
    s.on('data', (d: Buffer) => (data += d.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => (closed = true));
    s.on('connect', () => {
      s.write(raw);
      if (later) setTimeout(() => !s.destroyed && s.write(later), 50);
    });
    setTimeout(() => {
      s.destroy();
      resolve({ data, closed });
    }, ms);
  });
}

t.test('differing Content-Length headers: 400 problem+json and the connection closed', async (t) => {
  const a = await startAgent(t);
  const port = Number(new URL(a.url).port);
  const head = `POST /v2/serverless HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\n`;
  for (const [first, second] of [[2, 28], [28, 2]]) {
    // After a 2-byte body, what follows would be read as a second request. (Sent in the same
    // read, uWS parses and answers it despite the close: README "HTTP limits".)
    const r = await exchange(port, `${head}Content-Length: ${first}\r\nContent-Length: ${second}\r\n\r\n{}`, 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    t.match(r.data, /^HTTP\/1\.1 400 Bad Request\r\n/, `${first} then ${second}: 400`);
    t.match(r.data, /\r\ncontent-type: application\/problem\+json\r\n/i);
    t.match(r.data, /"code":"BAD_REQUEST"/);
    t.equal(r.data.match(/HTTP\/1\.1 /g)?.length, 1, 'one response: nothing after the first length is read as a request');
    t.ok(r.closed, 'the connection is closed');
  }
  const same = await exchange(port, `${head}Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}`);
  t.match(same.data, /^HTTP\/1\.1 400 Bad Request\r\n[^]*"code":"VALIDATION_FAILED"/, 'the same value twice is one length: the body is read and checked');
});
