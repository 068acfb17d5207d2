/**
 * Composition root: `createAgent(config)` builds every component with explicit arguments, in
 * order, and `close()` takes them down in reverse. No module-level state. Tests use it too.
 */
import { randomBytes } from 'node:crypto';
import { lstatSync } from 'node:fs';
import { join, resolve } from 'node:path';
import pkg from '../package.json' with { type: 'json' };
import { createApi, jobRoutes, workerRoutes, type Api, type WorkerKeyMistake } from './api/index.js';
import { AuthService, JobRateLimiter, RateLimiter } from './auth/index.js';
import type { FlashdConfig } from './config/index.js';
import { systemClock, type Clock } from './core/clock.js';
import { createLogger, type LogSink, type Logger } from './core/logger.js';
import { createOwnerOnlyFile, readOwnerOnlyFile, secureDataDir, writeOwnerOnlyFile } from './core/data-dir.js';
import { storageFailureCode } from './core/errors.js';
import { FailureStreak } from './core/failure-streak.js';
import { createSecretBox, secretKeyCheck } from './core/secret-box.js';
import { EndpointService, type PublicUrls } from './endpoints/index.js';
import { createHttpServer, type HttpServer } from './http/index.js';
import { JobQueue, WebhookSender, WorkerRegistry } from './queue/index.js';
import { ContainerRuntime, ProcessRuntime, findEngineSocket, reapOrphanProcessWorkers, type VolumeRecords, type WorkerRuntime } from './runtime/index.js';
import { Autoscaler, LogHub, unreservedCpu } from './scheduler/index.js';
import { GpuWatch, ResourceLedger, createLedgerPlacement, probeHost, startDiscoveryLogger, workerRequirement } from './gpu/index.js';
import type { EndpointSpec } from './endpoints/index.js';
import { IdentityRepo, JobsRepo, LogsRepo, SpaceReclaimer, WriteBatch, closeWithoutCheckpoint, lockDataDir, openDb, walPathOf, type Db } from './store/index.js';

export const VERSION: string = pkg.version;

export interface AgentOptions {
  config: FlashdConfig;
  clock?: Clock;
  /** Where log lines go (default stderr). */
  logSink?: LogSink;
  /** Where the one-time admin key notice goes (default stdout). */
  announce?: (text: string) => void;
}

export interface Agent {
  readonly config: FlashdConfig;
  readonly log: Logger;
  readonly db: Db;
  readonly api: Api;
  readonly endpoints: EndpointService;
  readonly auth: AuthService;
  /** Per-endpoint limits of the queue job API. */
  readonly jobRateLimiter: JobRateLimiter;
  readonly queue: JobQueue;
  readonly autoscaler: Autoscaler;
  readonly logs: LogHub;
  /** The bound port (differs from config.port when that is 0). */
  readonly port: number;
  /** http://host:port of this server. */
  readonly url: string;
  /** The admin key generated on this start, if one was (it is also in <data-dir>/admin-api-key). */
  readonly generatedAdminKey: string | null;
  close(): Promise<void>;
  /**
   * For a second SIGINT/SIGTERM while close() waits: kills the process workers this run
   * started (their process groups, SIGKILL) and force-removes its containers (running and
   * kept), so none outlives flashd. Their jobs are reclaimed by the next start, as after a
   * crash. Resolves once the engine answered the removals (the caller bounds the wait).
   */
  killWorkersNow(): Promise<void>;
}

/** Files a flashd leaves in its data directory beside flashd.db: any of them says one ran there. */
const LEFT_BESIDE_DB = ['secret.key', 'admin-api-key', 'flashd.db-wal'] as const;

function present(file: string): boolean {
  try {
    lstatSync(file);
    return true;
  } catch {
    return false;
  }
}

/**
 * Throws when flashd.db is missing from a data directory a flashd ran in (its secret.key,
 * admin-api-key or WAL still there), before anything is made in it: a start used to make a new,
 * empty database there, write a new key over admin-api-key and drop the WAL, so every endpoint,
 * job and key was gone without a word.
 */
function refuseLostDatabase(dataDir: string): void {
  const dbFile = join(dataDir, 'flashd.db');
  if (present(dbFile)) return;
  const found = LEFT_BESIDE_DB.filter((f) => present(join(dataDir, f)));
  if (found.length === 0) return;
  throw new Error(`${dbFile} is missing, but the data directory still holds ${found.join(', ')}: a flashd ran here and its database was deleted or not restored. `
    + `Starting would make a new, empty one${found.includes('flashd.db-wal') ? ' and drop the recent writes in flashd.db-wal' : ''}. `
    + 'Restore flashd.db from a backup (with the secret.key saved with it), or move the directory aside to start afresh');
}

