/**
 * Near-miss names: what a typo probably meant (`--prot` for `--port`, `?wiat` for `?wait`), for
 * the CLI's commands and options, config settings and the job API's query parameters.
 */

/** Letters and digits, lower case: `session-ttl`, `FLASHD_SESSION_TTL` and `sessionTtl` compare alike. */
export function normalizeName(name: string): string {
  return name.toLowerCase().replace(/[^a-z0-9]/g, '');
}

/** Edit distance with adjacent transpositions (`prot` is one edit from `port`). */
function editDistance(a: string, b: string): number {
  const d: number[][] = [];
  for (let i = 0; i <= a.length; i++) d.push([i]);
  for (let j = 1; j <= b.length; j++) (d[0] as number[])[j] = j;
  for (let i = 1; i <= a.length; i++) {
    const row = d[i] as number[];
    const prev = d[i - 1] as number[];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min((prev[j] as number) + 1, (row[j - 1] as number) + 1, (prev[j - 1] as number) + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, ((d[i - 2] as number[])[j - 2] as number) + 1);
      row[j] = v;
    }
  }
  return (d[a.length] as number[])[b.length] as number;
}

/**
 * How close `wanted` is to `form` (both normalised): 0 the same, lower closer, Infinity not close.
 * A typo or two first, fewest edits first, a prefix breaking a tie (`apikeys` is `apikey`); a
 * prefix alone after every typo: `apikeyflie` begins with `apikey` but is one edit from `apikeyfile`.
 */
export function nameScore(wanted: string, form: string): number {
  if (form === wanted) return 0;
  const prefix = wanted.length >= 4 && (form.startsWith(wanted) || wanted.startsWith(form));
  const distance = editDistance(wanted, form);
  if (distance <= Math.max(1, Math.floor(wanted.length / 4))) return distance + (prefix ? 0 : 0.5);
  return prefix ? 10 + Math.abs(form.length - wanted.length) / 100 : Infinity;
}

/** The one of `names` that `name` probably meant (a typo or two, a prefix), for the CLI's commands. */
export function closestName(name: string, names: readonly string[]): string | undefined {
  const wanted = normalizeName(name);
  if (wanted === '') return undefined;
  let best: { name: string; score: number } | undefined;
  for (const candidate of names) {
    const score = nameScore(wanted, normalizeName(candidate));
    if (score < (best?.score ?? Infinity)) best = { name: candidate, score };
  }
  return best?.name;
}
