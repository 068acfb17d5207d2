/**
 * Webhooks: the final status body, plus `input` and `webhook` (views.ts webhookBody), is POSTed
 * to the job's `webhook` URL, with 2 more tries 10 s apart (RunPod's documented behaviour),
 * none after a failure no try can change (a 3xx, an address refused as private). A try fails
 * after 10 s idle or 60 s in all. Addresses are resolved, checked and pinned before
 * connecting, so a name that resolves to a private or loopback address is refused unless the
 * operator allowed private targets (`--webhook-allow-private`). The tries made are kept with the
 * owed webhook (onTried), so a start after a stop or a crash goes on at the next one.
 *
 * At most `maxInFlight` tries are in flight at once (64), and `maxInFlightPerHost` to one
 * destination (32); the others wait their turn in the order their jobs ended, holding no body:
 * it is built when the try starts (`bodyOf`, from the job's row). A purge of thousands of
 * queued jobs, or a restart owing thousands of webhooks, so opens no more than 64 connections
 * and holds no more than 64 bodies (each up to the 10 MB input plus the output).
 */
import { createHash } from 'node:crypto';
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
  /** Tries in flight at once; a delivery past it waits its turn (file descriptors, memory). */
  maxInFlight: number;
  /**
   * Tries in flight at once to one destination (scheme, host and port): a receiver that is slow
   * or unreachable, each try up to `deadlineMs`, never holds every slot, so deliveries to the
   * others go on.
   */
  maxInFlightPerHost: number;
  /**
   * The body a try of `jobId`'s webhook POSTs, built when the try starts (a delivery waiting its
   * turn, or its next try, holds none); undefined when there is nothing to send any more (the
   * job is gone, or no longer final), which settles the delivery without a POST.
   */
  bodyOf(jobId: string): string | undefined;
  /** The delivery of `jobId` is over: a 2xx, or its tries ran out (not called after close). */
  onSettled?(jobId: string): void;
  /**
   * A try of `jobId`'s delivery failed and another follows: `tries` made so far, kept with the
   * owed webhook so that a start after a stop or a crash goes on at the next try (send's
   * `tried`) instead of at the first. Only a failure is written (a first try that gets its 2xx
   * writes nothing more), so a try a stop or a crash cut off in flight is not counted.
   */
  onTried?(jobId: string, tries: number): void;
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
 * `name` is the member the message names (`webhook`, `webhookV2`).
 */
export function checkWebhookUrl(raw: string, allowPrivate = true, name = 'webhook'): string | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return `${name} must be an absolute http(s) URL`;
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return `${name} must use http or https`;
  if (url.username || url.password) return `${name} must not carry credentials in the URL`;
  // No connection can be made to port 0, so every try would fail.
  if (url.port === '0') return `${name} must not use port 0`;
  if (!allowPrivate) {
    // The parser has already turned 2130706433, 0x7f.1 and [::ffff:127.0.0.1] into canonical addresses.
    const host = url.hostname.replace(/^\[|\]$/g, '').replace(/\.$/, '');
    if ((isIP(host) && isPrivateAddress(host)) || host === 'localhost' || host.endsWith('.localhost')) {
      return `${name} must not point at a loopback, private or link-local address (this server was started without --webhook-allow-private)`;
    }
  }
  return undefined;
}

/**
 * `raw` as logged: scheme://host[:port]/ and, when there is more, `(hidden:<hash>)`, the first 8
 * hex digits of the SHA-256 of the path and query. Receivers keep their token in the path
 * (Slack's `/services/T…/B…/<secret>`, Discord's `/api/webhooks/<id>/<token>`) or the query, and
 * userinfo would be a password: none of it is ever logged, while the hash still tells two URLs
 * to one host apart.
 */
export function webhookUrlForLog(raw: string): string {
  try {
    const u = new URL(raw);
    const rest = u.pathname + u.search;
    return `${u.protocol}//${u.host}/${rest === '/' ? '' : `(hidden:${createHash('sha256').update(rest).digest('hex').slice(0, 8)})`}`;
  } catch {
    return '(not a URL)';
  }
}

/**
 * A try failed for a reason no later try can change (the address refused by this server's
 * policy): the delivery gives up at once.
 */
class FinalFailure extends Error {}

