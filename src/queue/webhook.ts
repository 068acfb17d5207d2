/**
 * Webhooks: the final status body, plus `input` and `webhook` (views.ts webhookBody), is POSTed
 * to the job's `webhook` URL, with 2 more tries 10 s apart (RunPod's documented behaviour). A
 * try fails after 10 s idle or 60 s in all. Addresses are resolved, checked and pinned before
 * connecting, so a name that resolves to a private or loopback address is refused unless the
 * operator allowed private targets (`--webhook-allow-private`).
 */
import { lookup } from 'node:dns/promises';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { isIP } from 'node:net';
import type { Logger } from '../core/logger.js';

export interface WebhookOptions {
  allowPrivate: boolean;
  retryDelayMs: number;
  attempts: number;
  /** A try fails after this long without a byte sent or received. */
  timeoutMs: number;
  /**
   * A try fails after this long in all (connect, request body, answer), however busy the
   * connection: a receiver dripping its answer, or reading the body a byte at a time, would
   * otherwise hold the delivery, and its outbox row, for ever. An answer whose status came in
   * time is cut here too, its status kept.
   */
  deadlineMs: number;
  log: Logger;
  /** The delivery of `jobId` is over: a 2xx, or its tries ran out (not called after close). */
  onSettled?(jobId: string): void;
}

/** The first three octets decide: 192.0.0.0/24 and 192.0.2.0/24 are special, the rest of 192.0/16 is public. */
function isPrivateV4(a: number, b: number, c: number): boolean {
  return a === 0 || a === 10 || a === 127 || (a === 100 && b >= 64 && b <= 127) || (a === 169 && b === 254) ||
    (a === 172 && b >= 16 && b <= 31) || (a === 192 && b === 168) || (a === 192 && b === 0 && (c === 0 || c === 2)) ||
    (a === 198 && (b === 18 || b === 19)) || a >= 224;
}

