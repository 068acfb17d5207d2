/**
 * A small typed client for the Docker Engine API over its unix socket, written for flashd
 * (ARCHITECTURE.md, "Containers", says why not dockerode). Docker and Podman's compatible
 * service (`podman system service`) both serve it. Only what the container runtime uses is
 * here: ping/version, images, containers, volumes and networks.
 */
import type { Readable } from 'node:stream';
import type {
  ContainerCreateBody, ContainerInspect, ContainerSummary, EngineVersion, ImageInspect, NetworkInspect,
  PullProgress, RegistryAuth, VolumeInspect, WaitResult,
} from './api-types.js';
import { isImageReference } from '../../core/image-ref.js';
import { DockerError, isDockerError } from './errors.js';
import { demultiplexer, type StreamName } from './multiplex.js';
import { Transport } from './transport.js';

/** Oldest API version with everything flashd sends (DeviceRequests arrived in 1.40). */
export const MIN_API_VERSION = '1.40';
/** Newest API version flashd was written against; a newer engine is spoken to in this one. */
export const MAX_API_VERSION = '1.47';

export interface DockerClientOptions {
  socketPath: string;
  /** Timeout of ordinary requests, in ms (waits and attach have none; a pull has its `idleTimeoutMs`). @defaultValue 60000 */
  timeoutMs?: number;
}

