export { AuthService, requireScope, type Principal, type NewKeyInput, type IssuedKey } from './service.js';
export { RateLimiter, type RateDecision, type RateWindow } from './rate-limit.js';
export { JobRateLimiter, JOB_RATE_QUOTAS, JOB_RATE_WINDOW_SECONDS, type JobRateDecision, type JobRateGroup, type JobRateQuota } from './job-rate-limit.js';
export { USER_SCOPES, SCOPE_DESCRIPTIONS, isUserScope, type Scope, type UserScope } from './scopes.js';
export { generateApiKey, hashKey, checkKeyFormat } from './tokens.js';
