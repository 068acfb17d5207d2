/**
 * Command encoding (spec, "Command encoding"): unit tests of shellSplit, parseArgs, encodeArgs and
 * applyCommand, then the five rules over HTTP on create and PATCH.
 */
import t from 'tap';
import { applyCommand, CommandError, encodeArgs, parseArgs, shellSplit } from '../../src/endpoints/index.js';
import { queueBody, startAgent } from '../helpers/agent.js';
import { assertErrorAt, createEndpoint, makeTemplate, mustCreate } from '../helpers/expect.js';

t.test('shellSplit: quotes and escapes, no expansion', async (t) => {
  const cases: [string, string[]][] = [
    ['python app.py', ['python', 'app.py']],
    ['  python   -u\tapp.py \n', ['python', '-u', 'app.py']],
    ["a 'b c' d", ['a', 'b c', 'd']],
    ['a "b c" d', ['a', 'b c', 'd']],
    ['a "b \\" c"', ['a', 'b " c']],
    ['a "x\\\\y"', ['a', 'x\\y']],
    ['a "x\\ny"', ['a', 'x\\ny']],
    ["a 'b \\ c'", ['a', 'b \\ c']],
    ['a\\ b c', ['a b', 'c']],
    ['""', ['']],
    ["''", ['']],
    ['a "" b', ['a', '', 'b']],
    ['a""b', ['ab']],
    [`it'"s"'  ok`, ['it"s"', 'ok']],
    ['echo "$HOME" `id`', ['echo', '$HOME', '`id`']],
    ['bash -c "echo hi && sleep 1"', ['bash', '-c', 'echo hi && sleep 1']],
    ['', []],
    ['   ', []],
  ];
  for (const [input, want] of cases) {
    t.same(shellSplit(input), want, JSON.stringify(input));
  }
  for (const bad of ['a "b', "a 'b", 'a \\']) {
    t.throws(() => shellSplit(bad), CommandError, `${JSON.stringify(bad)} is refused`);
  }
});

t.test('parseArgs: a shell string is CMD; a JSON object sets entrypoint and/or cmd', async (t) => {
  t.same(parseArgs(''), { entrypoint: null, cmd: null });
  t.same(parseArgs('  '), { entrypoint: null, cmd: null });
  t.same(parseArgs('python -u handler.py'), { entrypoint: null, cmd: ['python', '-u', 'handler.py'] });
  t.same(parseArgs('{"entrypoint": ["python", "-u"], "cmd": ["handler.py"]}'), { entrypoint: ['python', '-u'], cmd: ['handler.py'] });
  t.same(parseArgs('{"cmd": ["serve", "--port", "80"]}'), { entrypoint: null, cmd: ['serve', '--port', '80'] });
  t.same(parseArgs('{"entrypoint": ["/start.sh"]}'), { entrypoint: ['/start.sh'], cmd: null });
  t.same(parseArgs(' {"entrypoint": [], "cmd": []} '), { entrypoint: null, cmd: null }, 'empty arrays are "not set"');
  t.same(parseArgs('{"cmd": ["a b", "c\\"d"]}'), { entrypoint: null, cmd: ['a b', 'c"d'] }, 'JSON items are taken verbatim, not split');
  t.throws(() => parseArgs('["echo", "hi"]'), /args is a JSON array.*use \{"entrypoint": \[\.\.\.\], "cmd": \[\.\.\.\]\}/, 'a JSON array (Docker exec form) is refused with a hint, not split into ["[echo,hi]"]');
  t.throws(() => parseArgs(' [1, 2] '), CommandError, 'any JSON array');
  t.throws(() => parseArgs('[]'), CommandError, 'an empty one too');
  t.same(parseArgs('[ -f /x ] && python h.py'), { entrypoint: null, cmd: ['[', '-f', '/x', ']', '&&', 'python', 'h.py'] }, 'a shell string that starts with "[" is still a shell string');
  t.same(parseArgs('[[ -n "$A" ]]'), { entrypoint: null, cmd: ['[[', '-n', '$A', ']]'] });
  t.same(parseArgs('[echo,hi]'), { entrypoint: null, cmd: ['[echo,hi]'] }, 'not JSON: a shell word');
  for (const bad of ['{"cmd": ["a"]', '{"foo": ["a"]}', '{"cmd": "a"}', '{"cmd": [1]}', '{"entrypoint": [null]}', '{"cmd": ["a"], "env": {}}']) {
    t.throws(() => parseArgs(bad), CommandError, `${bad} is refused`);
  }
  t.throws(() => parseArgs('{"cmd": ["a"]'), /not valid JSON/);
  t.throws(() => parseArgs('{"entry": []}'), /"entry"/, 'the message names the stray key');
});

