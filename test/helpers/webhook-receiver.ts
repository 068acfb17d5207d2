/**
 * A loopback webhook receiver for tests. It closes each connection after its answer (so a
 * connection is one delivery), counts the connections open at once (its own in `state`, and
 * across receivers in `counter` when one is given), records each accepted delivery's parsed
 * body, and answers `state.status` after `holdMs`, or, while `state.held`, only when released.
 */
import { createServer, type Server } from 'node:http';
import type { Test } from 'tap';

export interface ReceiverState {
  /** The status answered; deliveries answered 2xx are recorded in `ids` and `bodies`. */
  status: number;
  held: boolean;
  /** Answers of deliveries held back, in arrival order (`release` sends them). */
  waiting: (() => void)[];
  /** Ids of every delivery that arrived, answered or not. */
  arrived: Set<string>;
  ids: string[];
  bodies: Map<string, any>;
  /** Connections open now, and the most at once. */
  now: number;
  max: number;
}

export interface Receiver {
  state: ReceiverState;
  release(): void;
  url: string;
}

export async function webhookReceiver(t: Test, options: { holdMs?: number; counter?: { now: number; max: number } } = {}): Promise<Receiver> {
  const holdMs = options.holdMs ?? 0;
  const counter = options.counter;
  const state: ReceiverState = { status: 200, held: false, waiting: [], arrived: new Set(), ids: [], bodies: new Map(), now: 0, max: 0 };
  const server: Server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const parsed = JSON.parse(body);
      state.arrived.add(parsed.id);
      const answer = () => {
        if (state.status < 300) {
          state.ids.push(parsed.id);
          state.bodies.set(parsed.id, parsed);
        }
        res.statusCode = state.status;
        res.setHeader('connection', 'close');
        res.end();
      };
      if (state.held) state.waiting.push(answer);
      else if (holdMs > 0) setTimeout(answer, holdMs);
      else answer();
    });
  });
  server.on('connection', (socket) => {
    state.max = Math.max(state.max, ++state.now);
    if (counter) counter.max = Math.max(counter.max, ++counter.now);
    socket.on('close', () => {
      state.now--;
      if (counter) counter.now--;
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  }));
  const release = () => {
    state.held = false;
    for (const answer of state.waiting.splice(0)) answer();
  };
  return { state, release, url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook` };
}
