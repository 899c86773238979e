/**
 * How a harness stops being the owner: what a failed commit means for it, and what it says when it
 * stops. The Harness acts on these; nothing here has effects.
 */
import { ResetError, StorageFailure } from "../storage/errors.js";
import { hasCode } from "../errors.js";

export type StopReason = "fenced" | "poisoned" | "unreachable";

/**
 * What a failed commit says: `fenced` (another process owns the database now), `poisoned` (the
 * outcome is unknown; only a reopen can read the truth), `rejected` (refused, nothing written, the
 * harness goes on), or null (an error that says nothing about ownership).
 */
export function commitFailure(err: unknown): "fenced" | "poisoned" | "rejected" | null {
  if (err instanceof ResetError || hasCode(err, "reset")) return "fenced";
  if (err instanceof StorageFailure || hasCode(err, "uncertain")) return "poisoned";
  if (hasCode(err, "rejected")) return "rejected";
  return null;
}

/** The log line for a stop, when it deserves one (a lost lease is logged where it is noticed). */
export const STOP_MESSAGES: Readonly<Partial<Record<StopReason, string>>> = {
  fenced: "fenced: another process opened this database; launching nothing more and stopping running cells",
  poisoned: "a commit's outcome is unknown; the handle is poisoned: reopen to read the truth",
};

/**
 * Waits for `work`, but no longer than `ms` (Infinity: as long as it takes). A stopped harness uses
 * it at close: a commit still in flight may wait for a quorum this process cannot reach, and its
 * outcome no longer matters here (the next owner reads the truth from the log).
 */
export function settleWithin(work: Promise<unknown>, ms: number): Promise<unknown> {
  if (ms === Infinity) return work;
  return Promise.race([work, new Promise<void>((resolve) => setTimeout(resolve, ms).unref())]);
}