t.test('encodeArgs', async (t) => {
  t.equal(encodeArgs({ entrypoint: null, cmd: null }), '');
  t.equal(encodeArgs({ entrypoint: [], cmd: [] }), '');
  t.equal(encodeArgs({ entrypoint: ['python'], cmd: ['a.py'] }), '{"entrypoint":["python"],"cmd":["a.py"]}');
  t.equal(encodeArgs({ entrypoint: null, cmd: ['a b'] }), '{"cmd":["a b"]}');
  for (const c of [{ entrypoint: ['x', 'y z'], cmd: null }, { entrypoint: ['p'], cmd: ['q', '"r"'] }]) {
    t.same(parseArgs(encodeArgs(c)), c, 'parseArgs(encodeArgs(c)) round-trips');
  }
});

t.test('applyCommand', async (t) => {
  const none = { args: '', entrypoint: [], cmd: [] };
  const bare = { args: 'python app.py', entrypoint: [], cmd: ['python', 'app.py'] };
  t.same(applyCommand(none, { args: 'python app.py' }), bare, 'rule 1: a bare string becomes cmd');
  t.same(applyCommand(none, { args: '{"entrypoint":["python"],"cmd":["a.py"]}' }), { args: '{"entrypoint":["python"],"cmd":["a.py"]}', entrypoint: ['python'], cmd: ['a.py'] }, 'rule 1: JSON sets both');
  t.same(applyCommand(none, { args: ' python  app.py ' }).args, ' python  app.py ', 'rule 2: args kept as stored');
  t.same(applyCommand(none, { args: 'python app.py', cmd: ['python', 'app.py'] }), bare, 'rule 3: same cmd beside args');
  t.same(applyCommand(none, { args: 'python app.py', cmd: ['python', 'app.py'], entrypoint: [] }), bare, 'rule 3: an empty entrypoint agrees with a bare string');
  t.same(applyCommand(none, { args: '{"entrypoint":["python"],"cmd":["a.py"]}', entrypoint: ['python'], cmd: ['a.py'] }).entrypoint, ['python']);
  const cmdErr = t.throws(() => applyCommand(none, { args: 'python app.py', cmd: ['python', 'other.py'] })) as CommandError;
  t.equal(cmdErr.field, 'cmd', 'rule 3: a different cmd is refused and blamed on cmd');
  const epErr = t.throws(() => applyCommand(none, { args: 'python app.py', entrypoint: ['python'] })) as CommandError;
  t.equal(epErr.field, 'entrypoint', 'a bare string has no entrypoint: one beside it is a different command');
  t.throws(() => applyCommand(none, { args: '{"entrypoint":["python"],"cmd":["a.py"]}', cmd: ['python', 'a.py'] }), CommandError, 'the split must match, not only the joined words');
  t.equal(applyCommand(bare, {}), bare, 'rule 5: omitted leaves unchanged');
  t.same(applyCommand(bare, { args: '' }), none, 'rule 5: "" clears');
  t.same(applyCommand(bare, { args: '   ' }), none, 'white space clears too');
  t.same(applyCommand(bare, { cmd: [] }), none, 'rule 5: cmd [] clears cmd');
  const both = { args: '{"entrypoint":["python"],"cmd":["a.py"]}', entrypoint: ['python'], cmd: ['a.py'] };
  t.same(applyCommand(both, { entrypoint: [] }), { args: '{"cmd":["a.py"]}', entrypoint: [], cmd: ['a.py'] }, 'entrypoint [] clears only the entrypoint');
  t.same(applyCommand(both, { cmd: ['b.py'] }), { args: '{"entrypoint":["python"],"cmd":["b.py"]}', entrypoint: ['python'], cmd: ['b.py'] }, 'cmd alone keeps the entrypoint');
  t.same(applyCommand(bare, { entrypoint: ['/init'] }), { args: '{"entrypoint":["/init"],"cmd":["python","app.py"]}', entrypoint: ['/init'], cmd: ['python', 'app.py'] });
});

