/**
 * What a failed model call leads to: retry after a backoff, park the run as blocked, or end it.
 *
 * Transient failures (429, 5xx, resets, timeouts: a retryable ModelError) retry with exponential
 * backoff and full jitter (src/storage/backoff.ts: a delay drawn uniformly from
 * [0, min(max, base * 2^(n-1))]), never sooner
 * than the provider's Retry-After, for as long as the retry budget allows (default: the run's wall
 * budget). Authentication, permission and configuration failures, and a spent retry budget, park the
 * run: no retry can fix them, an operator can. Anything else that is not retryable ends the run.
 * An error that is not a ModelError (a provider bug) is retried like an unusable answer.
 *
 * Pure: the clock and the random draw are inputs.
 */
import { hasCode } from "../errors.js";
import { jitteredDelay } from "../storage/backoff.js";
import type { TokenUsage } from "../state/events.js";
import type { HarnessLimits } from "./options.js";

export type BlockCause = "auth" | "config" | "retry_budget";

/** Thrown by a session driver once `run_blocked` is committed: the run waits for `cairn resume`. */
export class RunBlocked extends Error {
  /** `config`: an operator has to fix something; the CLI exits 2. */
  readonly code = "config" as const;
  override readonly cause: BlockCause;
  readonly error: unknown;
  constructor(cause: BlockCause, reason: string, error: unknown) {
    super(reason);
    this.name = "RunBlocked";
    this.cause = cause;
    this.error = error;
  }
}

export type FailurePlan = { readonly message: string; readonly failure: string; readonly usage: TokenUsage | null } & (
  | { readonly action: "retry"; readonly delayMs: number }
  | { readonly action: "block"; readonly cause: BlockCause; readonly reason: string }
  | { readonly action: "end" }
);

export interface FailureContext {
  /** 1 for the first failure in a row, 2 for the second... */
  readonly attemptInStreak: number;
  /** How long calls have been failing in a row, in ms. */
  readonly failingForMs: number;
  readonly limits: Pick<HarnessLimits, "retryBaseMs" | "retryMaxMs" | "modelRetryBudgetMs">;
  /** What is left of the run's wall budget, in ms, or null when it has none. */
  readonly wallLeftMs: number | null;
  /** A uniform draw in [0, 1). */
  readonly random: () => number;
}

const MAX_MESSAGE = 2000;

/** Decides what follows a failed call; see the module comment. */
export function modelFailurePlan(err: unknown, ctx: FailureContext): FailurePlan {
  const raw = err instanceof Error ? err.message : String(err);
  const message = raw.length > MAX_MESSAGE ? `${raw.slice(0, MAX_MESSAGE)}…` : raw;
  const isModel = hasCode(err, "model");
  const me = err as { kind?: unknown; retryable?: unknown; usage?: TokenUsage | null; retryAfterMs?: unknown };
  const kind = isModel && typeof me.kind === "string" ? me.kind : "unknown";
  const usage = isModel ? (me.usage ?? null) : null;
  const base = { message, failure: kind, usage };
  if (kind === "auth") {
    return { ...base, action: "block", cause: "auth", reason: `the provider refused the credentials: ${message}. Fix the key, then run \`cairn resume\`: the run continues where it was` };
  }
  if (kind === "config") {
    return { ...base, action: "block", cause: "config", reason: `the model is misconfigured: ${message}. Fix it, then run \`cairn resume\`: the run continues where it was` };
  }
  const retryable = isModel ? me.retryable === true : true;
  if (!retryable) return { ...base, action: "end" };
  let delayMs = jitteredDelay({ baseMs: ctx.limits.retryBaseMs, maxMs: ctx.limits.retryMaxMs }, ctx.attemptInStreak, ctx.random);
  const after = typeof me.retryAfterMs === "number" && Number.isFinite(me.retryAfterMs) ? me.retryAfterMs : null;
  if (after !== null) delayMs = Math.max(delayMs, Math.ceil(after));
  const budget = ctx.limits.modelRetryBudgetMs;
  if (budget !== null && ctx.failingForMs + delayMs > budget) {
    const spent = Math.round(ctx.failingForMs / 1000);
    return {
      ...base,
      action: "block",
      cause: "retry_budget",
      reason: `the provider kept failing for ${spent} s (retry budget ${Math.round(budget / 1000)} s; last: ${message}); once it is back, run \`cairn resume\`: the run continues where it was`,
    };
  }
  return { ...base, action: "retry", delayMs };
}
