/**
 * Webhooks: the final status body is POSTed to the job's `webhook` URL, with 2 more tries
 * 10 s apart (RunPod's documented behaviour). Addresses are resolved, checked and pinned
 * before connecting, so a name that resolves to a private or loopback address is refused
 * unless the operator allowed private targets (`--webhook-allow-private`).
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
  timeoutMs: number;
  log: Logger;
}

/** True for loopback, private, link-local, CGNAT, unspecified and similar ranges. */
export function isPrivateAddress(address: string): boolean {
  let ip = address.toLowerCase();
  if (ip.startsWith('::ffff:')) ip = ip.slice(7);
  if (isIP(ip) === 4) {
    const [a = 0, b = 0] = ip.split('.').map(Number);
    return a === 10 || a === 127 || a === 0 || (a === 169 && b === 254) || (a === 172 && b >= 16 && b <= 31) ||
      (a === 192 && b === 168) || (a === 100 && b >= 64 && b <= 127) || a >= 224;
  }
  return ip === '::1' || ip === '::' || ip.startsWith('fc') || ip.startsWith('fd') || ip.startsWith('fe80');
}

export function checkWebhookUrl(raw: string): string | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return 'webhook must be an absolute http(s) URL';
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return 'webhook must use http or https';
  if (url.username || url.password) return 'webhook must not carry credentials in the URL';
  return undefined;
}

export class WebhookSender {
  readonly #o: WebhookOptions;
  readonly #timers = new Set<NodeJS.Timeout>();
  #closed = false;

  constructor(options: WebhookOptions) {
    this.#o = options;
  }

  send(url: string, body: string, jobId: string, attempt = 1): void {
    if (this.#closed) return;
    this.#post(url, body).then(
      (status) => {
        if (status >= 200 && status < 300) return;
        this.#again(url, body, jobId, attempt, `status ${status}`);
      },
      (err: Error) => this.#again(url, body, jobId, attempt, err.message),
    );
  }

  #again(url: string, body: string, jobId: string, attempt: number, why: string): void {
    if (attempt >= this.#o.attempts || this.#closed) {
      this.#o.log.warn('webhook gave up', { jobId, attempts: attempt, reason: why });
      return;
    }
    const t = setTimeout(() => {
      this.#timers.delete(t);
      this.send(url, body, jobId, attempt + 1);
    }, this.#o.retryDelayMs);
    this.#timers.add(t);
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
          // Pin the connection to the address that was checked (no DNS rebinding).
          lookup: (_h, _o, cb) => (cb as (e: null, a: string, f: number) => void)(null, address, family),
          timeout: this.#o.timeoutMs,
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.on('error', reject);
      req.end(body);
    });
  }

  close(): void {
    this.#closed = true;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
  }
}