t.test('the five rules over HTTP on create', async (t) => {
  const a = await startAgent(t);
  const bare = await mustCreate(t, a, queueBody({ args: 'python -u "my handler.py" --flag' }));
  t.equal(bare.args, 'python -u "my handler.py" --flag', 'args as stored');
  t.same(bare.cmd, ['python', '-u', 'my handler.py', '--flag'], 'a bare args string becomes cmd');
  t.same(bare.entrypoint, []);

  const json = '{"entrypoint": ["python", "-u"], "cmd": ["handler.py"]}';
  const j = await mustCreate(t, a, queueBody({ args: json }));
  t.equal(j.args, json, 'the JSON string is stored as sent');
  t.same([j.entrypoint, j.cmd], [['python', '-u'], ['handler.py']], 'a JSON object sets entrypoint and cmd');
  const onlyEp = await mustCreate(t, a, queueBody({ args: '{"entrypoint": ["/start.sh"]}' }));
  t.same([onlyEp.entrypoint, onlyEp.cmd], [['/start.sh'], []], 'or only one of them');

  const same = await mustCreate(t, a, queueBody({ args: 'python app.py', cmd: ['python', 'app.py'] }));
  t.same([same.args, same.cmd], ['python app.py', ['python', 'app.py']], 'args with the same cmd is allowed');
  t.equal((await createEndpoint(a, queueBody({ args: json, entrypoint: ['python', '-u'], cmd: ['handler.py'] }))).status, 201, 'args with the same entrypoint and cmd');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: 'python app.py', cmd: ['python', 'main.py'] })), 400, '/cmd', 'args with another cmd');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: json, entrypoint: ['bash'] })), 400, '/entrypoint', 'args with another entrypoint');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: 'python app.py', entrypoint: ['python'], cmd: ['app.py'] })), 400, '/entrypoint', 'a bare string sets no entrypoint');

  const arrays = await mustCreate(t, a, queueBody({ entrypoint: ['python'], cmd: ['a.py', '--x'] }));
  t.same([arrays.entrypoint, arrays.cmd], [['python'], ['a.py', '--x']], 'arrays without args');
  t.same(parseArgs(arrays.args), { entrypoint: ['python'], cmd: ['a.py', '--x'] }, 'args is their stored encoding');
  const cmdOnly = await mustCreate(t, a, queueBody({ cmd: ['serve'] }));
  t.same([cmdOnly.entrypoint, cmdOnly.cmd], [[], ['serve']]);

  assertErrorAt(t, await createEndpoint(a, queueBody({ args: 'python "app.py' })), 400, '/args', 'unterminated quote');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: '{"cmd": ["a"]' })), 400, '/args', 'broken JSON object');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: '{"command": ["a"]}' })), 400, '/args', 'JSON object with other keys');
  assertErrorAt(t, await createEndpoint(a, queueBody({ cmd: 'python app.py' })), 400, '/cmd', 'cmd must be an array');
  assertErrorAt(t, await createEndpoint(a, queueBody({ entrypoint: [1] })), 400, '/entrypoint/0', 'entrypoint items are strings');
  assertErrorAt(t, await createEndpoint(a, queueBody({ args: ['python'] })), 400, '/args', 'args is a string');
  const exec = await createEndpoint(a, queueBody({ args: '["echo","hi"]' }));
  assertErrorAt(t, exec, 400, '/args', 'a JSON array in args (Docker exec form)');
  t.match(exec.json?.errors?.[0], /^\/args: args is a JSON array .*\{"entrypoint": \[\.\.\.\], "cmd": \[\.\.\.\]\}/, `the error says what to send: ${exec.text.slice(0, 400)}`);
  const test = await mustCreate(t, a, queueBody({ args: '[ -f /x ] && python h.py' }));
  t.same(test.cmd, ['[', '-f', '/x', ']', '&&', 'python', 'h.py'], 'a shell string starting with "[" still works');
});

