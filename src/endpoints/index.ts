export { EndpointService, type EndpointEvents, type EndpointServiceOptions } from './service.js';
export { endpointView, templateView, networkVolumeView, globalVolumeView, registryView, requestUrls, type PublicUrls } from './view.js';
export * from './types.js';
export { parseArgs, shellSplit, applyCommand, encodeArgs, CommandError } from './command.js';
export { LAUNCH_REASONS, assertWithTimeoutHint, withMillisecondHint, withShapeHints } from './validate.js';
