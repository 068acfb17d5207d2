/**
 * The engine's multiplexed stream format (attach and logs of a container without a TTY):
 * frames of an 8-byte header `[stream, 0, 0, 0, size uint32 big-endian]` followed by `size`
 * bytes. Stream 0 is stdin, 1 stdout, 2 stderr. Frames may be split or joined across chunks.
 * https://docs.docker.com/reference/api/engine/version/v1.47/#tag/Container/operation/ContainerAttach
 */

export type StreamName = 'stdout' | 'stderr';

const HEADER = 8;

/** Feeds chunks in; calls `onFrame` for each complete frame's payload. */
export function demultiplexer(onFrame: (stream: StreamName, payload: Buffer) => void): { push(chunk: Buffer): void } {
  let pending: Buffer = Buffer.alloc(0);
  return {
    push(chunk) {
      pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      let offset = 0;
      while (pending.length - offset >= HEADER) {
        const kind = pending[offset] as number;
        const size = pending.readUInt32BE(offset + 4);
        if (pending.length - offset - HEADER < size) break;
        const payload = pending.subarray(offset + HEADER, offset + HEADER + size);
        offset += HEADER + size;
        // stdin (0) is never sent to us; anything else unknown is treated as stdout. Empty frames carry nothing.
        if (kind !== 0 && size > 0) onFrame(kind === 2 ? 'stderr' : 'stdout', payload);
      }
      pending = offset === pending.length ? Buffer.alloc(0) : pending.subarray(offset);
    },
  };
}
