import type { AuthService } from '../auth/index.js';
import type { EndpointService, PublicUrls } from '../endpoints/index.js';

/** One GPU as the installation sees it (fed by gpu/ discovery). */
export interface InventoryGpu {
  gpuTypeId: string | null;
  name: string;
  cudaVersion: string | null;
  dataCenterId: string;
  free: boolean;
}

/** What the route handlers are built from: plain components, wired in app.ts. */
export interface ApiServices {
  endpoints: EndpointService;
  auth: AuthService;
  urls: PublicUrls;
  dataCenters(): readonly { id: string; name: string }[];
  inventory(): readonly InventoryGpu[];
  version: string;
}
