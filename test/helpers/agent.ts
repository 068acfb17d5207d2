/**
 * Starts a real flashd (createAgent) on 127.0.0.1 port 0 with its SQLite file in a test data
 * directory (testDataDir), and closes it on teardown, before that directory is removed.
 * Requests go over real HTTP with fetch.
 */
import type { Test } from 'tap';
import Database from 'better-sqlite3';
import { join } from 'node:path';
import { createAgent, type Agent } from '../../src/app.js';
import { loadConfig, type FlashdConfig } from '../../src/config/index.js';
import type { Clock } from '../../src/core/clock.js';
import { testDataDir } from './data-dir.js';

export const ADMIN_KEY = 'test-admin-key-0123456789abcdef';

export interface Reply {
  status: number;
  headers: Headers;
  text: string;
  json: any;
}

export interface TestAgent {
  agent: Agent;
  url: string;
  dir: string;
  logs: string[];
  /** JSON request with the admin key unless `key` is given (null: no Authorization). */
  req(method: string, path: string, options?: { body?: unknown; key?: string | null; headers?: Record<string, string>; raw?: string }): Promise<Reply>;
}

export async function startAgent(
  t: Test,
  overrides: Partial<FlashdConfig> = {},
  options: { clock?: Clock; dir?: string } = {},
): Promise<TestAgent> {
  const dir = options.dir ?? testDataDir(t);
  const config = loadConfig({
    // runtime none unless a test asks: the default (auto) would pick up any engine socket on the machine.
    overrides: { host: '127.0.0.1', port: 0, dataDir: dir, logLevel: 'info', adminApiKey: ADMIN_KEY, runtime: 'none', ...overrides },
  });
  const logs: string[] = [];
  const agent = await createAgent({
    config,
    ...(options.clock ? { clock: options.clock } : {}),
    logSink: { write: (line) => void logs.push(line) },
    announce: (text) => void logs.push(text),
  });
  t.teardown(() => agent.close());
  const url = agent.url;
  return {
    agent, url, dir, logs,
    async req(method, path, o = {}) {
      const headers: Record<string, string> = { ...o.headers };
      const key = o.key === undefined ? ADMIN_KEY : o.key;
      if (key !== null) headers['authorization'] ??= `Bearer ${key}`;
      let body: string | undefined = o.raw;
      if (o.body !== undefined) {
        body = JSON.stringify(o.body);
        headers['content-type'] ??= 'application/json';
      }
      const res = await fetch(url + path, { method, headers, ...(body !== undefined ? { body } : {}) });
      const text = await res.text();
      let json: unknown;
      try {
        json = text ? JSON.parse(text) : undefined;
      } catch {
        json = undefined;
      }
      return { status: res.status, headers: res.headers, text, json };
    },
  };
}

/** Asserts an RFC 9457 problem body with the given status. */
export function assertProblem(t: Test, r: Reply, status: number, message?: string): void {
  t.equal(r.status, status, message ?? `status ${status}: ${r.text.slice(0, 300)}`);
  t.match(r.headers.get('content-type') ?? '', /^application\/problem\+json/, 'problem+json content type');
  t.equal(r.json?.status, status, 'body.status');
  t.type(r.json?.title, 'string', 'body.title');
  t.type(r.json?.detail, 'string', 'body.detail');
  const errors: unknown = r.json?.errors;
  t.ok(Array.isArray(errors) && errors.every((e) => typeof e === 'string'), `body.errors is a list of strings: ${JSON.stringify(errors)}`);
  t.notMatch(r.text, /\n\s+at /, 'no stack trace in the body');
}

/** A minimal valid create body. */
export function queueBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name: 'ep',
    type: 'QUEUE',
    scaling: { type: 'QUEUE_DELAY', queueDelay: 4 },
    image: 'registry.local/worker:1',
    gpu: { pools: ['ADA_24'] },
    ...extra,
  };
}

export function cpuBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const { gpu: _gpu, ...rest } = queueBody();
  return { ...rest, cpu: [{ id: 'cpu3c', vcpuCount: 2 }], ...extra };
}

/**
 * Writes `rows` queued jobs (`seeded-00000000`, … with input `{"n":1}`) straight into the
 * stopped server's database in `dir`, for tests of a backlog recovered at start (the /run path
 * is not under test). `endpointOf(i)` names each job's endpoint.
 */
export function seedQueued(dir: string, rows: number, endpointOf: (i: number) => string): void {
  const db = new Database(join(dir, 'flashd.db'));
  const insert = db.prepare(`INSERT INTO jobs (id, endpoint_id, status, input, execution_timeout_ms, ttl_ms, retention_ms, created_at, queued_at)
    VALUES (?, ?, 'IN_QUEUE', '{"n":1}', 600000, 86400000000, 86400000, ?, ?)`);
  const now = Date.now();
  db.transaction(() => {
    for (let i = 0; i < rows; i++) insert.run(`seeded-${String(i).padStart(8, '0')}`, endpointOf(i), now, now);
  })();
  db.close();
}