t.test('the command on PATCH: "" and [] clear, omitted leaves unchanged', async (t) => {
  const a = await startAgent(t);
  const json = '{"entrypoint":["python"],"cmd":["a.py"]}';
  const e = await mustCreate(t, a, queueBody({ args: json }));
  const patch = (body: unknown) => a.req('PATCH', `/v2/serverless/${e.id}`, { body });

  const renamed = await patch({ name: 'renamed' });
  t.same([renamed.json.args, renamed.json.entrypoint, renamed.json.cmd], [json, ['python'], ['a.py']], 'omitted: unchanged');

  const noCmd = await patch({ cmd: [] });
  t.equal(noCmd.status, 200);
  t.same([noCmd.json.entrypoint, noCmd.json.cmd], [['python'], []], 'cmd [] clears cmd, keeps entrypoint');
  t.same(parseArgs(noCmd.json.args), { entrypoint: ['python'], cmd: null }, 'args follows');

  const newCmd = await patch({ cmd: ['b.py', '--v'] });
  t.same([newCmd.json.entrypoint, newCmd.json.cmd], [['python'], ['b.py', '--v']], 'cmd alone replaces cmd only');

  const noEp = await patch({ entrypoint: [] });
  t.same([noEp.json.entrypoint, noEp.json.cmd], [[], ['b.py', '--v']], 'entrypoint [] clears entrypoint, keeps cmd');

  const bare = await patch({ args: 'node server.js' });
  t.same([bare.json.args, bare.json.entrypoint, bare.json.cmd], ['node server.js', [], ['node', 'server.js']], 'args replaces the whole command');

  const cleared = await patch({ args: '' });
  t.same([cleared.json.args, cleared.json.entrypoint, cleared.json.cmd], ['', [], []], 'args "" clears everything');
  t.same((await a.req('GET', `/v2/serverless/${e.id}`)).json.cmd, [], 'stored');

  assertErrorAt(t, await patch({ args: 'python a.py', cmd: ['python', 'b.py'] }), 400, '/cmd', 'PATCH args with another cmd');
  assertErrorAt(t, await patch({ args: '{"cmd": [' }), 400, '/args');
  t.equal((await patch({ args: 'python a.py', cmd: ['python', 'a.py'] })).status, 200, 'PATCH args with the same cmd');
  t.same((await a.req('GET', `/v2/serverless/${e.id}`)).json.cmd, ['python', 'a.py'], 'a refused PATCH changed nothing before it');
});

t.test('a PATCH whose command parses the same (other whitespace, the JSON form of it) is no restart reason and replaces no worker', async (t) => {
  const a = await startAgent(t);
  const e = await mustCreate(t, a, queueBody({ args: 'python3 -u stream_handler.py' }));
  const reasons: string[][] = [];
  a.agent.endpoints.on({ changed: (_id, _spec, r) => void reasons.push([...r]) });
  const patch = async (body: unknown) => (await a.req('PATCH', `/v2/serverless/${e.id}`, { body })).json;

  const spaced = await patch({ args: '  python3  -u\tstream_handler.py ' });
  t.same([spaced.restartRequired, spaced.restartReasons], [false, []], 'other whitespace: no restart reason');
  t.equal(spaced.args, '  python3  -u\tstream_handler.py ', 'the args string is stored as sent');
  t.same([spaced.entrypoint, spaced.cmd], [[], ['python3', '-u', 'stream_handler.py']], 'the command is the same');
  const json = await patch({ args: '{"cmd": ["python3", "-u", "stream_handler.py"]}' });
  t.same(json.restartReasons, [], 'the JSON form of the same command: no restart reason');
  const arrays = await patch({ cmd: ['python3', '-u', 'stream_handler.py'] });
  t.same(arrays.restartReasons, [], 'cmd as an array, the same command: none either');
  t.same(reasons.filter((r) => r.length > 0), [], 'the autoscaler was told of no restart reason, so it replaces no worker');
  t.notOk(a.logs.some((l) => /endpoint updated.*restartReasons=args/.test(l)), 'no restart reason in the log');

  t.same((await patch({ args: 'python3 -u "stream_handler.py  "' })).restartReasons, ['args'], 'whitespace inside quotes changes the command: a restart');
  t.same((await patch({ args: '{"entrypoint": ["python3"], "cmd": ["-u", "stream_handler.py"]}' })).restartReasons, ['args'], 'the same words split otherwise between entrypoint and cmd: a restart');
});

