/** The HTTP adapter's surface: a uWebSockets.js server that speaks plain request/reply objects. */
export {
  createHttpServer,
  type HttpServer,
  type HttpServerOptions,
  type IncomingRequest,
  type OutgoingReply,
  type RouteDecision,
  type StreamWriter,
} from './server.js';