/** One delivery: a job's final status body, sent until a 2xx or its tries run out. */
interface Delivery {
  readonly url: string;
  /** The URL as logged (webhookUrlForLog). */
  readonly target: string;
  readonly jobId: string;
  /** Its destination (see maxInFlightPerHost). */
  readonly dest: string;
  /** Order of send(): turns go by it, so a try due again goes ahead of later jobs' webhooks. */
  readonly seq: number;
  attempt: number;
  state: 'waiting' | 'flight' | 'delay';
  /** Its next try, while one is waiting (state delay). */
  timer: NodeJS.Timeout | undefined;
  /** The job began a new run (/retry): this status is no longer final, so no more tries. */
  superseded: boolean;
}

/** A destination's tries in flight, and its deliveries waiting their turn (by seq). */
interface Destination {
  inFlight: number;
  readonly waiting: Delivery[];
}

export class WebhookSender {
  readonly #o: WebhookOptions;
  /** Deliveries not yet over, per job (a /retry's run can finish while the first one's retries). */
  readonly #live = new Map<string, Set<Delivery>>();
  /** Destinations with a try in flight or a delivery waiting. */
  readonly #dests = new Map<string, Destination>();
  #inFlight = 0;
  #seq = 0;
  #closed = false;

  constructor(options: WebhookOptions) {
    this.#o = options;
  }

  /**
   * Delivers `jobId`'s webhook. `render`, when given, builds the first try's body from what the
   * caller holds; it is called at once if the try can start now, else dropped (the body is built
   * from `bodyOf` when the delivery's turn comes). `tried` is the tries an owed webhook made
   * before a restart (onTried): the delivery goes on at the next one, and one that made them all
   * is settled without a POST.
   */
  send(url: string, jobId: string, render?: () => string, tried = 0): void {
    if (this.#closed) return;
    if (tried >= this.#o.attempts) {
      this.#o.log.warn('webhook gave up', { jobId, url: webhookUrlForLog(url), attempts: tried, reason: 'its tries were made before the restart' });
      this.#o.onSettled?.(jobId);
      return;
    }
    let dest: string;
    try {
      const u = new URL(url);
      dest = `${u.protocol}//${u.host}`;
    } catch {
      dest = url; // #post fails it
    }
    const d: Delivery = { url, target: webhookUrlForLog(url), jobId, dest, seq: this.#seq++, attempt: tried + 1, state: 'waiting', timer: undefined, superseded: false };
    let set = this.#live.get(jobId);
    if (!set) this.#live.set(jobId, (set = new Set()));
    set.add(d);
    this.#startOrWait(d, render);
  }

  /**
   * Starts a try now when its destination has a slot, else queues it. Nothing startable ever
   * waits (#pump runs whenever a slot frees), so a try that can start now jumps no queue.
   */
  #startOrWait(d: Delivery, render?: () => string): void {
    if (this.#free(d.dest)) this.#start(d, render);
    else this.#enqueue(d);
  }

  /**
   * `jobId` began a new run (/retry): the deliveries of its earlier final status make no more
   * tries, so a receiver never gets that status after the new run's. A try in flight ends as
   * it will (a 2xx or not, it is the last); one waiting its turn is dropped.
   */
  supersede(jobId: string): void {
    for (const d of this.#live.get(jobId) ?? []) {
      d.superseded = true;
      if (d.state === 'delay') {
        clearTimeout(d.timer);
        d.timer = undefined;
        this.#settle(d);
      } else if (d.state === 'waiting') {
        const dest = this.#dests.get(d.dest);
        const i = dest ? dest.waiting.indexOf(d) : -1;
        if (dest && i >= 0) dest.waiting.splice(i, 1);
        if (dest) this.#dropIfIdle(d.dest, dest);
        this.#settle(d);
      }
    }
  }

  #dest(key: string): Destination {
    let dest = this.#dests.get(key);
    if (!dest) this.#dests.set(key, (dest = { inFlight: 0, waiting: [] }));
    return dest;
  }

  #dropIfIdle(key: string, dest: Destination): void {
    if (dest.inFlight === 0 && dest.waiting.length === 0) this.#dests.delete(key);
  }