/** Whether `err` is SQLite finding the database file corrupt, or not a database at all. */
function isCorruptDatabase(err: unknown): boolean {
  const code = (err as { code?: unknown }).code;
  return (typeof code === 'string' && (code.startsWith('SQLITE_CORRUPT') || code.startsWith('SQLITE_NOTADB')))
    || /malformed/.test((err as Error).message);
}

/**
 * `err` with the likely cause when it says the database is corrupt and flashd.db-wal was there,
 * not empty, before the start opened flashd.db (`walBefore`): SQLite reads it as part of the
 * file, so a backup's flashd.db restored beside the WAL a crash left is read through another
 * database's WAL. The start leaves both as they were (closeWithoutCheckpoint).
 */
function blameLeftoverWal(err: unknown, dataDir: string, walBefore: boolean): unknown {
  if (!walBefore || !isCorruptDatabase(err)) return err;
  const dbFile = join(dataDir, 'flashd.db');
  const { code } = err as { code?: unknown };
  return Object.assign(new Error(`${(err as Error).message}: ${walPathOf(dataDir)} was beside ${dbFile} at this start (a crash or kill -9 leaves it), and SQLite reads it as part of the database. `
    + 'If flashd.db was restored from a backup, move flashd.db-wal and flashd.db-shm out of the data directory (keep them) and start again: they belong to the database it replaced. '
    + 'Otherwise never delete them: they hold the last writes. Both files were left as they were (README "Backups")', { cause: err }), code === undefined ? {} : { code });
}

/** Whether `file` is there with something in it. */
function nonEmpty(file: string): boolean {
  try {
    return lstatSync(file).size > 0;
  } catch {
    return false;
  }
}

/** The settings key of secretKeyCheck: which secret.key the database was used with. */
const KEY_CHECK_SETTING = 'secret_key.check';

/**
 * The 32-byte key that seals secrets at rest, from `keyText` (secret.key as read, checked as
 * a regular file of flashd's user) and checked against the value the database keeps of it:
 * one that differs (a flashd.db copied without its secret.key, which then got a new one) is
 * refused, since the registry passwords and jobs' s3Config sealed in it would not open. With
 * none, one is made (exclusively, never through a link or over another file, mode 0600) only for
 * a database that holds nothing yet, not for one copied without it. The check is written when
 * the database has none (its first start, or one of a flashd from before the check).
 */
function loadSecretKey(dataDir: string, keyText: string | null, identity: IdentityRepo, log: Logger): Buffer {
  const file = join(dataDir, 'secret.key');
  const dbFile = join(dataDir, 'flashd.db');
  const check = identity.getSetting(KEY_CHECK_SETTING);
  if (keyText === null) {
    if (check !== undefined || identity.holdsData()) {
      throw new Error(`${file} is missing, but ${dbFile} holds data sealed with it (registry passwords, jobs' s3Config): a new key would leave them unreadable. `
        + 'Put back the secret.key saved with this flashd.db (mode 0600); if it is lost for good, README "Backups" says how to go on without it');
    }
    createOwnerOnlyFile(file, randomBytes(32).toString('base64'));
    keyText = readOwnerOnlyFile(file, log);
    if (keyText === null) throw new Error(`${file} went away while it was read`);
  }
  const key = Buffer.from(keyText.trim(), 'base64');
  if (key.length !== 32) throw new Error(`${file} is not a 32-byte base64 key`);
  if (check === undefined) identity.putSetting(KEY_CHECK_SETTING, secretKeyCheck(key));
  else if (check !== secretKeyCheck(key)) {
    throw new Error(`${file} is not the key ${dbFile} was used with: the registry passwords and jobs' s3Config sealed in it would not open. `
      + 'Put back the secret.key saved with this flashd.db (or the flashd.db saved with this secret.key); if it is lost for good, README "Backups" says how to go on without it');
  }
  return key;
}

/**
 * `--runtime docker`, or `auto` when an engine socket is found; null otherwise. `docker`
 * without a socket is a start error; `auto` without one logs that flashd starts no workers.
 */
