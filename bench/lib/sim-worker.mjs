/**
 * A simulated worker speaking RunPod's worker protocol over one keep-alive connection:
 * long-poll `job-take`, then `job-done` with `{"output":{"job":<id>}}`, then take again. Zero
 * work. It records every id it received and the outcome of every result post, so the bench
 * can check that each acknowledged job completed exactly once. When flashd goes away (kill -9
 * in S7) it reconnects and re-posts an unanswered result until it gets an answer, within a
 * deadline.
 */
import { Conn, head } from './http.mjs';
import { sleep } from './procs.mjs';

export class SimWorker {
  /**
   * @param {{ host: string, port: number, endpointId: string, workerId: string, key: string,
   *           onReceive?: (id: string) => void, onDone?: (id: string) => void, retryMs?: number }} o
   */
  constructor(o) {
    this.o = o;
    this.conn = new Conn(o.host, o.port);
    this.hostHeader = `${o.host}:${o.port}`;
    this.takeHead = head('GET', `/v2/${o.endpointId}/job-take/${o.workerId}?gpu=cpu&job_in_progress=0`, this.hostHeader, o.key);
    this.donePrefix = `POST /v2/${o.endpointId}/job-done/${o.workerId}/`;
    this.doneSuffix = `?gpu=cpu&isStream=false HTTP/1.1\r\nHost: ${this.hostHeader}\r\nAuthorization: ${o.key}\r\nContent-Type: application/json`;
    this.stopped = false;
    this.reset();
    this.reconnects = 0;
    this.running = null;
    /** Between receiving a job and getting the answer to its result post. */
    this.busy = false;
  }

  start() {
    this.running = this.#loop();
    return this;
  }

  /** Stops after the current request; a parked take is cut by closing the socket. */
  async stop() {
    this.stopped = true;
    this.conn.close();
    await this.running;
  }

  /** Forgets what was recorded (between runs). */
  reset() {
    this.received = [];
    /** Result posts answered {"ok":true} without "duplicate". */
    this.accepted = [];
    this.duplicates = 0;
    this.stale = 0;
    this.unknown = 0;
    this.errors = 0;
  }

  async #ensure(deadline) {
    while (this.conn.closed && !this.stopped) {
      try {
        await this.conn.connect(2000);
        return;
      } catch {
        this.reconnects++;
        if (performance.now() > deadline) throw new Error(`worker ${this.o.workerId}: cannot reconnect`);
        await sleep(this.o.retryMs ?? 20);
      }
    }
  }

  async #loop() {
    const retryWindow = this.o.retryWindowMs ?? 60_000;
    while (!this.stopped) {
      try {
        await this.#ensure(performance.now() + retryWindow);
      } catch {
        this.errors++;
        return;
      }
      if (this.stopped) return;
      let r;
      try {
        r = await this.conn.request(this.takeHead);
      } catch {
        if (this.stopped) return;
        this.errors++;
        continue;
      }
      if (r.status === 204) continue;
      if (r.status !== 200) {
        this.errors++;
        await sleep(10);
        continue;
      }
      const b = r.body;
      const id = b.toString('latin1', 7, b.indexOf(34, 7));
      this.busy = true;
      this.received.push(id);
      this.o.onReceive?.(id);
      const reqHead = this.donePrefix + id + this.doneSuffix;
      const body = `{"output":{"job":"${id}"}}`;
      // Post the result until it is answered (flashd may be restarting), within the window.
      const deadline = performance.now() + retryWindow;
      for (;;) {
        let d;
        try {
          await this.#ensure(deadline);
          d = await this.conn.request(reqHead, body);
        } catch {
          if (this.stopped) return;
          if (performance.now() > deadline) {
            this.errors++;
            break;
          }
          continue;
        }
        if (d.status === 200) {
          if (d.body.includes('"duplicate":true')) this.duplicates++;
          else this.accepted.push(id);
          this.o.onDone?.(id);
        } else if (d.status === 409) this.stale++;
        else if (d.status === 404) this.unknown++;
        else if (d.status >= 500) {
          if (performance.now() < deadline) {
            await sleep(20);
            continue;
          }
          this.errors++;
        } else this.errors++;
        break;
      }
      this.busy = false;
    }
  }
}
