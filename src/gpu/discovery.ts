/**
 * GPU discovery through `nvidia-smi` (the one adapter to NVIDIA's tools). Two calls, run together:
 *   - `--query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader,nounits`
 *     gives one CSV row per GPU;
 *   - `nvidia-smi` without arguments prints the summary table whose header carries
 *     `CUDA Version: X.Y`, the highest CUDA version the driver supports (not a `--query-gpu` field).
 * `-q -x` would give both in one call, but its output is hundreds of kilobytes on an 8-GPU host and
 * needs an XML parser; the two small outputs carry everything placement needs.
 * "No GPU" (binary missing, driver not loaded, no devices, a hang) is an empty result with a
 * reason, never a throw.
 */
import { execFile } from 'node:child_process';
import { OTHER_POOL, gpuTypeForName } from '../catalog/index.js';
import type { Logger } from '../core/logger.js';
import type { DiscoveredGpu, GpuDiscovery, NoGpuReason } from './types.js';

export const QUERY_GPU_ARGS: readonly string[] = [
  '--query-gpu=index,uuid,name,memory.total,driver_version',
  '--format=csv,noheader,nounits',
];

export interface DiscoverGpusOptions {
  /** Binary to run, looked up on `PATH` from `env`. @defaultValue `"nvidia-smi"` */
  command?: string;
  /** Environment of the child (its `PATH` finds the binary). @defaultValue `process.env` */
  env?: NodeJS.ProcessEnv;
  /** Per-call limit; nvidia-smi can hang on a wedged driver. @defaultValue `10000` */
  timeoutMs?: number;
  log?: Logger;
  /**
   * A run of {@link GpuWatch} after the one at start: the lines every run would repeat
   * (`gpus discovered`, `no gpus found`) go to debug, as the watch logs what changed.
   */
  again?: boolean;
}

/** One CSV row of the `--query-gpu` call. */
export interface QueryGpuRow {
  index: number;
  uuid: string;
  name: string;
  memoryMiB: number | null;
  driverVersion: string | null;
}

interface RunResult {
  ok: boolean;
  stdout: string;
  stderr: string;
  /** Exit code, or the spawn error code (`ENOENT`), or `TIMEOUT`. */
  code: number | string | null;
}

