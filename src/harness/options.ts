/**
 * Harness options: one zod schema, parsed once at the edge, frozen, passed down.
 */
import { z } from "zod";
import { ConfigError } from "../errors.js";

/** setTimeout's longest delay (about 24.8 days): wall-time limits cannot exceed it. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Limits with their defaults. Every one is documented in the README's operations section. */
export const HarnessLimits = z.strictObject({
  /** Wall-time limit of one execution, in ms (default 30 min). */
  executionWallTimeMs: z.number().int().positive().max(MAX_TIMER_MS).default(30 * 60_000),
  /** Output captured per execution, in bytes (default 1 MiB); past it output is dropped and counted. */
  executionOutputLimitBytes: z.number().int().positive().default(1024 * 1024),
  /** How often output is committed while a cell runs, in ms (default 100). */
  outputFlushMs: z.number().int().positive().default(100),
  /** Attempts per model round (lost responses and rejected patches both count) before the run fails. */
  maxAttemptsPerTurn: z.number().int().positive().default(6),
  /** First retry delay after a failed model call, doubled each time (full jitter), in ms. */
  retryBaseMs: z.number().int().nonnegative().default(500),
  /** The longest backoff between two model calls, in ms (a provider's Retry-After may ask for more). */
  retryMaxMs: z.number().int().nonnegative().default(60_000),
  /**
   * How long a run keeps retrying a failing provider (429, 5xx, resets, timeouts) before it is parked
   * as blocked, in ms. Null (the default): as long as the run's wall budget allows (without one, until
   * the provider recovers).
   */
  modelRetryBudgetMs: z.number().int().positive().nullable().default(null),
  /** Unread observations per session before new ones are refused (the sender retries). */
  inboxLimit: z.number().int().positive().default(256),
  /** Observations delivered to one round at most; the rest wait for the next. */
  deliverPerRound: z.number().int().positive().default(32),
  /** Consecutive idle decisions after which the run ends as a failure. */
  maxIdle: z.number().int().positive().default(3),
  /** Wall-time limit of one validator, in ms. */
  validatorWallTimeMs: z.number().int().positive().max(MAX_TIMER_MS).default(10 * 60_000),
  /** Grace before SIGKILL when stopping a process group, in ms. */
  stopGraceMs: z.number().int().nonnegative().default(2000),
});
export type HarnessLimits = z.infer<typeof HarnessLimits>;

/** The limits with `overrides` applied. Throws ConfigError naming the bad limit. */
export function defaultLimits(overrides: Partial<HarnessLimits> = {}): HarnessLimits {
  const r = HarnessLimits.safeParse(overrides);
  if (!r.success) {
    throw new ConfigError(`bad harness limits: ${r.error.issues.map((i) => `${i.path.join(".") || "limits"}: ${i.message}`).join("; ")}`);
  }
  return Object.freeze(r.data);
}
