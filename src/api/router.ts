/**
 * A segment trie: static segments win over `{param}` segments, so `/v2/serverless` is never
 * taken for a queue operation on an endpoint called "serverless". Matching a path that exists
 * with another method gives the allowed methods for a 405.
 */
export interface Match<R> {
  route: R;
  params: Record<string, string>;
}

interface Node<R> {
  statics: Map<string, Node<R>>;
  param?: { name: string; node: Node<R> };
  routes: Map<string, R>;
}

const newNode = <R>(): Node<R> => ({ statics: new Map(), routes: new Map() });

export class Router<R> {
  readonly #root: Node<R> = newNode();

  add(method: string, path: string, route: R): void {
    let node = this.#root;
    for (const seg of path.split('/').filter(Boolean)) {
      const m = /^\{(\w+)\}$/.exec(seg);
      if (m) {
        if (node.param && node.param.name !== m[1]) throw new Error(`conflicting parameter names at ${path}`);
        node.param ??= { name: m[1] as string, node: newNode() };
        node = node.param.node;
      } else {
        let next = node.statics.get(seg);
        if (!next) node.statics.set(seg, (next = newNode()));
        node = next;
      }
    }
    if (node.routes.has(method)) throw new Error(`duplicate route ${method} ${path}`);
    node.routes.set(method, route);
  }

  /**
   * The route for method and path; `allowed` lists methods when only the method is wrong;
   * `emptyParam` names a `{param}` that an empty segment inside the path stands where (see below).
   */
  find(method: string, path: string): { match?: Match<R>; allowed?: string[]; emptyParam?: string } {
    const parts = path.split('/');
    // `/v2/serverless//logs` is what a script sends when the variable holding the id is unset:
    // collapsed, it would match `/v2/serverless/{endpointId}` with the id "logs" (a 404 naming
    // the wrong thing). Empty segments between others are first tried as empty parameters.
    // (Only where the path has a `//`: no array is copied for every request.)
    if (parts[0] === '' && path.includes('//')) {
      const inner = parts.slice(1, parts.at(-1) === '' ? -1 : undefined);
      const params: Record<string, string> = {};
      if (inner.includes('') && this.#walk(this.#root, inner, 0, params)) {
        const empty = Object.keys(params).find((name) => params[name] === '');
        if (empty !== undefined) return { emptyParam: empty };
      }
    }
    // Empty segments (leading, trailing or doubled slashes) do not count, as in `add`.
    const segs = parts.includes('') ? parts.filter(Boolean) : parts;
    const params: Record<string, string> = {};
    const node = this.#walk(this.#root, segs, 0, params);
    const route = node?.routes.get(method) ?? (method === 'HEAD' ? node?.routes.get('GET') : undefined);
    if (route) return { match: { route, params } };
    // `/v2/{endpointId}/status/` is `…/status/$JOB` with JOB unset, `DELETE /v2/serverless/` is
    // `…/serverless/$EP` with EP unset: when the path without its trailing slash has no route
    // for this method, its last segment is tried as an empty parameter too.
    if (parts.length > 2 && parts.at(-1) === '' && parts.at(-2) !== '') {
      const withEmpty: Record<string, string> = {};
      const last = this.#walk(this.#root, [...segs, ''], 0, withEmpty);
      if (last && (!node || last.routes.has(method) || (method === 'HEAD' && last.routes.has('GET')))) {
        const empty = Object.keys(withEmpty).find((name) => withEmpty[name] === '');
        if (empty !== undefined) return { emptyParam: empty };
      }
    }
    if (!node) return {};
    return { allowed: [...node.routes.keys()] };
  }

  /**
   * For a path with no route: the path of a route for `method` that it nearly names, or
   * undefined. Near: static segments that differ only in letter case, `-` or `_` (`/runSync`,
   * the `requestUrls` key, for `/runsync`; `/purgeQueue`; `/v2/api_keys`), or a job route
   * written under `/v2/serverless/`, `/v1/` or without `/v2/`. Parameter segments are kept as
   * written. Only for a 404's detail: never routed to.
   */
  suggest(method: string, path: string): string | undefined {
    const segs = path.split('/').filter(Boolean);
    if (segs.length === 0 || segs.length > 16) return undefined;
    const tries = [segs];
    if (segs[0] === 'v2' && segs[1]?.toLowerCase() === 'serverless' && segs.length >= 4) tries.push(['v2', ...segs.slice(2)]);
    if (segs[0] === 'v1') tries.push(['v2', ...segs.slice(1)]);
    if (segs[0] !== 'v1' && segs[0] !== 'v2') tries.push(['v2', ...segs]);
    for (const candidate of tries) {
      const out: string[] = [];
      const node = this.#nearWalk(this.#root, candidate, 0, out);
      if (node && (node.routes.has(method) || (method === 'HEAD' && node.routes.has('GET')))) return `/${out.join('/')}`;
    }
    return undefined;
  }

  #nearWalk(node: Node<R>, segs: string[], i: number, out: string[]): Node<R> | undefined {
    if (i === segs.length) return node.routes.size ? node : undefined;
    const seg = segs[i] as string;
    const near = seg.toLowerCase().replace(/[-_]/g, '');
    for (const [name, next] of node.statics) {
      if (name !== seg && name.replace(/-/g, '') !== near) continue;
      out.push(name);
      const found = this.#nearWalk(next, segs, i + 1, out);
      if (found) return found;
      out.pop();
    }
    if (node.param) {
      out.push(seg);
      const found = this.#nearWalk(node.param.node, segs, i + 1, out);
      if (found) return found;
      out.pop();
    }
    return undefined;
  }

  #walk(node: Node<R>, segs: string[], i: number, params: Record<string, string>): Node<R> | undefined {
    if (i === segs.length) return node.routes.size ? node : undefined;
    const seg = segs[i] as string;
    const s = node.statics.get(seg);
    if (s) {
      const found = this.#walk(s, segs, i + 1, params);
      if (found) return found;
    }
    if (node.param) {
      let value = seg;
      if (seg.includes('%')) {
        try {
          value = decodeURIComponent(seg);
        } catch {
          return undefined;
        }
      }
      const found = this.#walk(node.param.node, segs, i + 1, params);
      if (found) {
        params[node.param.name] = value;
        return found;
      }
    }
    return undefined;
  }
}
