/** What the scheduler asks of a place that runs workers (host processes, containers). */
export type Flashboot = 'OFF' | 'FLASHBOOT' | 'PRIORITY_FLASHBOOT';

export interface LaunchSpec {
  endpointId: string;
  /** A fresh worker id. A runtime that reuses a kept worker returns that worker's id instead. */
  workerId: string;
  /** Overrides the image's ENTRYPOINT when non-empty. */
  entrypoint: string[];
  /** Overrides the image's CMD when non-empty. */
  cmd: string[];
  image: string;
  /** Endpoint env merged with the worker env (worker env wins on protocol names). */
  env: Record<string, string>;
  /** `port/protocol` entries, e.g. `8000/http`. */
  ports: string[];
  /** Container disk limit in GB, where the engine supports one. */
  diskGb: number | null;
  /** The endpoint's volume, mounted at /vendor-volume. */
  volume: { kind: 'network' | 'global'; id: string } | null;
  /** GPUs assigned by placement (ids as nvidia-smi reports them: UUIDs); [] for CPU workers. */
  gpuDeviceIds: string[];
  /** CPU workers: vCPUs and memory limit from the flavor. */
  cpu: { vcpuCount: number; memoryGb: number } | null;
  /** Credentials for pulling a private image; only ever sent to the engine. */
  registryAuth: { username: string; password: string; serveraddress: string } | null;
  flashboot: Flashboot;
  /**
   * Hash of everything above that defines the worker except its identity (workerId, worker key
   * and URLs in env). A kept (FlashBoot) worker may be reused only for an equal hash.
   */
  configHash: string;
}

export interface ExitInfo {
  code: number | null;
  signal: string | null;
  /** True when flashd asked the worker to stop. */
  requested: boolean;
  /** True when the worker was kept for a fast restart (FlashBoot): its identity stays valid. */
  kept?: boolean;
}

export interface WorkerEvents {
  /** One line of the worker's stdout or stderr. */
  log(stream: 'stdout' | 'stderr', line: string): void;
  /** The worker stopped running. */
  exit(info: ExitInfo): void;
  /** A kept worker was discarded for good (its identity may now be revoked). */
  discarded?(): void;
}

export interface LaunchResult {
  /** `spec.workerId`, or the id of a kept worker that was restarted instead. */
  workerId: string;
  /** True when a kept worker was restarted (FlashBoot) instead of creating a new one. */
  reused: boolean;
}

export interface WorkerRuntime {
  readonly name: string;
  /**
   * Workers run as host processes of flashd's own user (the process runtime), not in a
   * container: only endpoints whose command an admin set may start (`EndpointSpec.commandByAdmin`).
   */
  readonly runsOnHost?: boolean;
  /**
   * The kept worker (FlashBoot) that `launch` with this endpoint and config hash would restart
   * if called now, in the same turn; null when it would start a new one. The scheduler names
   * that worker when it says the start, before the launch resolves.
   */
  keptWorker?(endpointId: string, configHash: string): string | null;
  /** Starts a worker; rejects when it cannot be started (bad command, image pull failure). */
  launch(spec: LaunchSpec, events: WorkerEvents): Promise<LaunchResult>;
  /**
   * Asks a worker to stop (SIGTERM), killing it after `graceMs`. Resolves when it is gone.
   * `keep: false`: never keep it for a FlashBoot restart (it is being stopped as unhealthy).
   */
  stop(workerId: string, graceMs: number, options?: { keep?: boolean }): Promise<void>;
  /** Workers this runtime could start now for an endpoint (Infinity when unbounded). */
  capacity(endpointId: string): number;
  /** Why this runtime cannot start GPU workers (an engine that cannot attach GPUs), or null. */
  gpuBlocked?(): string | null;
  /** Forgets everything kept for an endpoint (deleted endpoint). */
  discardEndpoint?(endpointId: string, reason?: string): Promise<void>;
  /** Stops every worker (shutdown). */
  close(): Promise<void>;
}