  #free(key: string): boolean {
    return this.#inFlight < this.#o.maxInFlight && (this.#dests.get(key)?.inFlight ?? 0) < this.#o.maxInFlightPerHost;
  }

  /** Waits its turn, in seq order among its destination's (a try due again is older than most). */
  #enqueue(d: Delivery): void {
    d.state = 'waiting';
    const waiting = this.#dest(d.dest).waiting;
    let i = waiting.length;
    while (i > 0 && (waiting[i - 1] as Delivery).seq > d.seq) i--;
    waiting.splice(i, 0, d);
  }

  /** Starts the oldest waiting deliveries whose destination has a slot, while there is one. */
  #pump(): void {
    while (!this.#closed && this.#inFlight < this.#o.maxInFlight) {
      let next: Destination | undefined;
      for (const dest of this.#dests.values()) {
        const head = dest.waiting[0];
        if (head && dest.inFlight < this.#o.maxInFlightPerHost && (!next || head.seq < (next.waiting[0] as Delivery).seq)) next = dest;
      }
      if (!next) return;
      this.#start(next.waiting.shift() as Delivery);
    }
  }

  #start(d: Delivery, render?: () => string): void {
    let body: string | undefined;
    let failed: Error | undefined;
    try {
      body = render ? render() : this.#o.bodyOf(d.jobId);
    } catch (err) {
      failed = err as Error;
    }
    if (body === undefined) {
      const dest = this.#dests.get(d.dest);
      if (dest) this.#dropIfIdle(d.dest, dest);
      // The store could not be read: a failed try, so its next one reads it again.
      if (failed) this.#again(d, failed.message);
      // Gone, or no longer final: nothing to send.
      else this.#settle(d);
      return;
    }
    d.state = 'flight';
    this.#inFlight++;
    this.#dest(d.dest).inFlight++;
    const startedAt = performance.now();
    this.#post(d.url, body).then(
      (status) => {
        this.#tryEnded(d);
        // A redirect is not followed, and the receiver answers the same URL alike next time.
        if (status >= 300 && status < 400) this.#again(d, `status ${status}, a redirect, which is not followed`, true);
        else if (status < 200 || status >= 300) this.#again(d, `status ${status}`);
        else {
          // Debug only: one line per delivered webhook (the failures are info and warn).
          this.#o.log.debug('webhook delivered', { jobId: d.jobId, url: d.target, status, attempt: d.attempt, ms: Math.round(performance.now() - startedAt) });
          this.#settle(d);
        }
        this.#pump();
      },
      (err: Error) => {
        this.#tryEnded(d);
        this.#again(d, err.message, err instanceof FinalFailure);
        this.#pump();
      },
    );
  }

  /** Frees a try's slot (a try that failed before it posted held none). */
  #tryEnded(d: Delivery): void {
    if (d.state !== 'flight') return;
    d.state = 'delay';
    const dest = this.#dests.get(d.dest);
    if (!dest || dest.inFlight === 0) return; // closed meanwhile
    this.#inFlight--;
    dest.inFlight--;
    this.#dropIfIdle(d.dest, dest);
  }

  #settle(d: Delivery): void {
    const set = this.#live.get(d.jobId);
    set?.delete(d);
    if (set?.size === 0) this.#live.delete(d.jobId);
    // Closed: still owed, so the next start sends it again.
    if (!this.#closed) this.#o.onSettled?.(d.jobId);
  }

  /** After a failed try: the next one, or the end. `final`: no try could change the outcome. */
  #again(d: Delivery, why: string, final = false): void {
    if (this.#closed) return;
    if (d.superseded) {
      this.#settle(d);
      return;
    }
    if (final || d.attempt >= this.#o.attempts) {
      this.#o.log.warn('webhook gave up', { jobId: d.jobId, url: d.target, attempts: d.attempt, reason: final ? `${why}: no other try can change that` : why });
      this.#settle(d);
      return;
    }
    this.#o.onTried?.(d.jobId, d.attempt);
    this.#o.log.info('webhook try failed, trying again', {
      jobId: d.jobId, url: d.target, attempt: d.attempt, attempts: this.#o.attempts, retryInMs: this.#o.retryDelayMs, reason: why,
    });
    d.state = 'delay';
    d.timer = setTimeout(() => {
      d.timer = undefined;
      d.attempt++;
      this.#startOrWait(d);
    }, this.#o.retryDelayMs);
  }

  async #post(raw: string, body: string): Promise<number> {
    const url = new URL(raw);
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const { address, family } = isIP(host) ? { address: host, family: isIP(host) } : await lookup(host);
    if (!this.#o.allowPrivate && isPrivateAddress(address)) {
      throw new FinalFailure(`refused private address ${address} (this server was started without --webhook-allow-private)`);
    }
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

  /** Tries in flight end as they will, unrecorded; deliveries waiting or due again stay owed. */
  close(): void {
    this.#closed = true;
    for (const set of this.#live.values()) for (const d of set) clearTimeout(d.timer);
    this.#live.clear();
    this.#dests.clear();
    this.#inFlight = 0;
  }
}
