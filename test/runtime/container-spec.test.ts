/**
 * The worker container's create body (safe defaults, env, resources, mounts), the FlashBoot
 * pool's policy, and the small codecs of the Docker client, as tables; then the same create
 * body on a real engine, checked through `GET /containers/{id}/json` and from inside.
 */
import t from 'tap';
import {
  DockerClient, KeptPool, LABELS, SAFE_LIMITS, VOLUME_PATH, createBody, demultiplexer, exposedPorts, gpuAttachFor, ownerOf, registryAuthHeader,
  splitImageRef, volumeName, type KeptPoolOptions, type LaunchSpec,
} from '../../src/runtime/index.js';

const GIB = 1024 ** 3;

function spec(extra: Partial<LaunchSpec> = {}): LaunchSpec {
  return {
    endpointId: 'ep0000000000001', workerId: 'wkr_spec000000000000001', entrypoint: [], cmd: [], image: 'localhost/worker:1',
    env: { GREETING: 'hi', RUNPOD_POD_ID: 'wkr_spec000000000000001' }, ports: [], diskGb: null, volume: null, gpuDeviceIds: [],
    cpu: { vcpuCount: 2, memoryGb: 4 }, registryAuth: null, flashboot: 'OFF', configHash: 'c0ffee', ...extra,
  };
}

const envOf = (lines: readonly string[]): Record<string, string> =>
  Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));

t.test('safe defaults on every worker container', async (t) => {
  for (const s of [spec(), spec({ cpu: null, gpuDeviceIds: ['GPU-1'] }), spec({ volume: { kind: 'network', id: 'nv_x' }, diskGb: 20 })]) {
    const hc = createBody(s, { instanceId: 'i1', diskLimit: true }).HostConfig;
    t.equal(hc.Privileged, false, 'never privileged');
    t.same(hc.CapDrop, ['ALL'], 'every capability dropped');
    t.same(hc.CapAdd, [], 'none added back');
    t.same(hc.SecurityOpt, ['no-new-privileges:true']);
    t.equal(hc.PidsLimit, SAFE_LIMITS.pidsLimit);
    t.equal(hc.NetworkMode, 'bridge', 'never the host network');
    t.equal(hc.IpcMode, 'private');
    t.same(hc.RestartPolicy, { Name: 'no' }, 'flashd supervises, not the engine');
    t.same(hc.LogConfig, { Type: 'json-file', Config: { 'max-size': '10m', 'max-file': '3' } }, 'engine log size bounded');
    t.equal(hc.Binds, undefined, 'no bind mounts');
    t.equal(hc.Devices, undefined, 'no raw devices');
    t.equal(hc.PublishAllPorts, false);
    t.equal(hc.Init, true, 'an init process as PID 1 (signals, zombies)');
    for (const m of hc.Mounts ?? []) t.equal(m.Type, 'volume', 'only volume mounts');
    t.notMatch(JSON.stringify(hc), /docker\.sock|podman\.sock|\/proc|\/sys\b/, 'no engine socket or host paths');
  }
});

t.test('env: user NVIDIA_* dropped; GPU workers get their device list, CPU workers none', async (t) => {
  const userEnv = { NVIDIA_VISIBLE_DEVICES: 'all', NVIDIA_DRIVER_CAPABILITIES: 'all', nvidia_require_cuda: 'cuda>=9', KEEP: 'a=b c' };
  const cpu = envOf(createBody(spec({ env: userEnv }), { instanceId: 'i', diskLimit: false }).Env);
  const host = { RUNPOD_POD_HOSTNAME: 'wkr-spec000000000000001', VENDOR_POD_HOSTNAME: 'wkr-spec000000000000001' };
  t.same(cpu, { KEEP: 'a=b c', ...host, NVIDIA_VISIBLE_DEVICES: 'void' }, 'CPU: only KEEP survives; no GPU even when the image says all');
  const gpu = createBody(spec({ env: userEnv, cpu: null, gpuDeviceIds: ['GPU-aaa', 'GPU-bbb'] }), { instanceId: 'i', diskLimit: false });
  t.same(envOf(gpu.Env), { KEEP: 'a=b c', ...host, NVIDIA_VISIBLE_DEVICES: 'GPU-aaa,GPU-bbb', NVIDIA_DRIVER_CAPABILITIES: 'compute,utility' });
  t.same(gpu.HostConfig.DeviceRequests, [{ Driver: 'nvidia', DeviceIDs: ['GPU-aaa', 'GPU-bbb'], Capabilities: [['gpu']] }]);
  t.equal(gpu.HostConfig.NanoCpus, undefined, 'a GPU worker has no CPU quota');
  t.equal(gpu.HostConfig.ShmSize, SAFE_LIMITS.gpuShmBytes);
  t.equal(createBody(spec(), { instanceId: 'i', diskLimit: false }).HostConfig.DeviceRequests, undefined, 'CPU: no device request');
});

