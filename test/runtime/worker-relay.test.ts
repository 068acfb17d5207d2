/**
 * The worker relay (how containers reach a flashd that listens on loopback) with real sockets:
 * it forwards connections from its allowed subnets (the bridge network the containers are on)
 * and closes every other one. On the engine's gateway address a host of the local network that
 * routes that address to this machine would otherwise reach flashd's whole API, although flashd
 * listens on loopback only. Loopback stands in for the bridge here: 127.0.0.2 is "a container"
 * and 127.0.0.1 "a neighbour".
 */
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import t from 'tap';
import { createLogger } from '../../src/core/logger.js';
import { WorkerRelay } from '../../src/runtime/docker/worker-relay.js';

/** Connects from `localAddress`, sends a line and resolves with what came back before the close. */
function exchange(port: number, localAddress: string): Promise<string> {
  return new Promise((resolve) => {
    let got = '';
    const s: Socket = connect({ host: '127.0.0.1', port, localAddress }, () => s.write('ping\n'));
    s.setEncoding('utf8').on('data', (c: string) => {
      got += c;
      if (got.includes('\n')) s.end();
    });
    s.on('error', () => undefined);
    s.on('close', () => resolve(got));
  });
}

t.test('the relay forwards connections from its subnets only', async (t) => {
  const target = createServer((c) => c.on('data', (d) => c.write(`echo ${d.toString()}`)));
  await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
  t.teardown(() => target.close());
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
  const listenPort = (probe.address() as AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));

  const lines: string[] = [];
  const log = createLogger({ level: 'info', format: 'text', sink: { write: (l: string) => void lines.push(l) } });
  const relay = new WorkerRelay({
    listenHost: '127.0.0.1', listenPort, targetHost: '127.0.0.1', targetPort: (target.address() as AddressInfo).port, log,
    allowedSubnets: ['127.0.0.2/32'],
  });
  t.teardown(() => relay.close());
  t.equal(await relay.ensure(), true, 'listening');

  t.equal(await exchange(listenPort, '127.0.0.2'), 'echo ping\n', 'a client on the bridge subnet reaches flashd');
  t.equal(await exchange(listenPort, '127.0.0.1'), '', 'a client from elsewhere is closed without a byte');
  t.equal(await exchange(listenPort, '127.0.0.1'), '', 'every time');
  const refused = lines.filter((l) => /worker relay refused a connection/.test(l));
  t.equal(refused.length, 1, 'logged once per address');
  t.match(refused[0], /from=127\.0\.0\.1/, 'naming where it came from');
});
