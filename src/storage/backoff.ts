/**
 * The one retry back-off outside the replicated adapter: exponential, capped, with optional full
 * jitter. Pure (the random draw is passed in), so a caller can decide a delay from what it has read
 * and a test can fix the draw. Used by the model-call retries (src/harness/model-retry.ts) and by a
 * session driver that failed (src/harness/session.ts); an adapter may use it too (it lives in
 * src/storage, which adapters import).
 */

/** A back-off: the first retry's delay, doubled for each further one, never above the cap. */
export interface Backoff {
  /** The first retry's delay in ms (its ceiling, with jitter). */
  readonly baseMs: number;
  /** The longest delay in ms. */
  readonly maxMs: number;
}

/**
 * The delay before retry number `attempt` (1 for the first): `baseMs * 2^(attempt - 1)`, at most
 * `maxMs`. An attempt below 1 counts as 1; the exponent stops at 30, so the product stays finite.
 */
export function backoffDelay(policy: Backoff, attempt: number): number {
  const doublings = Math.min(30, Math.max(0, Math.floor(attempt) - 1));
  return Math.min(policy.maxMs, policy.baseMs * 2 ** doublings);
}

/**
 * Full jitter (AWS's name): a delay drawn uniformly from [0, backoffDelay(policy, attempt)), so that
 * many clients failing together do not retry together. `random` returns a number in [0, 1).
 */
export function jitteredDelay(policy: Backoff, attempt: number, random: () => number): number {
  return Math.floor(random() * backoffDelay(policy, attempt));
}