t.test("the container's hostname comes from its worker id, and its env says it (RUNPOD_POD_HOSTNAME), unless the endpoint's env sets that", async (t) => {
  // Without it the SDK's error reports said "hostname": "unknown"; the engine's default
  // hostname (the container id's first 12 characters) is not known before the create.
  const body = createBody(spec(), { instanceId: 'i', diskLimit: false });
  t.equal(body.Hostname, 'wkr-spec000000000000001', 'a valid host name: no underscore');
  t.match(envOf(body.Env), { RUNPOD_POD_HOSTNAME: body.Hostname, VENDOR_POD_HOSTNAME: body.Hostname });
  const theirs = envOf(createBody(spec({ env: { RUNPOD_POD_HOSTNAME: 'gpu-box-7' } }), { instanceId: 'i', diskLimit: false }).Env);
  t.equal(theirs['RUNPOD_POD_HOSTNAME'], 'gpu-box-7');
  t.equal(theirs['VENDOR_POD_HOSTNAME'], undefined, "not set beside theirs: the SDK would read it first");
  t.equal(createBody(spec({ workerId: `wkr_${'X'.repeat(58)}_Y` }), { instanceId: 'i', diskLimit: false }).Hostname, `wkr-${'x'.repeat(58)}`,
    'at most 63 characters, lower case, not ending in a hyphen');
});

t.test('GPUs: the nvidia device driver on Docker, CDI by UUID on Podman 5.4+, none on an older Podman', async (t) => {
  const gpu = spec({ cpu: null, gpuDeviceIds: ['GPU-0c0897e4-f928-b148-fe48-db553d9a9976'] });
  t.same(createBody(gpu, { instanceId: 'i', diskLimit: false, gpuDriver: 'cdi' }).HostConfig.DeviceRequests,
    [{ Driver: 'cdi', DeviceIDs: ['nvidia.com/gpu=GPU-0c0897e4-f928-b148-fe48-db553d9a9976'] }], 'the name nvidia-ctk gives a GPU by UUID');
  t.same(envOf(createBody(gpu, { instanceId: 'i', diskLimit: false, gpuDriver: 'cdi' }).Env)['NVIDIA_VISIBLE_DEVICES'], 'GPU-0c0897e4-f928-b148-fe48-db553d9a9976');
  const cases: [string, string, 'auto' | 'nvidia' | 'cdi', 'nvidia' | 'cdi' | null][] = [
    ['Docker Engine', '27.3.1', 'auto', 'nvidia'],
    ['Docker Engine', '27.3.1', 'nvidia', 'nvidia'],
    ['Docker Engine', '28.2.0', 'cdi', 'cdi'],
    ['Podman Engine', '5.4.0', 'auto', 'cdi'],
    ['Podman Engine', '5.10.2', 'nvidia', 'cdi'],
    ['Podman Engine', '6.0.0', 'auto', 'cdi'],
    ['Podman Engine', '5.3.2', 'auto', null],
    ['Podman Engine', '4.3.1', 'cdi', null],
    ['Podman Engine', 'dev', 'auto', null],
  ];
  for (const [name, version, setting, driver] of cases) {
    const a = gpuAttachFor({ name, version }, setting);
    t.equal(a.driver, driver, `${name} ${version}, --container-gpu-driver ${setting}`);
    if (driver === null) t.match(a.reason, new RegExp(`^podman ${version} cannot give a container a GPU through its Docker API \\(CDI device requests need podman 5\\.4 or later\\)`));
  }
});