/** The eight 16-bit groups of an IPv6 address (`::` expanded, a trailing dotted IPv4 as two groups). */
function ipv6Groups(ip: string): number[] | undefined {
  let text = ip;
  const lastColon = text.lastIndexOf(':');
  if (text.includes('.', lastColon)) {
    const v4 = text.slice(lastColon + 1);
    if (isIP(v4) !== 4) return undefined;
    const [a = 0, b = 0, c = 0, d = 0] = v4.split('.').map(Number);
    text = `${text.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const parse = (part: string | undefined) => (part ? part.split(':').map((h) => parseInt(h, 16)) : []);
  const head = parse(halves[0]);
  if (halves.length === 1) return head.length === 8 ? head : undefined;
  const tail = parse(halves[1]);
  const fill = 8 - head.length - tail.length;
  return fill < 0 ? undefined : [...head, ...new Array<number>(fill).fill(0), ...tail];
}

/**
 * True for loopback, private, link-local, CGNAT, unspecified, multicast and similar ranges, in
 * any spelling: an IPv4 address inside an IPv6 one (`::ffff:7f00:1`, `::ffff:127.0.0.1`,
 * NAT64 `64:ff9b::a00:1`, 6to4 `2002:7f00:1::`) is judged by its IPv4 part.
 */
export function isPrivateAddress(address: string): boolean {
  const ip = address.toLowerCase().replace(/^\[|\]$/g, '').replace(/%.*$/, '');
  const family = isIP(ip);
  if (family === 4) {
    const [a = 0, b = 0, c = 0] = ip.split('.').map(Number);
    return isPrivateV4(a, b, c);
  }
  if (family !== 6) return true;
  const g = ipv6Groups(ip);
  if (!g || g.some((x) => !Number.isInteger(x) || x < 0 || x > 0xffff)) return true;
  const [g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0, g5 = 0, g6 = 0, g7 = 0] = g;
  // An IPv4 address held in two groups.
  const v4 = (hi: number, lo: number) => isPrivateV4(hi >> 8, hi & 0xff, lo >> 8);
  // ::/96 (unspecified, loopback, IPv4-compatible: 0.x.x.x is private) and ::ffff:0:0/96 (mapped).
  if (g0 === 0 && g1 === 0 && g2 === 0 && g3 === 0 && g4 === 0 && (g5 === 0 || g5 === 0xffff)) return v4(g6, g7);
  // NAT64 64:ff9b::/96 carries an IPv4 address; 64:ff9b:1::/48 is for local use.
  if (g0 === 0x64 && g1 === 0xff9b) return g2 === 1 || v4(g6, g7);
  // 6to4 2002::/16 carries one in its second and third groups.
  if (g0 === 0x2002) return v4(g1, g2);
  // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local, ff00::/8 multicast.
  return (g0 & 0xfe00) === 0xfc00 || (g0 & 0xffc0) === 0xfe80 || (g0 & 0xffc0) === 0xfec0 || (g0 & 0xff00) === 0xff00;
}

/**
 * What is wrong with a `webhook` URL, for a 400 at submit. Without `allowPrivate`, a target
 * that is private by its spelling alone (an IP address in any form the URL parser accepts,
 * `localhost` and `*.localhost`) is refused here too; other names are judged when connecting.
 */
export function checkWebhookUrl(raw: string, allowPrivate = true): string | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return 'webhook must be an absolute http(s) URL';
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return 'webhook must use http or https';
  if (url.username || url.password) return 'webhook must not carry credentials in the URL';
  if (!allowPrivate) {
    // The parser has already turned 2130706433, 0x7f.1 and [::ffff:127.0.0.1] into canonical addresses.
    const host = url.hostname.replace(/^\[|\]$/g, '').replace(/\.$/, '');
    if ((isIP(host) && isPrivateAddress(host)) || host === 'localhost' || host.endsWith('.localhost')) {
      return 'webhook must not point at a loopback, private or link-local address (this server was started without --webhook-allow-private)';
    }
  }
  return undefined;
}

/** One delivery: a job's final status body, sent until a 2xx or its tries run out. */
interface Delivery {
  readonly url: string;
  readonly body: string;
  readonly jobId: string;
  attempt: number;
  /** Its next try, while one is waiting. */
  timer: NodeJS.Timeout | undefined;
  /** The job began a new run (/retry): this status is no longer final, so no more tries. */
  superseded: boolean;
}

export class WebhookSender {
  readonly #o: WebhookOptions;
  /** Deliveries not yet over, per job (a /retry's run can finish while the first one's retries). */
  readonly #live = new Map<string, Set<Delivery>>();
  #closed = false;

  constructor(options: WebhookOptions) {
    this.#o = options;
  }

  send(url: string, body: string, jobId: string): void {
    if (this.#closed) return;
    const d: Delivery = { url, body, jobId, attempt: 1, timer: undefined, superseded: false };
    let set = this.#live.get(jobId);
    if (!set) this.#live.set(jobId, (set = new Set()));
    set.add(d);
    this.#try(d);
  }

  /**
   * `jobId` began a new run (/retry): the deliveries of its earlier final status make no more
   * tries, so a receiver never gets that status after the new run's. A try in flight ends as
   * it will (a 2xx or not, it is the last).
   */
  supersede(jobId: string): void {
    for (const d of this.#live.get(jobId) ?? []) {
      d.superseded = true;
      if (d.timer) {
        clearTimeout(d.timer);
        d.timer = undefined;
        this.#settle(d);
      }
    }
  }

  #try(d: Delivery): void {
    this.#post(d.url, d.body).then(
      (status) => {
        if (status < 200 || status >= 300) this.#again(d, `status ${status}`);
        else this.#settle(d);
      },
      (err: Error) => this.#again(d, err.message),
    );
  }

  #settle(d: Delivery): void {
    const set = this.#live.get(d.jobId);
    set?.delete(d);
    if (set?.size === 0) this.#live.delete(d.jobId);
    // Closed: still owed, so the next start sends it again.
    if (!this.#closed) this.#o.onSettled?.(d.jobId);
  }

  #again(d: Delivery, why: string): void {
    if (this.#closed) return;
    if (d.superseded) {
      this.#settle(d);
      return;
    }
    if (d.attempt >= this.#o.attempts) {
      this.#o.log.warn('webhook gave up', { jobId: d.jobId, attempts: d.attempt, reason: why });
      this.#settle(d);
      return;
    }
    d.timer = setTimeout(() => {
      d.timer = undefined;
      d.attempt++;
      this.#try(d);
    }, this.#o.retryDelayMs);
  }

  async #post(raw: string, body: string): Promise<number> {
    const url = new URL(raw);
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const { address, family } = isIP(host) ? { address: host, family: isIP(host) } : await lookup(host);
    if (!this.#o.allowPrivate && isPrivateAddress(address)) throw new Error(`refused private address ${address}`);
    const request = url.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise((resolve, reject) => {
      const req = request(
        {
          protocol: url.protocol, hostname: host, port: url.port || undefined, path: url.pathname + url.search, method: 'POST',
          headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'user-agent': 'flashd-webhook' },
          // Pin the connection to the address that was checked (no DNS rebinding). Node's HTTP
          // client asks for every address ({ all: true }, for happy eyeballs) and then wants a list.
          lookup: (_h, o, cb) => {
            if ((o as { all?: boolean }).all) (cb as (e: null, a: { address: string; family: number }[]) => void)(null, [{ address, family }]);
            else (cb as (e: null, a: string, f: number) => void)(null, address, family);
          },
          timeout: this.#o.timeoutMs,
        },
        (res) => {
          // Cut at the deadline (below) after the status is taken: an error then is no failure.
          res.on('error', () => undefined);
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      const deadline = setTimeout(() => req.destroy(new Error(`deadline: no complete answer within ${this.#o.deadlineMs} ms`)), this.#o.deadlineMs);
      deadline.unref();
      req.on('close', () => clearTimeout(deadline));
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.on('error', reject);
      req.end(body);
    });
  }

  close(): void {
    this.#closed = true;
    for (const set of this.#live.values()) for (const d of set) clearTimeout(d.timer);
    this.#live.clear();
  }
}
