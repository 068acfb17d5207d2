import type { AuthService } from '../auth/index.js';
import type { EndpointService, PublicUrls } from '../endpoints/index.js';
import type { InventoryGpuRow as InventoryGpu } from '../gpu/index.js';

/** One GPU as the installation sees it (gpu/ discovery and the reservation ledger). */
export type { InventoryGpu };

/** What the route handlers are built from: plain components, wired in app.ts. */
export interface ApiServices {
  endpoints: EndpointService;
  auth: AuthService;
  urls: PublicUrls;
  dataCenters(): readonly { id: string; name: string }[];
  inventory(): readonly InventoryGpu[];
  version: string;
  /**
   * Workers run the endpoint's command on the host as flashd's user (`--runtime process`):
   * creating an endpoint or changing what it runs needs the admin scope.
   */
  commandsRunOnHost: boolean;
  /**
   * The name of the container runtime that starts workers (`docker`), null with the process
   * runtime or none: the endpoint view says when it cannot start an endpoint (`startBlocked`).
   */
  containerRuntime: string | null;
}
