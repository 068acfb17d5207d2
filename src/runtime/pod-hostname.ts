/**
 * The worker's host name in its environment: RunPod sets `RUNPOD_POD_HOSTNAME` on every worker,
 * and runpod-python (and the Python SDK, which reads `VENDOR_POD_HOSTNAME` first) put it in the
 * error report of a handler that raised (`"hostname"`), which said `"unknown"` without it.
 */

/** Both names set to `name`, unless the endpoint's env already sets one of them (theirs is kept). */
export function withPodHostname(env: Readonly<Record<string, string>>, name: string): Record<string, string> {
  if (env['RUNPOD_POD_HOSTNAME'] !== undefined || env['VENDOR_POD_HOSTNAME'] !== undefined) return { ...env };
  return { ...env, RUNPOD_POD_HOSTNAME: name, VENDOR_POD_HOSTNAME: name };
}