t.test('resources, disk, volume, ports, command, labels', async (t) => {
  const hc = createBody(spec({ cpu: { vcpuCount: 3, memoryGb: 6 } }), { instanceId: 'i', diskLimit: true }).HostConfig;
  t.equal(hc.NanoCpus, 3e9, 'NanoCpus = vcpuCount * 1e9');
  t.equal(hc.Memory, 6 * GIB, 'Memory = memoryGb GiB');
  t.equal(hc.MemorySwap, 6 * GIB, 'no swap beyond the limit');
  t.equal(hc.ShmSize, 1 * GIB, 'shm bounded');
  t.equal(createBody(spec({ cpu: { vcpuCount: 2, memoryGb: 1 } }), { instanceId: 'i', diskLimit: true }).HostConfig.ShmSize, GIB / 2, 'shm at most half the memory');
  t.equal(hc.StorageOpt, undefined, 'no disk size: no StorageOpt');
  t.same(createBody(spec({ diskGb: 25 }), { instanceId: 'i', diskLimit: true }).HostConfig.StorageOpt, { size: '25G' });
  t.equal(createBody(spec({ diskGb: 25 }), { instanceId: 'i', diskLimit: false }).HostConfig.StorageOpt, undefined, 'left out where the engine cannot');
  t.equal(createBody(spec(), { instanceId: 'i', diskLimit: false, init: false }).HostConfig.Init, undefined, 'no init where the engine has none');
  t.same(createBody(spec({ volume: { kind: 'global', id: 'gv_abc' } }), { instanceId: 'i', diskLimit: false }).HostConfig.Mounts,
    [{ Type: 'volume', Source: 'flashd-volume-gv_abc', Target: '/vendor-volume' }]);
  t.equal(volumeName('nv_1'), 'flashd-volume-nv_1');
  t.equal(VOLUME_PATH, '/vendor-volume');
  t.same(exposedPorts(['8000/http', '22/tcp', '53/udp', 'junk', '9000/HTTP']), { '8000/tcp': {}, '22/tcp': {}, '53/udp': {}, '9000/tcp': {} });

  const keep = createBody(spec(), { instanceId: 'i', diskLimit: false });
  t.notOk('Entrypoint' in keep || 'Cmd' in keep || 'ExposedPorts' in keep, "empty entrypoint/cmd keep the image's own");
  const set = createBody(spec({ entrypoint: ['python3', '-u'], cmd: ['h.py', 'two words'], ports: ['8000/http'] }), { instanceId: 'i', diskLimit: false });
  t.same([set.Entrypoint, set.Cmd, set.ExposedPorts], [['python3', '-u'], ['h.py', 'two words'], { '8000/tcp': {} }]);
  t.same(keep.Labels, {
    [LABELS.managed]: 'true', [LABELS.instance]: 'i', [LABELS.endpoint]: 'ep0000000000001', [LABELS.worker]: 'wkr_spec000000000000001',
    [LABELS.configHash]: 'c0ffee', [LABELS.flashboot]: 'OFF',
  });
  // The owner labels: which flashd process made it (a copy of its data directory shares the instance).
  const owner = { host: 'm1/pid:[4026531836]', pid: 4242, start: 'boot-1/123456' };
  const owned = createBody(spec(), { instanceId: 'i', diskLimit: false, owner }).Labels;
  t.same([owned[LABELS.ownerHost], owned[LABELS.ownerPid], owned[LABELS.ownerStart]], ['m1/pid:[4026531836]', '4242', 'boot-1/123456']);
  t.same(ownerOf(owned), owner, 'read back');
  t.equal(ownerOf(keep.Labels), null, 'none on a container of an older flashd');
  t.equal(ownerOf({ ...owned, [LABELS.ownerPid]: 'x' }), null, 'nor with a pid that is no number');
  const secret = createBody(spec({ registryAuth: { username: 'u', password: 'pa55-w0rd-xyz', serveraddress: 'r.example' } }), { instanceId: 'i', diskLimit: true });
  t.notMatch(JSON.stringify(secret), /pa55-w0rd-xyz/, 'registry credentials never reach the create body');
});

