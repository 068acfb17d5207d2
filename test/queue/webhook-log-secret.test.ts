/**
 * A webhook URL's path and query are never written to flashd's log: Slack
 * (`/services/T…/B…/<secret>`) and Discord (`/api/webhooks/<id>/<token>`) keep their secret in
 * the path, others in the query. Runs flashd as its own process and reads all it printed while
 * a delivery to a failing receiver was tried, retried and given up.
 */
import { createServer } from 'node:http';
import t, { type Test } from 'tap';
import { ADMIN_KEY, cpuBody } from '../helpers/agent.js';
import { testDataDir } from '../helpers/data-dir.js';
import { cleanEnv, startFlashd } from '../helpers/spawn-flashd.js';
import { until } from '../helpers/wait.js';
import { webhookUrlForLog } from '../../src/queue/webhook.js';

/**
 * A receiver answering try N with `answer(N)`, a flashd process at debug level that may send it
 * webhooks, and a job with a webhook to `pathAndQuery` on it, cancelled so the webhook is owed.
 */
async function cancelledJobWithWebhook(t: Test, pathAndQuery: string, answer: (tryNo: number) => number) {
  let tries = 0;
  const receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      tries++;
      res.writeHead(answer(tries), { connection: 'close' }).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => {
    receiver.closeAllConnections();
    receiver.close(() => resolve());
  }));
  const port = (receiver.address() as { port: number }).port;
  const hook = `http://127.0.0.1:${port}${pathAndQuery}`;

  const flashd = await startFlashd(t, process.execPath, [
    'dist/flashd.mjs', '--port', '0', '--data-dir', testDataDir(t), '--runtime', 'none', '--log-level', 'debug',
    '--webhook-allow-private', '--webhook-retry-delay-ms', '50',
  ], cleanEnv({ FLASHD_ADMIN_API_KEY: ADMIN_KEY }));
  t.teardown(() => flashd.stop());
  const call = async (method: string, path: string, body?: unknown) => {
    const r = await fetch(flashd.url + path, {
      method, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}),
    });
    return r.json() as Promise<any>;
  };
  const ep = (await call('POST', '/v2/serverless', cpuBody({ workers: { min: 0, max: 0 } }))).id as string;
  const job = (await call('POST', `/v2/${ep}/run`, { input: {}, webhook: hook })).id as string;
  t.equal((await call('POST', `/v2/${ep}/cancel/${job}`)).status, 'CANCELLED');
  return { flashd, port, hook, job, tries: () => tries };
}

t.test('a webhook whose path and query hold tokens: flashd logs neither, through every try', async (t) => {
  const { flashd, port, hook, tries } = await cancelledJobWithWebhook(t, '/services/T000/B000/PATHSECRET9f3k?token=QUERYSECRET7x2q', () => 500);
  await until('the webhook to be given up', async () => flashd.stderr().includes('webhook gave up'), 20_000);
  t.equal(tries(), 3, 'the receiver got every try');

  const printed = flashd.stdout() + flashd.stderr();
  t.match(printed, 'webhook try failed, trying again', 'the failed tries are logged');
  t.notOk(printed.includes('PATHSECRET9f3k'), 'the path token is never logged');
  t.notOk(printed.includes('QUERYSECRET7x2q'), 'the query token is never logged');
  t.notOk(printed.includes('/services/'), 'nor any of the path');
  t.match(printed, `url=${webhookUrlForLog(hook)}`, 'the destination is logged as scheme, host and port, the rest as a hash');
  t.match(printed, `url=http://127.0.0.1:${port}/`, 'which names the receiver');
});

t.test('a delivered webhook is logged at debug level: job, hidden URL, status, attempt, time taken', async (t) => {
  // The first try gets a 500, the second a 204.
  const { flashd, hook, job, tries } = await cancelledJobWithWebhook(t, '/api/webhooks/123/PATHSECRET4h8w?token=QUERYSECRET1m5z', (n) => (n === 1 ? 500 : 204));
  const line = await until('the delivery logged', async () => flashd.stderr().split('\n').find((l) => l.includes('webhook delivered')), 20_000);
  t.equal(tries(), 2, 'delivered at the second try');
  t.match(line, /^\S+ debug \[webhook\] webhook delivered /, line);
  t.ok(line.includes(` jobId=${job} `), 'names the job');
  t.ok(line.includes(` url=${webhookUrlForLog(hook)} `), 'and the receiver, as the other webhook lines do');
  t.match(line, / status=204 attempt=2 ms=\d+$/, 'with the status, the try and how long it took');
  const printed = flashd.stdout() + flashd.stderr();
  t.notOk(printed.includes('PATHSECRET4h8w') || printed.includes('QUERYSECRET1m5z') || printed.includes('/api/webhooks'), 'no path or query is logged');
});

t.test('webhookUrlForLog: scheme, host and port, then a short hash of the rest, never its text', async (t) => {
  const slack = 'https://hooks.slack.com/services/T000/B000/XXXXSECRET';
  const logged = webhookUrlForLog(slack);
  t.match(logged, /^https:\/\/hooks\.slack\.com\/\(hidden:[0-9a-f]{8}\)$/, logged);
  t.notOk(logged.includes('XXXXSECRET'));
  t.equal(webhookUrlForLog(slack), logged, 'the same URL logs the same');
  t.not(webhookUrlForLog('https://hooks.slack.com/services/T000/B000/OTHER'), logged, 'another path logs differently');
  t.not(webhookUrlForLog(`${slack}?a=1`), logged, 'and so does another query');
  t.equal(webhookUrlForLog('https://discord.com:8443/'), 'https://discord.com:8443/', 'no path, no hash');
  t.notOk(webhookUrlForLog('https://example.com/?token=s3cret').includes('s3cret'), 'a query alone is hidden too');
  t.equal(webhookUrlForLog('not a url'), '(not a URL)');
});
