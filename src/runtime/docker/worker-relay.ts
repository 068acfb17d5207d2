/**
 * How containers reach flashd when flashd listens on loopback only (the default). A worker on
 * the engine's bridge network cannot reach the host's 127.0.0.1, so flashd relays TCP from the
 * bridge's gateway address (e.g. 172.17.0.1 with Docker, 10.88.0.1 with Podman) to its own
 * loopback listener. The gateway address is the host's own, so a machine of the local network
 * that routes it to this host reaches it too: the relay forwards only connections from the
 * bridge's subnets (the containers, and the host itself on the bridge) and closes the others,
 * so the API is not opened to the network.
 *
 * The bridge interface may not exist yet: Podman creates it when its first container starts.
 * `ensure()` is then retried after each container start until the address can be bound.
 */
import net, { BlockList } from 'node:net';
import type { Logger } from '../../core/logger.js';

export interface WorkerRelayOptions {
  listenHost: string;
  listenPort: number;
  targetHost: string;
  targetPort: number;
  /**
   * IPv4 subnets (`10.88.0.0/16`) whose connections are forwarded; any other is closed at once.
   * Empty: every connection is forwarded (the engine reported no subnet).
   */
  allowedSubnets?: readonly string[];
  log: Logger;
}

/** Addresses whose refusal is logged, at most (one line each). */
const MAX_REFUSALS_LOGGED = 100;

export class WorkerRelay {
  readonly #o: WorkerRelayOptions;
  readonly #sockets = new Set<net.Socket>();
  #server: net.Server | null = null;
  #binding: Promise<boolean> | null = null;
  #warned = false;
  #closed = false;
  /** Null: no subnet known, every client is forwarded. */
  readonly #allowed: BlockList | null = null;
  readonly #refusedLogged = new Set<string>();

  constructor(options: WorkerRelayOptions) {
    this.#o = options;
    for (const cidr of options.allowedSubnets ?? []) {
      const m = /^(\d{1,3}(?:\.\d{1,3}){3})\/(\d{1,2})$/.exec(cidr.trim());
      if (!m || Number(m[2]) > 32) continue;
      this.#allowed ??= new BlockList();
      this.#allowed.addSubnet(m[1] as string, Number(m[2]), 'ipv4');
    }
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
    if (this.#allowed) {
      const from = (client.remoteAddress ?? '').replace(/^::ffff:/i, '');
      if (!net.isIPv4(from) || !this.#allowed.check(from, 'ipv4')) {
        client.destroy();
        if (!this.#refusedLogged.has(from) && this.#refusedLogged.size < MAX_REFUSALS_LOGGED) {
          this.#refusedLogged.add(from);
          this.#o.log.warn('worker relay refused a connection from outside the container network', {
            from, address: `${this.#o.listenHost}:${this.#o.listenPort}`, allowed: (this.#o.allowedSubnets ?? []).join(','),
          });
        }
        return;
      }
    }
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