t.test('FlashBoot pool policy', async (t) => {
  const opts: KeptPoolOptions = { policies: { FLASHBOOT: { maxPerEndpoint: 2, ttlMs: 1000 }, PRIORITY_FLASHBOOT: { maxPerEndpoint: 3, ttlMs: 5000 } }, maxTotal: 4 };
  const pool = new KeptPool<string>(opts);
  const add = (w: string, ep: string, mode: 'FLASHBOOT' | 'PRIORITY_FLASHBOOT', at: number, hash = 'h') =>
    pool.add({ workerId: w, endpointId: ep, configHash: hash, mode, keptAt: at, value: w });
  t.same(add('a1', 'A', 'FLASHBOOT', 1), { kept: true, evicted: [] });
  t.equal(add('a2', 'A', 'FLASHBOOT', 2).evicted.length, 0);
  t.same(add('a3', 'A', 'FLASHBOOT', 3).evicted.map((e) => e.workerId), ['a1'], 'over the endpoint limit: its oldest goes');
  add('b1', 'B', 'PRIORITY_FLASHBOOT', 4);
  add('b2', 'B', 'PRIORITY_FLASHBOOT', 5);
  t.same(pool.list().map((e) => e.workerId), ['a2', 'a3', 'b1', 'b2'], 'oldest first');
  t.same(add('b3', 'B', 'PRIORITY_FLASHBOOT', 6).evicted.map((e) => e.workerId), ['a2'], 'over the total: the oldest FLASHBOOT goes before PRIORITY');
  t.same(add('b4', 'B', 'PRIORITY_FLASHBOOT', 7).evicted.map((e) => e.workerId).sort(), ['b1'], 'PRIORITY_FLASHBOOT endpoint at its own limit');
  t.same(pool.list().map((e) => e.workerId), ['a3', 'b2', 'b3', 'b4']);
  t.same(add('c1', 'C', 'FLASHBOOT', 8).evicted.map((e) => e.workerId), ['a3'], 'a FLASHBOOT newcomer displaces an older FLASHBOOT one');
  t.same(add('d1', 'D', 'FLASHBOOT', 9).evicted.map((e) => e.workerId), ['c1']);
  t.equal(pool.list().find((e) => e.workerId === 'd1')?.expiresAt, 9 + 1000, 'expires after its mode\'s ttl');
  t.same(add('d2', 'D', 'FLASHBOOT', 10, 'other').evicted.map((e) => e.workerId), ['d1'], 'only PRIORITY ones besides: the older FLASHBOOT one goes');

  const p2 = new KeptPool<string>({ ...opts, maxTotal: 2 });
  p2.add({ workerId: 'x', endpointId: 'X', configHash: 'h', mode: 'PRIORITY_FLASHBOOT', keptAt: 1, value: 'x' });
  p2.add({ workerId: 'y', endpointId: 'Y', configHash: 'h', mode: 'PRIORITY_FLASHBOOT', keptAt: 2, value: 'y' });
  t.same(p2.add({ workerId: 'z', endpointId: 'Z', configHash: 'h', mode: 'FLASHBOOT', keptAt: 3, value: 'z' }), { kept: false, evicted: [] },
    'a FLASHBOOT container is not kept when only PRIORITY ones could make room');

  const p3 = new KeptPool<string>(opts);
  p3.add({ workerId: 'old', endpointId: 'E', configHash: 'h1', mode: 'PRIORITY_FLASHBOOT', keptAt: 1, value: '' });
  p3.add({ workerId: 'new', endpointId: 'E', configHash: 'h1', mode: 'PRIORITY_FLASHBOOT', keptAt: 2, value: '' });
  p3.add({ workerId: 'stale', endpointId: 'E', configHash: 'h0', mode: 'PRIORITY_FLASHBOOT', keptAt: 3, value: '' });
  t.equal(p3.peek('E', 'h1')?.workerId, 'new', 'peek names what take would hit');
  t.equal(p3.peek('E', 'h9'), undefined);
  t.equal(p3.list().length, 3, 'peek removes nothing');
  const took = p3.take('E', 'h1');
  t.equal(took.hit?.workerId, 'new', 'the most recently kept container with the same config hash');
  t.same(took.stale.map((e) => e.workerId), ['stale'], 'another hash can never be used again');
  t.same(p3.list().map((e) => e.workerId), ['old']);
  t.equal(p3.take('E', 'h9').hit, undefined);
  t.same(p3.list(), [], 'a miss still drops the stale ones');
  t.equal(p3.remove('nope'), undefined);
  t.same(new KeptPool({ ...opts, maxTotal: 0 }).add({ workerId: 'q', endpointId: 'Q', configHash: 'h', mode: 'FLASHBOOT', keptAt: 1, value: '' }), { kept: false, evicted: [] });
});

