export { AuthService, requireScope, type Principal, type NewKeyInput, type IssuedKey } from './service.js';
export { RateLimiter, type RateDecision, type RateWindow } from './rate-limit.js';
export { USER_SCOPES, SCOPE_DESCRIPTIONS, isUserScope, type Scope, type UserScope } from './scopes.js';
export { generateApiKey, hashKey, checkKeyFormat } from './tokens.js';
