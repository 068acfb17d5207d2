import t from 'tap';
import { ADMIN_KEY, assertProblem, cpuBody, startAgent } from '../helpers/agent.js';

t.test('endpoint logs: tail, since, follow, and gone with the endpoint', async (t) => {
  const a = await startAgent(t);
  const ep = (await a.req('POST', '/v2/serverless', { body: cpuBody() })).json.id as string;
  for (let i = 0; i < 5; i++) a.agent.logs.append(ep, 'wkr_a', 'stdout', `line ${i}`);
  await new Promise((r) => setImmediate(r));
  const tail = (await a.req('GET', `/v2/serverless/${ep}/logs?limit=2`)).json;
  t.same(tail.map((l: { line: string }) => l.line), ['line 3', 'line 4'], 'the newest lines, oldest first');
  t.match(tail[0], { workerId: 'wkr_a', stream: 'stdout', at: /^\d{4}-/ });
  const since = (await a.req('GET', `/v2/serverless/${ep}/logs?since=${tail[0].seq}`)).json;
  t.same(since.map((l: { line: string }) => l.line), ['line 4']);
  assertProblem(t, await a.req('GET', `/v2/serverless/${ep}/logs?limit=0`), 400);

  const res = await fetch(`${a.url}/v2/serverless/${ep}/logs?follow=true&limit=1`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /ndjson/);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const readUntil = async (pred: (s: string) => boolean) => {
    while (!pred(text)) {
      const { value, done } = await reader.read();
      if (done) return true;
      text += decoder.decode(value, { stream: true });
    }
    return false;
  };
  await readUntil((s) => s.includes('line 4'));
  a.agent.logs.append(ep, 'wkr_b', 'stderr', 'fresh line');
  await readUntil((s) => s.includes('fresh line'));
  const lines = text.trim().split('\n').map((l) => JSON.parse(l));
  t.same(lines.map((l) => l.line), ['line 4', 'fresh line'], 'the backlog, then new lines as they come');
  t.equal(lines[1].stream, 'stderr');
  t.equal((await a.req('DELETE', `/v2/serverless/${ep}`)).status, 204);
  t.equal(await readUntil(() => false), true, 'the stream ends when the endpoint is deleted');
  assertProblem(t, await a.req('GET', `/v2/serverless/${ep}/logs`), 404);
});