function createContainerRuntime(config: FlashdConfig, dataDir: string, log: Logger, volumes: VolumeRecords, hostGpus: () => number | undefined): ContainerRuntime | null {
  if (config.runtime !== 'docker' && config.runtime !== 'auto') return null;
  const socketPath = findEngineSocket(config.containerSocketCandidates);
  const looked = config.containerSocketCandidates.join(', ');
  if (socketPath === null) {
    // A DOCKER_HOST of tcp:// or ssh:// is passed over (flashd speaks to a local unix socket only): say so.
    const skipped = config.dockerHostSkipped === null ? '' : `DOCKER_HOST (${config.dockerHostSkipped}) is not used: flashd needs the engine's unix socket`;
    if (config.runtime === 'docker') throw new Error(`--runtime docker: no Docker Engine API socket found (looked at ${looked}${skipped ? `; ${skipped}` : ''}); set --container-socket`);
    log.info('no container engine socket found: runtime none, flashd starts no workers', { looked, ...(skipped ? { skipped } : {}) });
    return null;
  }
  return new ContainerRuntime({
    socketPath, dataDir, workerUrl: config.workerUrl, gpuDriver: config.containerGpuDriver, pullIdleTimeoutMs: config.imagePullIdleTimeoutMs, volumes, hostGpus, log: log.child({ component: 'runtime' }),
  });
}

/** Three of runpod-python's shortest heartbeat period (1 s): a lease shorter than this is warned about at start. */
const RUNPOD_MIN_SAFE_LEASE_MS = 3000;

/** The files in the data directory that flashd writes besides its secrets (store/db.ts). */
const DATA_DIR_FILES = ['flashd.lock', 'flashd.pid', 'flashd.db', 'flashd.db-wal', 'flashd.db-shm'] as const;

