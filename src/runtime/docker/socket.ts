/** Finding the Docker Engine API socket (`--runtime auto|docker`). */
import { statSync } from 'node:fs';

/** The first path that is a unix socket, or null. */
export function findEngineSocket(candidates: readonly string[]): string | null {
  for (const path of candidates) {
    try {
      if (statSync(path).isSocket()) return path;
    } catch {
      // missing or unreadable: try the next
    }
  }
  return null;
}
