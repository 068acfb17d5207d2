/** What the scheduler asks of a place that runs workers (host processes, containers). */
export interface LaunchSpec {
  endpointId: string;
  workerId: string;
  /** Full argv (entrypoint + cmd) for runtimes that cannot use an image's own. */
  entrypoint: string[];
  cmd: string[];
  image: string;
  /** Endpoint env merged with the worker env (worker env wins on protocol names). */
  env: Record<string, string>;
}

export interface WorkerEvents {
  /** One line of the worker's stdout or stderr. */
  log(stream: 'stdout' | 'stderr', line: string): void;
  /** The worker is gone. `requested` is true when flashd asked it to stop. */
  exit(info: { code: number | null; signal: string | null; requested: boolean }): void;
}

export interface WorkerRuntime {
  readonly name: string;
  /** Starts a worker; rejects when it cannot even be started (bad command, missing image). */
  launch(spec: LaunchSpec, events: WorkerEvents): Promise<void>;
  /** Asks a worker to stop (SIGTERM), killing it after `graceMs`. Resolves when it is gone. */
  stop(workerId: string, graceMs: number): Promise<void>;
  /** Workers this runtime could start now for an endpoint (Infinity when unbounded). */
  capacity(endpointId: string): number;
  /** Stops every worker (shutdown). */
  close(): Promise<void>;
}
