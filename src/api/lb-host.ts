/**
 * Requests for a load-balancing endpoint: `Host` is `{endpoint id}.{--endpoint-host}`, the host
 * of its `requestUrls`. flashd does not route them to workers yet, and the default endpoint host
 * (`lb.localhost:<port>`) resolves to flashd itself, so without this its own routes answered
 * there: the health URL of an endpoint with `HEALTH_CHECK_PATH=/healthz` said 200 ok with no
 * worker up. Every such request gets a 404 before the route table instead.
 */
import { AgentError } from '../core/errors.js';
import type { EndpointType, PublicUrls } from '../endpoints/index.js';
import type { RouteDecision } from '../http/index.js';
import { echoId, echoPath, problemReply } from './problem.js';

/** `--endpoint-host` (`host[:port]`, no IPv6 literal) without the port, lowercased. */
function hostname(hostAndPort: string): string {
  const colon = hostAndPort.lastIndexOf(':');
  return (colon < 0 ? hostAndPort : hostAndPort.slice(0, colon)).toLowerCase();
}

/**
 * The endpoint id in `host` when it is `{id}.{endpointHost}`, else undefined. Names are compared
 * without case (RFC 9110 §4.2.3) and ports not at all: a proxy in front, or a client that leaves
 * out a default port, sends another one. A trailing dot (an absolute name) is dropped. `apiHost`,
 * the host of `--public-url`, is never an endpoint's even when it has that form. No allocation
 * unless it matches: this runs for every request.
 */
export function loadBalancerIdOf(host: string | undefined, suffix: string, apiHost: string): string | undefined {
  if (host === undefined) return undefined;
  let end = host.lastIndexOf(':');
  if (end < 0) end = host.length;
  if (host.charCodeAt(end - 1) === 0x2e) end--;
  const start = end - suffix.length;
  // An empty id (`.lb.localhost`, or the endpoint host itself) is no endpoint's.
  if (start <= 0) return undefined;
  for (let i = suffix.length - 1; i >= 0; i--) {
    let c = host.charCodeAt(start + i);
    if (c >= 0x41 && c <= 0x5a) c += 0x20;
    if (c !== suffix.charCodeAt(i)) return undefined;
  }
  if (host.slice(0, end).toLowerCase() === apiHost) return undefined;
  return host.slice(0, start).toLowerCase();
}

/**
 * The dispatcher's `hostHandler`: a ROUTE_NOT_FOUND for every request to a load-balancing
 * endpoint's host, whatever its method and path. The endpoint host is read at the first request,
 * after listen (its default holds the bound port). The detail says whether the label before the
 * endpoint host is a load-balancing endpoint's id (`endpointType`, unscoped: ids are random), so
 * an operator who mistyped an id, or put another label in front of it, is told so.
 */
export function loadBalancerHosts(urls: PublicUrls, maxBodyBytes: number, endpointType: (id: string) => EndpointType | undefined): (method: string, path: string, headers: Readonly<Record<string, string>>) => RouteDecision | undefined {
  let suffix: string | undefined;
  let apiHost = '';
  let endpointHost = '';
  return (method, path, headers) => {
    if (suffix === undefined) {
      endpointHost = urls.endpointHost();
      suffix = '.' + hostname(endpointHost);
      apiHost = new URL(urls.queueBaseUrl()).hostname;
    }
    const id = loadBalancerIdOf(headers['host'], suffix, apiHost);
    if (id === undefined) return undefined;
    // The id and path are cut as in every other problem detail (echoId, echoPath): any Host and
    // path get a reply of bounded size.
    const shown = echoId(id);
    // An id is one label: `x.{id}.{endpoint host}` is no endpoint's address.
    const type = id.includes('.') ? undefined : endpointType(id);
    const what = type === 'LOAD_BALANCER'
      ? `that is the address of load-balancing endpoint ${shown} (requestUrls, {id}.{--endpoint-host}), and flashd does not route requests to load-balancing workers yet.`
      : type === 'QUEUE'
        ? `endpoint ${shown} is a queue endpoint, not a load-balancing one, so it has no address of its own ({id}.{--endpoint-host} is a load-balancing endpoint's); its jobs go to ${urls.queueBaseUrl()}/v2/${shown}/run.`
        : `there is no endpoint ${shown}${id.includes('.') ? ' (an endpoint id is one label: a load-balancing endpoint\'s address is {id}.{--endpoint-host})' : ''}, and flashd's own routes do not answer at {id}.{--endpoint-host}, the form of a load-balancing endpoint's address.`;
    const err = new AgentError('ROUTE_NOT_FOUND', `No route for ${method} ${echoPath(path)} at ${shown}.${endpointHost}: ${what} flashd's own API is at ${urls.queueBaseUrl()}.`);
    return { maxBodyBytes, handle: (req) => problemReply(err, req.id) };
  };
}