/** Compares dotted API versions numerically (1.9 < 1.41). */
export function compareApiVersions(a: string, b: string): number {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/**
 * `X-Registry-Auth`: base64url of the JSON credentials, padded (Docker and Podman decode it
 * with Go's padded `base64.URLEncoding`).
 */
export function registryAuthHeader(auth: RegistryAuth): string {
  const json = JSON.stringify({ username: auth.username, password: auth.password, serveraddress: auth.serveraddress });
  const b64 = Buffer.from(json, 'utf8').toString('base64url');
  return b64 + '='.repeat((4 - (b64.length % 4)) % 4);
}

/**
 * Splits an image reference into the `fromImage` and `tag` of a pull. Without a tag the
 * engine would pull every tag of the repository, so `latest` is made explicit; a digest
 * reference (`name@sha256:...`) is passed whole.
 */
export function splitImageRef(ref: string): { fromImage: string; tag: string | undefined } {
  if (ref.includes('@')) return { fromImage: ref, tag: undefined };
  const colon = ref.lastIndexOf(':');
  if (colon > ref.lastIndexOf('/')) return { fromImage: ref.slice(0, colon), tag: ref.slice(colon + 1) };
  return { fromImage: ref, tag: 'latest' };
}

/**
 * Path segment for an image name: slashes and colons stay as they are (the engine's router takes
 * them). Only an image reference goes in a path: its characters are letters, digits and
 * `._-:/@+[]` (encodeURI encodes the brackets) and it has no empty, `.` or `..` segment, so it
 * names nothing but an image. Anything else (`../../containers/json`, `--privileged`) is refused
 * without a request; the schema refuses it at create, so only a name stored before that gets here.
 */
function imagePath(name: string): string {
  if (!isImageReference(name)) {
    throw new DockerError('DOCKER_BAD_REQUEST', 'the image name is not an image reference ([registry-host[:port]/]name[:tag][@digest]); nothing was sent to the engine', { request: '(not sent)' });
  }
  return encodeURI(name);
}
const idPath = (id: string): string => encodeURIComponent(id);

export interface LogFrameHandler {
  (stream: StreamName, payload: Buffer): void;
}

export class DockerClient {
  readonly #t: Transport;
  #apiVersion: string | null = null;

  constructor(options: DockerClientOptions) {
    this.#t = new Transport(options.socketPath, options.timeoutMs ?? 60_000);
  }

  get socketPath(): string {
    return this.#t.socketPath;
  }

  /** The API version requests use, once `negotiate()` ran. */
  get apiVersion(): string | null {
    return this.#apiVersion;
  }

  /** `GET /_ping`: resolves when the engine answers. */
  async ping(): Promise<void> {
    await this.#t.text({ method: 'GET', path: '/_ping', unversioned: true, timeoutMs: 10_000 });
  }

  /** `GET /version` (unversioned, so it works before negotiation). */
  async version(): Promise<EngineVersion> {
    return (await this.#t.json<EngineVersion>({ method: 'GET', path: '/version', unversioned: true, timeoutMs: 10_000 })).body;
  }

  /**
   * Picks the API version: the engine's own, capped at MAX_API_VERSION. Docker 29 refuses
   * versions older than 1.44, and Podman 4 speaks 1.41, so no fixed version serves both.
   */
  async negotiate(): Promise<EngineVersion> {
    const v = await this.version();
    const server = v.ApiVersion;
    if (!server || compareApiVersions(server, MIN_API_VERSION) < 0) {
      throw new DockerError('DOCKER_API', `the engine speaks API ${server || '?'}; flashd needs ${MIN_API_VERSION} or newer`, { request: 'GET /version' });
    }
    this.#apiVersion = compareApiVersions(server, MAX_API_VERSION) > 0 ? MAX_API_VERSION : server;
    this.#t.setVersion(this.#apiVersion);
    return v;
  }

  // ---- images ------------------------------------------------------------------------------

  /** `GET /images/{name}/json`; null when the image is not present. */
  async inspectImage(name: string): Promise<ImageInspect | null> {
    try {
      return (await this.#t.json<ImageInspect>({ method: 'GET', path: `/images/${imagePath(name)}/json` })).body;
    } catch (err) {
      if (isDockerError(err, 'DOCKER_NOT_FOUND')) return null;
      throw err;
    }
  }

  /**
   * `POST /images/create?fromImage=&tag=`: pulls an image, with credentials in
   * `X-Registry-Auth` only. The reply is a 200 JSON progress stream even when the pull fails,
   * so an `error` line in it rejects. `idleTimeoutMs`: gives up when the engine sends nothing
   * (no reply head, no progress byte) for that long: a registry or proxy that stalls (answers
   * `/v2/`, never the manifest or a layer) otherwise holds the pull, and the worker waiting on
   * it, for good. The engine may go on with the pull or drop it.
   */
  async pullImage(ref: string, options: { auth?: RegistryAuth | null; signal?: AbortSignal; idleTimeoutMs?: number; onProgress?: (p: PullProgress) => void } = {}): Promise<void> {
    const { fromImage, tag } = splitImageRef(ref);
    const idleMs = options.idleTimeoutMs ?? 0;
    const idle = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const arm = (): void => {
      if (idleMs <= 0) return;
      clearTimeout(timer);
      timer = setTimeout(() => idle.abort(), idleMs);
    };
    const stalled = (): DockerError => new DockerError('DOCKER_PROTOCOL', `pull of ${ref}: no progress from the engine for ${Math.round(idleMs / 1000)} s (the registry or the network stalled); given up`, {
      request: 'POST /images/create',
    });
    const signal = options.signal ? AbortSignal.any([options.signal, idle.signal]) : idle.signal;
    arm();
    try {
      let res: Readable;
      try {
        res = await this.#t.stream({
          method: 'POST', path: '/images/create', query: { fromImage, tag }, timeoutMs: 0, signal,
          ...(options.auth ? { headers: { 'x-registry-auth': registryAuthHeader(options.auth) } } : {}),
        });
      } catch (err) {
        throw idle.signal.aborted ? stalled() : err;
      }
      res.on('data', arm);
      let failure: string | null = null;
      const broken = await consumeLines(res, (line) => {
        let p: PullProgress;
        try {
          p = JSON.parse(line) as PullProgress;
        } catch {
          return;
        }
        if (p.error || p.errorDetail?.message) failure ??= p.errorDetail?.message ?? p.error ?? 'pull failed';
        options.onProgress?.(p);
      });
      if (failure !== null) throw new DockerError('DOCKER_API', `pull of ${ref} failed: ${failure}`, { request: 'POST /images/create' });
      if (broken && idle.signal.aborted) throw stalled();
      if (broken) throw new DockerError('DOCKER_PROTOCOL', `pull of ${ref}: progress stream broke`, { request: 'POST /images/create', cause: broken });
    } finally {
      clearTimeout(timer);
    }
  }

  /** `GET /images/{name}/get`: the image as a `docker save` tarball, streamed. */
  async exportImage(name: string): Promise<Readable> {
    return this.#t.stream({ method: 'GET', path: `/images/${imagePath(name)}/get`, timeoutMs: 0 });
  }

  /** `DELETE /images/{name}`: untags, and removes the image once no tag is left. */
  async removeImage(name: string, options: { force?: boolean } = {}): Promise<void> {
    await this.#t.json({ method: 'DELETE', path: `/images/${imagePath(name)}`, query: { force: options.force } });
  }

  // ---- containers --------------------------------------------------------------------------

  /** `POST /containers/create?name=`. */
  async createContainer(body: ContainerCreateBody, name?: string): Promise<{ Id: string; Warnings?: string[] | null }> {
    return (await this.#t.json<{ Id: string; Warnings?: string[] | null }>({ method: 'POST', path: '/containers/create', query: { name }, body })).body;
  }

  /** `POST /containers/{id}/start`; an already running container (304) is fine. */
  async startContainer(id: string): Promise<void> {
    await this.#t.json({ method: 'POST', path: `/containers/${idPath(id)}/start`, accept: [304] });
  }

  /**
   * `POST /containers/{id}/stop?t=`: the image's stop signal (SIGTERM), then SIGKILL after
   * `timeoutSeconds`. An already stopped container (304) is fine.
   */
  async stopContainer(id: string, timeoutSeconds: number): Promise<void> {
    const t = Math.max(0, Math.ceil(timeoutSeconds));
    await this.#t.json({ method: 'POST', path: `/containers/${idPath(id)}/stop`, query: { t }, accept: [304], timeoutMs: t * 1000 + 60_000 });
  }

  /** `POST /containers/{id}/kill?signal=`. */
  async killContainer(id: string, signal = 'SIGKILL'): Promise<void> {
    await this.#t.json({ method: 'POST', path: `/containers/${idPath(id)}/kill`, query: { signal } });
  }

  /** `DELETE /containers/{id}?force=&v=`; `v` removes anonymous volumes only, never named ones. */
  async removeContainer(id: string, options: { force?: boolean; volumes?: boolean } = {}): Promise<void> {
    await this.#t.json({ method: 'DELETE', path: `/containers/${idPath(id)}`, query: { force: options.force, v: options.volumes } });
  }

  /** `GET /containers/{id}/json`. */
  async inspectContainer(id: string): Promise<ContainerInspect> {
    return (await this.#t.json<ContainerInspect>({ method: 'GET', path: `/containers/${idPath(id)}/json` })).body;
  }

  /** `GET /containers/json?all=&filters=`: containers carrying every given label (`key` or `key=value`). */
  async listContainers(options: { all?: boolean; labels?: readonly string[] } = {}): Promise<ContainerSummary[]> {
    const filters = options.labels?.length ? JSON.stringify({ label: options.labels }) : undefined;
    return (await this.#t.json<ContainerSummary[]>({ method: 'GET', path: '/containers/json', query: { all: options.all, filters } })).body ?? [];
  }

  /**
   * `GET /containers/{id}/logs`: demultiplexed frames to `onFrame` until the stream ends
   * (at once without `follow`; when the container stops with it).
   */
  async logs(id: string, onFrame: LogFrameHandler, options: { follow?: boolean; since?: number; tail?: number; timestamps?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    const res = await this.#t.stream({
      method: 'GET', path: `/containers/${idPath(id)}/logs`, timeoutMs: options.follow ? 0 : undefined,
      query: { stdout: true, stderr: true, follow: options.follow, since: options.since, tail: options.tail, timestamps: options.timestamps },
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const broken = await pump(res, demultiplexer(onFrame).push);
    if (broken && !options.signal?.aborted) throw new DockerError('DOCKER_PROTOCOL', `logs of ${id}: stream broke`, { request: 'GET /containers/{id}/logs', cause: broken });
  }

  /**
   * `POST /containers/{id}/attach?stream=1&stdout=1&stderr=1`: the container's output from
   * now on (not its history), demultiplexed. Attach before `start` to miss nothing. Returns
   * once attached; `ended` resolves when the container's output ends; `detach()` lets go.
   */
  async attach(id: string, onFrame: LogFrameHandler): Promise<{ ended: Promise<Error | null>; detach(): void }> {
    const stream = await this.#t.upgrade({ method: 'POST', path: `/containers/${idPath(id)}/attach`, query: { stream: true, stdout: true, stderr: true, logs: false } });
    return { ended: pump(stream, demultiplexer(onFrame).push), detach: () => stream.destroy() };
  }

  /**
   * `POST /containers/{id}/wait?condition=`: resolves with the exit status. `not-running`
   * answers at once for a container that is not running; `next-exit` waits for the next stop.
   */
  async wait(id: string, condition: 'not-running' | 'next-exit' | 'removed' = 'not-running', signal?: AbortSignal): Promise<WaitResult> {
    return (await this.#t.json<WaitResult>({
      method: 'POST', path: `/containers/${idPath(id)}/wait`, query: { condition }, timeoutMs: 0, ...(signal ? { signal } : {}),
    })).body;
  }

  // ---- volumes -----------------------------------------------------------------------------

  /** `POST /volumes/create` (local driver). */
  async createVolume(name: string, labels: Record<string, string> = {}): Promise<VolumeInspect> {
    return (await this.#t.json<VolumeInspect>({ method: 'POST', path: '/volumes/create', body: { Name: name, Driver: 'local', Labels: labels } })).body;
  }

  /** `GET /volumes/{name}`; null when there is none. */
  async inspectVolume(name: string): Promise<VolumeInspect | null> {
    try {
      return (await this.#t.json<VolumeInspect>({ method: 'GET', path: `/volumes/${idPath(name)}` })).body;
    } catch (err) {
      if (isDockerError(err, 'DOCKER_NOT_FOUND')) return null;
      throw err;
    }
  }

  /** `GET /volumes?filters=`: the volumes with every one of `labels` (`key=value`). */
  async listVolumes(options: { labels?: readonly string[] } = {}): Promise<VolumeInspect[]> {
    const filters = options.labels?.length ? JSON.stringify({ label: options.labels }) : undefined;
    return (await this.#t.json<{ Volumes?: VolumeInspect[] | null }>({ method: 'GET', path: '/volumes', query: { filters } })).body?.Volumes ?? [];
  }

  /** `DELETE /volumes/{name}`; a missing volume is fine. */
  async removeVolume(name: string, options: { force?: boolean } = {}): Promise<void> {
    try {
      await this.#t.json({ method: 'DELETE', path: `/volumes/${idPath(name)}`, query: { force: options.force } });
    } catch (err) {
      if (!isDockerError(err, 'DOCKER_NOT_FOUND')) throw err;
    }
  }

  // ---- networks ----------------------------------------------------------------------------

  /** `GET /networks/{name}`; null when there is none. */
  async inspectNetwork(name: string): Promise<NetworkInspect | null> {
    try {
      return (await this.#t.json<NetworkInspect>({ method: 'GET', path: `/networks/${idPath(name)}` })).body;
    } catch (err) {
      if (isDockerError(err, 'DOCKER_NOT_FOUND')) return null;
      throw err;
    }
  }

  /** Lets go of idle keep-alive sockets (open waits and attaches end with them). */
  close(): void {
    this.#t.close();
  }
}

/**
 * Reads a stream to its end, chunk by chunk. Resolves with the error that broke it, or null;
 * it never rejects (an attach is broken on purpose by `detach()`).
 */
function pump(stream: Readable, onChunk: (chunk: Buffer) => void): Promise<Error | null> {
  return new Promise((resolve) => {
    stream.on('data', (c: Buffer) => onChunk(c));
    stream.once('end', () => resolve(null));
    stream.once('error', (err) => resolve(err));
    stream.once('close', () => resolve(stream.readableEnded ? null : new Error('stream closed before its end')));
  });
}

/** Newline-delimited text (the pull progress stream). */
async function consumeLines(stream: Readable, onLine: (line: string) => void): Promise<Error | null> {
  let rest = '';
  const broken = await pump(stream, (c) => {
    rest += c.toString('utf8');
    let i: number;
    while ((i = rest.indexOf('\n')) >= 0) {
      const line = rest.slice(0, i).trim();
      rest = rest.slice(i + 1);
      if (line) onLine(line);
    }
  });
  if (rest.trim()) onLine(rest.trim());
  return broken;
}