t.test('client codecs: stream frames, image references, X-Registry-Auth', async (t) => {
  const frames: [string, string][] = [];
  const d = demultiplexer((s, p) => frames.push([s, p.toString()]));
  const frame = (kind: number, text: string) => Buffer.concat([Buffer.from([kind, 0, 0, 0]), Buffer.alloc(4), Buffer.from(text)]).fill(0, 4, 8);
  const withSize = (b: Buffer, n: number) => (b.writeUInt32BE(n, 4), b);
  const all = Buffer.concat([withSize(frame(1, 'out\n'), 4), withSize(frame(2, 'err line'), 8), withSize(frame(1, ''), 0)]);
  for (let i = 0; i < all.length; i += 3) d.push(all.subarray(i, i + 3));
  t.same(frames, [['stdout', 'out\n'], ['stderr', 'err line']], 'frames split across chunks are put back together');

  t.same(splitImageRef('python'), { fromImage: 'python', tag: 'latest' }, 'no tag: latest, never every tag');
  t.same(splitImageRef('localhost:5000/team/img'), { fromImage: 'localhost:5000/team/img', tag: 'latest' }, 'a registry port is not a tag');
  t.same(splitImageRef('ghcr.io/o/img:v1.2'), { fromImage: 'ghcr.io/o/img', tag: 'v1.2' });
  t.same(splitImageRef('img@sha256:abc'), { fromImage: 'img@sha256:abc', tag: undefined });

  const header = registryAuthHeader({ username: 'u?', password: 'p>>~', serveraddress: 'r.io' });
  t.match(header, /^[A-Za-z0-9_-]+=*$/, 'base64url alphabet');
  t.equal(header.length % 4, 0, 'padded, as Go decodes it');
  t.same(JSON.parse(Buffer.from(header, 'base64url').toString()), { username: 'u?', password: 'p>>~', serveraddress: 'r.io' });
});

const SOCKET = process.env['FLASHD_TEST_CONTAINER_SOCKET'];
const IMAGE = process.env['FLASHD_TEST_WORKER_IMAGE'];

