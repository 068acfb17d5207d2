/**
 * How containers reach flashd when flashd listens on loopback only (the default). A worker on
 * the engine's bridge network cannot reach the host's 127.0.0.1, so flashd relays TCP from the
 * bridge's gateway address (e.g. 172.17.0.1 with Docker, 10.88.0.1 with Podman) to its own
 * loopback listener. Only the host and the containers on that bridge can reach the gateway
 * address, so the API is not opened to the network.
 *
 * The bridge interface may not exist yet: Podman creates it when its first container starts.
 * `ensure()` is then retried after each container start until the address can be bound.
 */
import net from 'node:net';
import type { Logger } from '../../core/logger.js';

export interface WorkerRelayOptions {
  listenHost: string;
  listenPort: number;
  targetHost: string;
  targetPort: number;
  log: Logger;
}

export class WorkerRelay {
  readonly #o: WorkerRelayOptions;
  readonly #sockets = new Set<net.Socket>();
  #server: net.Server | null = null;
  #binding: Promise<boolean> | null = null;
  #warned = false;
  #closed = false;

  constructor(options: WorkerRelayOptions) {
    this.#o = options;
  }

  get listening(): boolean {
    return this.#server !== null;
  }

  /** Binds the relay if it is not bound yet; false when the address cannot be bound (yet). */
  ensure(): Promise<boolean> {
    if (this.#server || this.#closed) return Promise.resolve(this.#server !== null);
    this.#binding ??= this.#bind().finally(() => {
      this.#binding = null;
    });
    return this.#binding;
  }

  #bind(): Promise<boolean> {
    const { listenHost, listenPort, log } = this.#o;
    return new Promise((resolve) => {
      const server = net.createServer((client) => this.#relay(client));
      server.once('error', (err: NodeJS.ErrnoException) => {
        // EADDRNOTAVAIL: the bridge is not up yet (retried). Anything else is worth a warning.
        if (err.code !== 'EADDRNOTAVAIL' || !this.#warned) {
          log[err.code === 'EADDRNOTAVAIL' ? 'info' : 'warn']('worker relay cannot listen yet', {
            address: `${listenHost}:${listenPort}`, reason: err.message,
            hint: err.code === 'EADDRNOTAVAIL' ? 'retried when a container starts' : 'set --worker-url, or --host to an address containers reach',
          });
          this.#warned = true;
        }
        resolve(false);
      });
      server.listen({ host: listenHost, port: listenPort, exclusive: true }, () => {
        if (this.#closed) {
          server.close();
          resolve(false);
          return;
        }
        this.#server = server;
        log.info('worker relay listening', { address: `${listenHost}:${listenPort}`, target: `${this.#o.targetHost}:${this.#o.targetPort}` });
        resolve(true);
      });
    });
  }

  #relay(client: net.Socket): void {
    const upstream = net.connect({ host: this.#o.targetHost, port: this.#o.targetPort });
    // Job-take, ping and job-done are small request/reply exchanges: no Nagle delay.
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    for (const s of [client, upstream]) {
      this.#sockets.add(s);
      s.once('close', () => this.#sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  }

  close(): Promise<void> {
    this.#closed = true;
    for (const s of this.#sockets) s.destroy();
    const server = this.#server;
    this.#server = null;
    return new Promise((resolve) => (server ? server.close(() => resolve()) : resolve()));
  }
}