export async function createAgent(options: AgentOptions): Promise<Agent> {
  const config = options.config;
  const clock = options.clock ?? systemClock;
  const log = createLogger({ level: config.logLevel, format: config.logFormat, ...(options.logSink ? { sink: options.logSink } : {}) });
  // Once, first: a typo such as FLASHD_PROT would otherwise leave the default without a word.
  for (const { name, didYouMean } of config.unknownEnv) log.warn('unknown FLASHD_ variable ignored', { name, ...(didYouMean === undefined ? {} : { didYouMean }) });
  // Empty is unset, but an empty secret is most often one the deploy failed to fill in: said
  // before flashd, having no admin key of that value, makes one of its own.
  for (const name of config.emptySecretEnv) log.warn('secret variable set but empty: ignored, as if unset', { name, hint: `is a secret missing from the deploy (${name}=\${SECRET} with SECRET unset)?` });
  // runpod-python reads RUNPOD_PING_INTERVAL in whole seconds (int(v) // 1000; flashd hands out
  // at least 1000): its heartbeat comes once a second at most, plus the request's own time, so a
  // shorter lease than three of them can lapse between two pings while the job runs.
  if (config.leaseMs < RUNPOD_MIN_SAFE_LEASE_MS) {
    log.warn('--lease-ms is under 3 s: runpod-python workers ping once a second at most, so their running jobs can lose the lease between two pings and run again', { leaseMs: config.leaseMs, hint: `give --lease-ms ${RUNPOD_MIN_SAFE_LEASE_MS} or more` });
  }
  const dataDir = resolve(config.dataDir);
  // Made 0700, or an existing one that group or others may write tightened (or refused when
  // another user owns it): before any file in it is opened. One flashd's user may not write, or
  // with a store file of another user in it, is refused naming the path and the cause.
  secureDataDir(dataDir, log, DATA_DIR_FILES);
  // Then the lock, before anything else: nothing below (migrations, recovery, reaping a crashed run's workers) may run while
  // another flashd serves this data directory.
  const lock = lockDataDir(dataDir);
  let db: Db;
  let identity: IdentityRepo;
  let fileKey: Buffer;
  let opened: Db | undefined;
  // A WAL a crash left: replayed into flashd.db at the open (or, beside a restored flashd.db, the
  // likely cause of a corrupt one).
  const walBefore = nonEmpty(walPathOf(dataDir));
  try {
    // The secrets' files, checked (owner, mode, no link) before the database is touched.
    const keyText = readOwnerOnlyFile(join(dataDir, 'secret.key'), log);
    readOwnerOnlyFile(join(dataDir, 'admin-api-key'), log);
    refuseLostDatabase(dataDir);
    opened = openDb({ dataDir, synchronous: config.sqliteSynchronous, log: log.child({ component: 'store' }) });
    identity = new IdentityRepo(opened);
    fileKey = loadSecretKey(dataDir, keyText, identity, log);
    db = opened;
  } catch (err) {
    // Not close(): its checkpoint would write the WAL into flashd.db and delete it, whatever
    // this failure found wrong with them.
    if (opened) closeWithoutCheckpoint(opened);
    lock.release();
    throw blameLeftoverWal(err, dataDir, walBefore);
  }
  // A later step of the start that finds the database corrupt leaves it the same way.
  let corrupt = false;
  const closers: (() => Promise<void> | void)[] = [() => lock.release(), () => {
    if (corrupt) closeWithoutCheckpoint(db);
    else db.close();
  }];
  const announce = options.announce ?? ((t: string) => void process.stdout.write(t));
  let keyNotice: { started: () => void; failed: () => void } | null = null;
  try {
    const auth = new AuthService(identity, clock, log.child({ component: 'auth' }), config.sessionTtlSeconds, fileKey);
    const { generated, first } = auth.bootstrap(config.adminApiKey);
    if (generated) {
      // A file already there holds a key that is no longer valid (a key is generated only when
      // the admin user has no valid admin key: every one was revoked or expired), so the new one replaces it. A
      // flashd.db deleted beside it never gets here (refuseLostDatabase). No file is there when
      // the admin keys came from FLASHD_ADMIN_API_KEY alone.
      const file = join(dataDir, 'admin-api-key');
      const fresh = writeOwnerOnlyFile(file, generated + '\n', log);
      // Shown once flashd listens: a start that fails after this (its port in use) says where
      // the key was saved instead of showing it "once" for a start that did not happen, and the
      // next start, finding the key valid, makes and prints none.
      const text = first
        ? `\nFirst start: created an admin API key. It is shown once here and saved to ${file} (mode 0600):\n\n    ${generated}\n\n`
        : `\nThe admin user had no valid admin API key left (every one revoked or expired): created an admin API key. It is shown once here and saved to ${file} (mode 0600)${fresh ? '' : ', in place of the old one'}:\n\n    ${generated}\n\n`;
      keyNotice = {
        started: () => announce(text),
        failed: () => announce(`\nCreated an admin API key and saved it to ${file} (mode 0600), but the start failed. The key stays valid (it is not shown here): read it from that file.\n\n`),
      };
    }

    let port = config.port;
    const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
    // As a URL writes it: an IPv6 address in brackets (`http://[::1]:8000`).
    const urlHost = host.includes(':') ? `[${host}]` : host;
    const urls: PublicUrls = {
      queueBaseUrl: () => config.publicUrl ?? `http://${urlHost}:${port}`,
      endpointHost: () => config.endpointHost ?? `lb.localhost:${port}`,
      endpointScheme: config.endpointScheme,
    };
    const dataCenters = [{ id: config.dataCenterId, name: `${config.dataCenterId} (this installation)` }];
    // Seals registry passwords and jobs' extra keys (s3Config) at rest.
    const secrets = createSecretBox(fileKey);
    const endpoints = new EndpointService({
      db, clock, log: log.child({ component: 'endpoints' }), secrets,
      dataCenterIds: () => dataCenters.map((d) => d.id),
      workersRunOnHost: config.runtime === 'process',
    });
    const rateLimiter = new RateLimiter({ minute: config.rateLimitMinute, hour: config.rateLimitHour, day: config.rateLimitDay }, clock);
    // The queue job API: RunPod's per-endpoint quotas, scaled by --job-rate-limit-percent (auth/job-rate-limit.ts).
    const jobRateLimiter = new JobRateLimiter(clock, config.jobRateLimitPercent);

    // A full disk or an I/O error fails every write until it is fixed: the first failure is
    // logged in full, then a count at most once a minute (a client retrying in a loop must not
    // fill the log); the requests refused for it (503, api/dispatch.ts) count here too.
    const storeLog = log.child({ component: 'store' });
    const storeFailures = new FailureStreak(storeLog, 'store write failed', {
      level: 'error', everyMs: 60_000, recovered: 'store writes work again', now: () => clock.monotonic(),
    });
    // Jobs: group commit, queue, webhooks, logs, autoscaler.
    const batch = new WriteBatch(db, {
      durability: config.sqliteSynchronous === 'full' ? 'fsync' : 'none',
      walPath: walPathOf(dataDir),
      onError: (err) => {
        if (storageFailureCode(err)) storeFailures.fail(err, { dataDir });
        else log.error('store commit failed', { err });
      },
      onCommitted: () => storeFailures.ok(),
    });
    closers.push(() => batch.close());
    const queueLog = log.child({ component: 'queue' });
    const jobsRepo = new JobsRepo(db, secrets, (jobId, err) => queueLog.warn(
      'job s3Config could not be opened (secret.key replaced or lost?): the job goes on without it', { jobId, err }));
    const sealed = jobsRepo.sealPlainExtras();
    if (sealed) log.info('jobs s3Config sealed at rest (rows of an older flashd)', { jobs: sealed });
    const queue = new JobQueue({
      repo: jobsRepo, batch, clock, log: queueLog,
      workers: new WorkerRegistry(clock, config.leaseMs * 2),
      endpointExists: (id) => endpoints.byId(id) !== undefined,
      settings: { leaseMs: config.leaseMs, takeHoldMs: config.takeHoldMs, maxAttempts: config.maxAttempts },
    });
    // Webhooks before recovery: it can end jobs (a worker of the previous run released below,
    // whose attempt was the job's last), and their webhooks are sent by this run.
    const webhooks = new WebhookSender({
      allowPrivate: config.webhookAllowPrivate, retryDelayMs: config.webhookRetryDelayMs, attempts: 3, timeoutMs: 10_000, deadlineMs: 60_000,
      maxInFlight: 64, maxInFlightPerHost: 32,
      log: log.child({ component: 'webhook' }),
      // A delivery that waits its turn builds its body from the row when the turn comes.
      bodyOf: (jobId) => queue.webhookBody(jobId),
      onSettled: (jobId) => queue.webhookSettled(jobId),
      onTried: (jobId, tries) => queue.webhookTried(jobId, tries),
    });
    closers.push(() => webhooks.close());
    queue.on({
      finished: (job, hookBody) => {
        if (job.webhook && hookBody) webhooks.send(job.webhook, job.id, hookBody);
      },
      // The earlier run's webhook tries still to come would land after the new run's.
      retried: (job) => webhooks.supersede(job.id),
    });
    // The hardware probe waits on nvidia-smi and /proc; it runs while recovery reads the backlog.
    // What the start's discovery says, the first rediscovery does not say again (GpuWatch).
    const gpuLog = log.child({ component: 'gpu' });
    const gpuStartLines = new Set<string>();
    const hardwareProbe = probeHost({ dataCenterId: config.dataCenterId, log: startDiscoveryLogger(gpuLog, gpuStartLines) });
    hardwareProbe.catch(() => undefined);
    // The host's GPUs, for the engine's line on GPU support: known once the probe is in (the
    // engine connects after it, at start()).
    let hostLedger: ResourceLedger | undefined;
    const containers = createContainerRuntime(config, dataDir, log, {
      state: (id) => endpoints.networkVolumes.getUnscoped(id) !== undefined || endpoints.globalVolumes.getUnscoped(id) !== undefined ? 'exists'
        : endpoints.deletedVolumes.has(id) ? 'deleted' : 'unknown',
      removed: (id) => endpoints.deletedVolumes.remove(id),
    }, () => hostLedger?.host.gpus.length);
    // A copy of this data directory beside its live original is refused here, before recovery
    // and the release of the previous run's workers below change this database and log as
    // though the work were this flashd's (start() refuses it too, but only after them).
    await containers?.refuseSharedInstance();
    const recoveryStart = performance.now();
    const recovered = queue.recover();
    if (recovered.queued || recovered.running) log.info('jobs recovered', { ...recovered, ms: Math.round(performance.now() - recoveryStart) });
    // Workers this flashd launched before a crash are gone or going (process workers are stopped
    // here whatever the runtime is now; containers when the engine connects): their keys are
    // revoked, and their jobs go back to the queue now instead of after a lease.
    reapOrphanProcessWorkers(dataDir, log.child({ component: 'runtime' }));
    // Endpoint logs (GET /v2/serverless/{id}/logs): made here so that the release of the last
    // run's workers is in them, after those workers' own last lines.
    const logs = new LogHub(new LogsRepo(db), batch, clock);
    const leftovers = auth.revokeLeftoverManagedKeys();
    for (const w of leftovers) {
      // Killed by the operator's second signal: its jobs were cut short as a clean stop's are,
      // and get their attempt back as those do.
      if (w.bySignal) {
        const why = `worker ${w.workerId} was stopped by a second signal to the previous run of flashd`;
        const held = queue.workerGone(w.endpointId, w.workerId, why, false).length;
        queue.workers.remove(w.endpointId, w.workerId);
        logs.append(w.endpointId, w.workerId, 'system', `${why} (stopping now, without waiting for it): its key was revoked${held > 0 ? `; its ${held} job(s) went back to the queue, their attempt given back` : ''}`);
        continue;
      }
      // Unlike a clean stop, a crash uses the attempt: a job that itself brings flashd down (its
      // memory) must not run forever. The job's reason (and its error, where that was its last
      // attempt) says that the attempt ended with flashd, not with the handler.
      const why = `worker ${w.workerId} belonged to a run of flashd that did not stop cleanly`;
      const jobWhy = `worker ${w.workerId} was lost when flashd stopped without a clean shutdown (killed or crashed), which uses an attempt`;
      const held = queue.workerGone(w.endpointId, w.workerId, jobWhy).length;
      queue.workers.remove(w.endpointId, w.workerId);
      logs.append(w.endpointId, w.workerId, 'system', `${why} (killed or crashed): it was stopped and its key revoked${held > 0 ? `; its ${held} job(s) went back to the queue, each using an attempt (or failed, where that was their last attempt)` : ''}`);
    }
    if (leftovers.length) log.info('workers of the previous run released', { count: leftovers.length });
    // What ran out while flashd was down ends now, before the first request, not at the timers'
    // first pass below: queued jobs past their TTL (TIMED_OUT) and results past their retention,
    // which /status already answers 404 for and /health would otherwise still count.
    queue.reap();
    queue.expire();
    // Webhooks the last run had not delivered (a stop or a crash between a job's end and its 2xx).
    const owed = queue.webhooksOwed();
    for (const w of owed) webhooks.send(w.url, w.jobId, undefined, w.tries);
    if (owed.length) log.info('webhooks owed by the previous run sent again', { count: owed.length });
    const pingIntervalMs = Math.max(1000, Math.floor(config.leaseMs / 3));
    // Hardware: GPUs (nvidia-smi) and CPU/memory (systeminformation) feed placement and the catalogs.
    const hardware = await hardwareProbe;
    log.info('hardware', {
      gpus: hardware.gpus.length, cuda: hardware.discovery.cudaVersion ?? undefined, noGpu: hardware.discovery.noGpuReason ?? undefined,
      vcpus: hardware.cpu.vcpus, memoryGb: Math.round(hardware.cpu.memoryGb * 10) / 10,
    });
    const ledger = new ResourceLedger(hardware);
    hostLedger = ledger;
    const gpuWatch = new GpuWatch({ ledger, intervalMs: config.gpuRediscoverMs, log: gpuLog, startLines: gpuStartLines });
    gpuWatch.start();
    closers.push(() => gpuWatch.close());
    const ledgerPlacement = createLedgerPlacement<EndpointSpec>(ledger, (spec) => workerRequirement({
      gpu: spec.gpu, cpu: spec.cpu, dataCenterIds: spec.dataCenterIds, ...(spec.gpuTypePriority ? { gpuTypePriority: spec.gpuTypePriority } : {}),
    }));
    const runtime: WorkerRuntime | null = config.runtime === 'process'
      ? new ProcessRuntime({ dataDir, workdir: config.processWorkdir, log: log.child({ component: 'runtime' }) })
      : containers;
    const autoscaler = new Autoscaler({
      queue, endpoints, runtime, auth, logs, clock, log: log.child({ component: 'autoscaler' }),
      noRuntimeReason: config.runtime === 'none' ? '--runtime none' : 'no container engine socket was found at start-up',
      baseUrl: () => config.workerUrl ?? containers?.workerBaseUrl() ?? urls.queueBaseUrl(), pingIntervalMs,
      stopGraceMs: config.workerStopGraceMs, initTimeoutMs: config.workerInitTimeoutMs,
      registryAuth: (ownerId, id) => endpoints.registryAuth(ownerId, id),
      // Host processes get no CPU or memory limit: only GPUs are handed out (see unreservedCpu).
      placement: config.runtime === 'process' ? unreservedCpu(ledgerPlacement) : ledgerPlacement,
    });
    closers.push(() => autoscaler.close());
    // A launched worker's first job-take: the next QUEUE_DELAY step may start now, not at the next tick.
    queue.workers.onUp = (endpointId) => autoscaler.trigger(endpointId);
    // A PATCH that lowers workers.max names `workers` only when it stops or retires someone.
    endpoints.workersAboveMax = (endpointId, max) => autoscaler.workersAboveMax(endpointId, max);
    endpoints.hostGpuModels = () => [...new Set(ledger.inventory().filter((g) => g.gpuTypeId === null).map((g) => g.name))];
    // A key revoked through the API: the workers using it stop waiting on it and stop counting.
    auth.onRevoked = (keyId, named) => queue.keyRevoked(keyId, named);
    queue.on({
      jobQueued: (endpointId) => autoscaler.trigger(endpointId),
      // stopPod: the queue marked the worker (recycling); the next decision stops it once idle.
      recycleWorker: (endpointId) => autoscaler.trigger(endpointId),
      finished: (job) => {
        // A worker to be replaced (a new configuration, above a lowered max, stopPod) that just
        // finished its last job stops now, not at the next tick: until then /health counted it
        // idle though it takes no job, and a replacement waiting for its place waited too.
        const worker = job.workerId ? queue.workers.get(job.endpointId, job.workerId) : undefined;
        if (worker?.recycle && worker.managed && worker.jobs.size === 0) autoscaler.trigger(job.endpointId);
      },
      // Said in the endpoint log: a handler that runs on (a sync one cannot be interrupted) keeps
      // its worker busy, and a queue that waits meanwhile showed no reason.
      endedOnWorker: (job, workerId, why) => logs.append(job.endpointId, workerId, 'system', `job ${job.id} ended on worker ${workerId} (${why}): the worker was told to stop it (job-stop)`),
      // runpod-python's failed fitness check: the one report before it exits, which the user
      // would otherwise see only as an unexpected exit.
      workerUnhealthy: (endpointId, workerId, { check, reason }) => logs.append(endpointId, workerId, 'system',
        `worker ${workerId} reported unhealthy${check ? `: check ${check} failed` : ''}${reason ? `: ${reason}` : ''}`),
    });
    endpoints.on({
      // A lower workers.max is a restart reason for the API when workers are above it (they stop:
      // the spec's "worker counts may require restarting"), but the scaler's over-max rule
      // handles it without replacing anyone.
      changed: (id, _spec, restartReasons) => autoscaler.endpointChanged(id, restartReasons.some((r) => r !== 'workers'), restartReasons),
      deleting: (id) => {
        // Writes already queued for this endpoint commit before its rows go.
        batch.flush(true);
        auth.revokeEndpointKeys(id);
        queue.dropEndpoint(id);
        logs.drop(id);
        jobRateLimiter.forget(id);
        // In the background: its workers stop within their grace. A failure is logged, never an
        // unhandled rejection (which would end flashd).
        autoscaler.dropEndpoint(id).catch((err: unknown) => log.error('endpoint workers not all stopped', { endpointId: id, err }));
      },
      // Its engine volume and data; none with another runtime (process workers have no volume).
      volumeDeleted: (id) => void containers?.removeVolume(id),
    });
    const reapEvery = Math.max(100, Math.min(1000, Math.floor(config.leaseMs / 4)));
    // Free pages (expired results, deleted endpoints) back to the filesystem, a slice per commit.
    const reclaimer = new SpaceReclaimer(db, batch, storeLog);
    /**
     * A timer's work, where a throw is logged, never the end of the process: on a full disk or
     * after an I/O error the checkpoint fails every time (it must grow flashd.db), and with no
     * handler one throw killed flashd within 10 s of every start. Warned once per streak of
     * failures, and told when it works again.
     */
    const guarded = (timerLog: Logger, what: string, fn: () => void): (() => void) => {
      const streak = new FailureStreak(timerLog, `${what} failed; tried again on its timer`, { level: 'warn', recovered: `${what} works again` });
      return () => {
        try {
          fn();
        } catch (err) {
          streak.fail(err, { dataDir });
          return;
        }
        streak.ok();
      };
    };
    const timers = [
      setInterval(guarded(queueLog, 'job lease check', () => queue.reap()), reapEvery),
      // Every second, so /health's finished counts fall as results expire (a read when nothing is due).
      setInterval(guarded(queueLog, 'job expiry', () => queue.expire()), 1000),
      // Checkpoints off the request path (perf-anchors §3b note b).
      setInterval(guarded(storeLog, 'store checkpoint', () => db.pragma('wal_checkpoint(PASSIVE)')), 10_000),
      // A read of two header fields when there is nothing worth giving back.
      setInterval(guarded(storeLog, 'store space reclaim check', () => reclaimer.check()), 1000),
    ];
    for (const t of timers) t.unref();
    closers.push(() => {
      timers.forEach(clearInterval);
      reclaimer.close();
    });

    // A worker refused for a key that is no flashd key: runpod-python sends the api_key of a
    // ~/.runpod/config.toml baked into the image instead of RUNPOD_AI_API_KEY (for job-take,
    // job-done, job-stream and job-stop; its ping uses the variable), and an empty header when
    // that file's [default] profile has no api_key. Once a minute per endpoint and kind.
    const keyMistakeLogged = new Map<string, number>();
    const onWorkerKeyMistake = (endpointId: string, workerId: string | undefined, kind: WorkerKeyMistake): void => {
      if (!endpoints.byId(endpointId)) return;
      const now = clock.now();
      const at = `${kind} ${endpointId}`;
      const last = keyMistakeLogged.get(at);
      if (last !== undefined && now - last < 60_000) return;
      if (keyMistakeLogged.size > 10_000) keyMistakeLogged.clear();
      keyMistakeLogged.set(at, now);
      const who = workerId === undefined ? 'a worker' : `worker ${JSON.stringify(workerId.slice(0, 64))}`;
      logs.append(endpointId, null, 'system', kind === 'foreign'
        ? `${who} sent a key that is no flashd key (flashd's keys start with fd_) and was refused (401): a RunPod API key baked into the image may be replacing the one flashd gives (runpod-python sends the api_key of a ~/.runpod/config.toml, when the image has one, instead of RUNPOD_AI_API_KEY on job-take, job-done and job-stream); remove that file from the image (said at most once a minute)`
        : `${who} sent an empty Authorization header and was refused (401): a ~/.runpod/config.toml in the image with a [default] profile but no api_key line makes runpod-python send an empty key instead of RUNPOD_AI_API_KEY on job-take, job-done and job-stream (its ping, which uses the variable, still works); remove that file from the image. A worker started by hand sends one too when RUNPOD_AI_API_KEY is unset or empty (flashd worker-env gives it) (said at most once a minute)`);
    };
    const api = createApi({
      services: { endpoints, auth, urls, dataCenters: () => dataCenters, inventory: () => ledger.inventory(), version: VERSION,
        commandsRunOnHost: config.runtime === 'process', containerRuntime: runtime && !runtime.runsOnHost ? runtime.name : null },
      auth, rateLimiter, jobRateLimiter, log: log.child({ component: 'api' }), storeFailures, maxBodyBytes: config.maxBodyBytes, onWorkerKeyMistake,
      extraRoutes: [
        ...jobRoutes({ queue, endpoints, now: () => clock.now(), webhookAllowPrivate: config.webhookAllowPrivate }),
        ...workerRoutes({
          queue, endpoints, auth, logs, baseUrl: urls.queueBaseUrl, pingIntervalMs, log: queueLog,
        }),
      ],
    });
    const http: HttpServer = createHttpServer({
      host: config.host, port: config.port, log: log.child({ component: 'http' }),
      resolve: api.resolve, onEarlyError: api.earlyError, pollSpinUs: config.pollSpinUs,
    });
    port = (await http.listen()).port;
    closers.push(async () => {
      // No job goes out from here, to any worker; then flashd's workers are stopped, while the API
      // still takes their results (and external workers'); then the queue and the listener.
      queue.stopDispatch();
      await autoscaler.drain();
      queue.close();
      await logs.close();
      return http.close();
    });
    // Containers need the bound port for the URL they reach flashd at (see --worker-url).
    await containers?.start({ host: config.host, port });
    autoscaler.start();
    keyNotice?.started();
    keyNotice = null;
    // `url` is where this machine reaches flashd (127.0.0.1 for a wildcard bind); `host` is what
    // it bound, so 0.0.0.0 (every interface) shows in the log.
    log.info('flashd listening', { url: `http://${urlHost}:${port}`, host: config.host, dataDir, version: VERSION, runtime: runtime?.name ?? 'none' });

    let closed = false;
    return {
      config, log, db, api, endpoints, auth, jobRateLimiter, queue, autoscaler, logs, port, url: `http://${urlHost}:${port}`, generatedAdminKey: generated,
      killWorkersNow: async () => {
        const runtimeLog = log.child({ component: 'runtime' });
        // Before the kill, and synchronous: the exit follows within seconds.
        try {
          auth.noteManagedKeysStoppedBySignal();
        } catch (err) {
          // The database already closed (the clean stop had all but ended) or unwritable: the
          // next start counts these workers as a crash's, their jobs' attempts used.
          runtimeLog.warn('cannot note the workers the second signal stops: the next start counts their jobs\' attempts as used', { err });
        }
        reapOrphanProcessWorkers(dataDir, runtimeLog, 'killed worker process (second signal): its jobs are queued again at the next start');
        const count = await containers?.removeAllNow();
        if (count) runtimeLog.warn('removed containers (second signal): their jobs are queued again at the next start', { count });
      },
      close: async () => {
        if (closed) return;
        closed = true;
        await runClosers(closers, log);
      },
    };
  } catch (err) {
    keyNotice?.failed();
    corrupt = isCorruptDatabase(err);
    await runClosers(closers, log).catch(() => undefined);
    throw blameLeftoverWal(err, dataDir, walBefore);
  }
}

/**
 * Runs the closers last-registered first, every one of them even when one fails: a closer that
 * threw used to skip the rest, leaving the listener, the database and the data-dir lock open
 * (a process that then never exits). Each failure is logged; the first is thrown at the end,
 * with the others named in its message.
 */
export async function runClosers(closers: (() => Promise<void> | void)[], log: Logger): Promise<void> {
  const failures: Error[] = [];
  for (const c of closers.reverse()) {
    try {
      await c();
    } catch (err) {
      const e = err instanceof Error ? err : new Error(String(err));
      failures.push(e);
      log.error('a step of the shutdown failed; the others still run', { err: e });
    }
  }
  const [first, ...others] = failures;
  if (!first) return;
  if (others.length) first.message += ` (and ${others.length} more: ${others.map((e) => e.message).join('; ')})`;
  throw first;
}