function run(command: string, args: readonly string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<RunResult> {
  return new Promise((resolve) => {
    execFile(command, [...args], { env, timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 8 * 1024 * 1024, windowsHide: true }, (err, stdout, stderr) => {
      if (!err) return resolve({ ok: true, stdout, stderr, code: 0 });
      const e = err as NodeJS.ErrnoException & { killed?: boolean; code?: number | string };
      const code = e.killed ? 'TIMEOUT' : (e.code ?? null);
      resolve({ ok: false, stdout: String(stdout ?? ''), stderr: String(stderr ?? ''), code });
    });
  });
}

const NA = /^\[?(N\/A|Not Supported|Unknown Error|Insufficient Permissions)\]?$/i;

function optional(value: string | undefined): string | null {
  const v = value?.trim() ?? '';
  return v === '' || NA.test(v) ? null : v;
}

/**
 * Parses the `csv,noheader,nounits` rows of {@link QUERY_GPU_ARGS}. A name may itself hold a
 * comma, so the row is split from both ends: index and uuid first, memory and driver last.
 * Rows that do not have that shape are skipped.
 */
export function parseQueryGpuCsv(text: string): QueryGpuRow[] {
  const rows: QueryGpuRow[] = [];
  for (const line of text.split(/\r?\n/)) {
    if (line.trim() === '') continue;
    const cells = line.split(',');
    if (cells.length < 5) continue;
    const index = Number(cells[0]?.trim());
    const uuid = cells[1]?.trim() ?? '';
    const driver = cells[cells.length - 1];
    const memory = optional(cells[cells.length - 2]);
    const name = cells.slice(2, cells.length - 2).join(',').trim();
    if (!Number.isInteger(index) || index < 0 || !/^(GPU|MIG)-[0-9A-Za-z-]+$/.test(uuid) || name === '') continue;
    const mib = memory === null ? null : Number(memory);
    rows.push({ index, uuid, name, memoryMiB: mib !== null && Number.isFinite(mib) ? mib : null, driverVersion: optional(driver) });
  }
  return rows;
}

/** Driver and CUDA versions from the summary table's header (`CUDA Version: N/A` gives null). */
export function parseSmiHeader(text: string): { driverVersion: string | null; cudaVersion: string | null } {
  const driver = /Driver Version:\s*([0-9][0-9.]*)/.exec(text);
  const cuda = /CUDA Version:\s*([0-9]+\.[0-9]+)/.exec(text);
  return { driverVersion: driver?.[1] ?? null, cudaVersion: cuda?.[1] ?? null };
}

function firstLine(text: string): string | null {
  return text.split(/\r?\n/).map((l) => l.trim()).find((l) => l !== '') ?? null;
}

/** Reason and detail for a failed call, from its error code and what it printed. */
function classify(result: RunResult): { reason: NoGpuReason; detail: string | null } {
  const printed = `${result.stdout}\n${result.stderr}`;
  if (result.code === 'ENOENT') return { reason: 'nvidia-smi-not-found', detail: 'nvidia-smi is not on PATH' };
  if (result.code === 'EACCES') return { reason: 'nvidia-smi-failed', detail: 'nvidia-smi is not executable' };
  if (result.code === 'TIMEOUT') return { reason: 'timeout', detail: 'nvidia-smi did not answer in time' };
  // nvidia-smi(1): exit 9 "NVIDIA driver is not loaded", 6 "A query to find an object was unsuccessful".
  if (result.code === 9 || /couldn.t communicate with the NVIDIA driver|driver is not loaded/i.test(printed)) {
    return { reason: 'driver-not-loaded', detail: firstLine(printed) };
  }
  if (result.code === 6 || /No devices were found/i.test(printed)) return { reason: 'no-devices', detail: firstLine(printed) };
  return { reason: 'nvidia-smi-failed', detail: firstLine(printed) ?? `exit ${String(result.code)}` };
}

function empty(reason: NoGpuReason, detail: string | null): GpuDiscovery {
  return { gpus: [], driverVersion: null, cudaVersion: null, noGpuReason: reason, detail };
}

/** Runs nvidia-smi and returns the host's GPUs mapped onto the catalog. Never throws. */
export async function discoverGpus(options: DiscoverGpusOptions = {}): Promise<GpuDiscovery> {
  const command = options.command ?? 'nvidia-smi';
  const env = options.env ?? process.env;
  const timeoutMs = options.timeoutMs ?? 10_000;
  const [query, summary] = await Promise.all([run(command, QUERY_GPU_ARGS, env, timeoutMs), run(command, [], env, timeoutMs)]);

  if (!query.ok) {
    const { reason, detail } = classify(query);
    // No NVIDIA tools or no device is what a CPU-only host says; a driver that did not load, a
    // hang or a failure is a GPU host in trouble, which `--log-level warn` must still show.
    if (options.again) options.log?.debug('no gpus found', { reason, detail });
    else if (reason === 'nvidia-smi-not-found' || reason === 'no-devices') options.log?.info('no gpus found', { reason, detail });
    else options.log?.warn('no gpus found', { reason, detail });
    return empty(reason, detail);
  }
  const rows = parseQueryGpuCsv(query.stdout);
  if (rows.length === 0) {
    const detail = firstLine(query.stdout);
    const reason: NoGpuReason = detail === null || /No devices were found/i.test(detail) ? 'no-devices' : 'unparseable-output';
    if (options.again) options.log?.debug('no gpus found', { reason, detail });
    else options.log?.warn('no gpus found', { reason, detail });
    return empty(reason, detail);
  }

  const header = summary.ok ? parseSmiHeader(summary.stdout) : { driverVersion: null, cudaVersion: null };
  if (header.cudaVersion === null) {
    options.log?.warn('gpu cuda version unknown', { detail: summary.ok ? 'no "CUDA Version:" in the summary' : classify(summary).detail });
  }
  const driverVersion = rows.find((r) => r.driverVersion !== null)?.driverVersion ?? header.driverVersion;
  const gpus: DiscoveredGpu[] = rows.map((r) => {
    const type = gpuTypeForName(r.name);
    return {
      index: r.index,
      uuid: r.uuid,
      name: r.name,
      gpuTypeId: type?.id ?? null,
      pool: type?.pool ?? null,
      memoryMiB: r.memoryMiB,
      driverVersion: r.driverVersion ?? driverVersion,
      cudaVersion: header.cudaVersion,
    };
  });
  // Neither is in a RunPod pool: endpoints reach them through flashd's pool OTHER.
  for (const g of gpus.filter((x) => x.gpuTypeId === null)) options.log?.info('gpu model not in the catalog', { name: g.name, uuid: g.uuid, pool: OTHER_POOL });
  for (const g of gpus.filter((x) => x.gpuTypeId !== null && x.pool === null)) options.log?.info('gpu type in no serverless pool', { name: g.name, uuid: g.uuid, pool: OTHER_POOL });
  const fields = { count: gpus.length, driverVersion, cudaVersion: header.cudaVersion };
  if (options.again) options.log?.debug('gpus discovered', fields);
  else options.log?.info('gpus discovered', fields);
  return { gpus, driverVersion, cudaVersion: header.cudaVersion, noGpuReason: null, detail: null };
}
