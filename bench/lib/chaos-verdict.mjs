/**
 * The crash test's verdict on jobs that no acknowledged /run explains (bench/chaos.mjs).
 *
 * - `recovered`: a row whose /run was cut by a flashd kill (sent, no reply) and still became a job.
 * - `ranUncommitted`: a job a worker ran (its exec log) that has no row, whose /run was cut by a
 *   flashd kill. flashd hands a /run job to a parked job-take in the turn it arrives, before the
 *   commit that stores it (the /run reply waits for that commit and its sync), so a kill -9 in
 *   between leaves the worker running a job the restart does not know (its result post gets
 *   404). No 200 was given for it, so no promise is broken: the client saw a cut request.
 * - `unexpected`: a row or an execution that no /run of the harness carried, or whose /run was
 *   refused or acknowledged (an acknowledged job has its row; an execution of an unknown id for
 *   an acknowledged input is not that job).
 *
 * @param {{ input: string }[]} rows      the endpoint's job rows ({id, input: JSON with seq})
 * @param {Map<string, { seq: number }[]>} execs  job id -> the workers' exec log entries
 * @param {Map<number, string>} sent      seq -> 'acked' | 'unknown' | 'sending' | 'refused-<status>'
 */
export function classifyJobs(rows, execs, sent) {
  const cut = (st) => st === 'unknown' || st === 'sending';
  const ids = new Set();
  let unexpected = 0;
  let recovered = 0;
  let ranUncommitted = 0;
  for (const r of rows) {
    ids.add(r.id);
    const st = sent.get(JSON.parse(r.input).seq);
    if (st === undefined || st.startsWith('refused')) unexpected++;
    else if (st !== 'acked') recovered++;
  }
  for (const [id, list] of execs) {
    if (ids.has(id)) continue;
    if (cut(sent.get(list[0]?.seq))) ranUncommitted++;
    else unexpected++;
  }
  return { unexpected, recovered, ranUncommitted };
}