t.test("runpod-python's local-test flags (--test_input, --rp_serve_api) in a QUEUE endpoint's command are refused on create and PATCH", async (t) => {
  const a = await startAgent(t);
  const refused = async (r: Awaited<ReturnType<typeof createEndpoint>>, pointer: string, flag: string, what: string) => {
    assertErrorAt(t, r, 400, pointer, what);
    const e = (r.json?.errors as string[] | undefined)?.find((x) => x.startsWith(`${pointer}:`)) ?? '';
    t.match(e, flag, `${what}: the error names the flag`);
    t.match(e, /drop it/, `${what}: the error says what to do`);
    t.match(e, /locally/, `${what}: and where the flag belongs`);
  };
  await refused(await createEndpoint(a, queueBody({ args: `python -u handler.py --test_input '{"input": {"x": 1}}'` })), '/args', '--test_input', 'args with --test_input');
  await refused(await createEndpoint(a, queueBody({ args: 'python handler.py --rp_serve_api --rp_api_port 8000' })), '/args', '--rp_serve_api', 'args with --rp_serve_api');
  await refused(await createEndpoint(a, queueBody({ args: '{"cmd": ["handler.py", "--test_input={\\"input\\": {}}"]}' })), '/args', '--test_input', '--test_input=<json> in the JSON form');
  await refused(await createEndpoint(a, queueBody({ cmd: ['python', 'handler.py', '--rp_serve_api'] })), '/cmd/2', '--rp_serve_api', 'cmd as an array: the item is named');
  await refused(await createEndpoint(a, queueBody({ entrypoint: ['python', 'handler.py', '--test_input', '{}'] })), '/entrypoint/2', '--test_input', 'entrypoint');
  await refused(await createEndpoint(a, queueBody({ args: 'bash -c "pip install x && python handler.py --rp_serve_api"' })), '/args', '--rp_serve_api', 'inside a bash -c script');
  await refused(await createEndpoint(a, queueBody({ args: 'python handler.py --rp_serve' })), '/args', '--rp_serve_api', 'an abbreviation argparse takes for it');

  const ok = await mustCreate(t, a, queueBody({ args: 'python -u handler.py --rp_log_level INFO --rp_debugger' }));
  t.same(ok.cmd, ['python', '-u', 'handler.py', '--rp_log_level', 'INFO', '--rp_debugger'], '--rp_log_level and --rp_debugger are harmless: allowed');
  t.equal((await createEndpoint(a, queueBody({ args: 'python handler.py --test --rp_serve_api_docs' }))).status, 201, 'other flags that only look alike are allowed');
  const lb = await createEndpoint(a, queueBody({ type: 'LOAD_BALANCER', scaling: { type: 'REQUEST_COUNT', requestCount: 2 }, args: 'python app.py --rp_serve_api' }));
  t.equal(lb.status, 201, 'a LOAD_BALANCER endpoint takes no job from a queue: not refused');

  const tpl = await makeTemplate(t, a, { name: 'serve', args: 'python handler.py --rp_serve_api' });
  const { image: _image, ...viaTemplate } = queueBody({ templateId: tpl.id });
  await refused(await createEndpoint(a, viaTemplate), '/templateId', '--rp_serve_api', "a QUEUE endpoint from a template whose command has the flag");
  t.equal((await createEndpoint(a, { ...viaTemplate, args: 'python handler.py' })).status, 201, 'the body overriding the template command is fine');

  const patch = (body: unknown) => a.req('PATCH', `/v2/serverless/${ok.id}`, { body });
  await refused(await patch({ args: 'python handler.py --test_input "{}"' }), '/args', '--test_input', 'PATCH args');
  await refused(await patch({ cmd: ['python', 'handler.py', '--rp_serve_api'] }), '/cmd/2', '--rp_serve_api', 'PATCH cmd');
  t.same((await a.req('GET', `/v2/serverless/${ok.id}`)).json.cmd, ok.cmd, 'a refused PATCH changed nothing');
  t.equal((await patch({ name: 'renamed' })).status, 200, 'a PATCH that does not touch the command is not refused');

  const badTpl = await a.req('POST', '/v2/templates', { body: { name: 't2', image: 'registry.local/tpl:1', isServerless: true, args: 'python handler.py --test_input \'{"input": {}}\'' } });
  await refused(badTpl, '/args', '--test_input', 'a serverless template with --test_input (it exits on any endpoint)');
  const tplPatch = await a.req('PATCH', `/v2/templates/${tpl.id}`, { body: { args: 'python handler.py --test_input "{}"' } });
  await refused(tplPatch, '/args', '--test_input', 'PATCH of a template');
});