t.test('the same body on a real engine: GET /containers/{id}/json and a look from inside', { skip: SOCKET && IMAGE ? false : 'needs FLASHD_TEST_CONTAINER_SOCKET and FLASHD_TEST_WORKER_IMAGE (set by .ci/run)' }, async (t) => {
  const docker = new DockerClient({ socketPath: SOCKET as string });
  t.teardown(() => docker.close());
  await docker.negotiate();
  const vol = `nv_spec${process.pid}`;
  await docker.createVolume(volumeName(vol), { [LABELS.managed]: 'true' });
  const s = spec({
    image: IMAGE as string, workerId: `wkr_spec${process.pid}`, volume: { kind: 'network', id: vol },
    env: { NVIDIA_VISIBLE_DEVICES: 'all', NVIDIA_DRIVER_CAPABILITIES: 'all', SHOWN: 'yes' }, cpu: { vcpuCount: 1, memoryGb: 1 },
    entrypoint: ['python3', '-c'],
    cmd: ['import json,os;st=dict(l.split(":",1) for l in open("/proc/self/status"));print(json.dumps({"host":__import__("socket").gethostname(),"cap":st["CapEff"].strip(),"nnp":st["NoNewPrivs"].strip(),"env":dict(os.environ),"vol":os.path.ismount("/vendor-volume")}))'],
  });
  const { Id } = await docker.createContainer(createBody(s, { instanceId: `spec-test-${process.pid}`, diskLimit: false }), `flashd-spec-${process.pid}`);
  t.teardown(async () => {
    await docker.removeContainer(Id, { force: true, volumes: true }).catch(() => undefined);
    await docker.removeVolume(volumeName(vol), { force: true });
  });
  const i = await docker.inspectContainer(Id);
  const hc = i.HostConfig;
  t.equal(hc.Privileged, false);
  t.ok(hc.CapDrop?.includes('ALL') || (hc.CapDrop?.length ?? 0) >= 10, `capabilities dropped: ${JSON.stringify(hc.CapDrop)}`);
  t.same(hc.CapAdd ?? [], []);
  t.ok(hc.SecurityOpt?.some((o) => /^no-new-privileges(:true)?$/.test(o)), `no-new-privileges: ${JSON.stringify(hc.SecurityOpt)}`);
  t.equal(hc.PidsLimit, SAFE_LIMITS.pidsLimit);
  t.equal(hc.NanoCpus, 1e9);
  t.equal(hc.Memory, GIB);
  t.equal(hc.RestartPolicy?.Name, 'no');
  t.equal(hc.Init, true, 'an init process');
  t.not(hc.NetworkMode, 'host');
  t.same(hc.DeviceRequests ?? [], []);
  // Podman lists named volumes under Binds (`name:/path:opts`); a host path would start with '/'.
  for (const b of hc.Binds ?? []) t.notMatch(b, /^\//, `no host path bound: ${b}`);
  t.same((i.Mounts ?? []).map((m) => [m.Type, m.Name, m.Destination]), [['volume', volumeName(vol), '/vendor-volume']], 'the one mount is the volume');
  const env = envOf(i.Config.Env ?? []);
  t.equal(env['NVIDIA_VISIBLE_DEVICES'], 'void', 'the user\'s NVIDIA_VISIBLE_DEVICES=all is gone');
  t.equal(env['NVIDIA_DRIVER_CAPABILITIES'], undefined);
  t.equal(env['SHOWN'], 'yes');
  t.equal(i.Config.Labels?.[LABELS.worker], s.workerId);

  const lines: string[] = [];
  const attached = await docker.attach(Id, (_s, p) => lines.push(p.toString()));
  await docker.startContainer(Id);
  t.equal((await docker.wait(Id)).StatusCode, 0, 'the container ran');
  await attached.ended;
  const inside = JSON.parse(lines.join('')) as { host: string; cap: string; nnp: string; env: Record<string, string>; vol: boolean };
  t.equal(inside.host, `wkr-spec${process.pid}`, "the container's hostname");
  t.equal(inside.env['RUNPOD_POD_HOSTNAME'], inside.host, 'is what its env says');
  t.equal(BigInt(`0x${inside.cap}`), 0n, 'no effective capabilities inside');
  t.equal(inside.nnp, '1', 'no_new_privs set inside');
  t.equal(inside.vol, true, '/vendor-volume is a mount inside');
  t.equal(inside.env['NVIDIA_VISIBLE_DEVICES'], 'void');
});
