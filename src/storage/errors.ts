/**
 * The Storage errors (ARCHITECTURE.md section 5). Each has a stable `code`; adapters map their
 * engine's errors into these in one function each.
 */
import { CairnError } from "../errors.js";

export type ResetAction = "stop" | "reopen";
export type ResetReason = "fenced" | "deleted" | "diverged" | "closed";

/**
 * The database was taken over (`fenced`, action `stop`), deleted or diverged. A process that gets
 * `action: "stop"` stops and alerts; it never reopens on its own, which would take the database back
 * from the new owner.
 */
export class ResetError extends CairnError {
  readonly action: ResetAction;
  readonly reason: ResetReason;

  constructor(action: ResetAction, reason: ResetReason, message: string, options: { cause?: unknown } = {}) {
    super("reset", message, { retryable: false, ...options });
    this.name = "ResetError";
    this.action = action;
    this.reason = reason;
  }

  /** The database was opened by another process: this handle must stop, and never reopen itself. */
  static fenced(name: string, ownEpoch: number, currentEpoch: number | null): ResetError {
    const who = currentEpoch === null ? "another process" : `another process (epoch ${currentEpoch})`;
    return new ResetError(
      "stop",
      "fenced",
      `database "${name}" was opened by ${who} after this one (epoch ${ownEpoch}); this process no longer owns it and must stop. Do not restart it here unless the other owner is gone.`,
    );
  }
}

/**
 * `compacted`: a read asked for events that replicated storage dropped after a snapshot (and this
 * machine's copy does not hold); start from `latestSnapshot()` and read after its seq.
 */
export type RejectedReason = "duplicate_identity" | "too_large" | "backlog_full" | "invalid" | "not_found" | "conflict" | "compacted";

/** Nothing became durable; the caller may retry later (or, for `duplicate_identity`, read the log). */
export class StorageRejected extends CairnError {
  readonly reason: RejectedReason;
  /** For `duplicate_identity`: the identities that already exist. */
  readonly identities: readonly string[];

  constructor(reason: RejectedReason, message: string, options: { cause?: unknown; identities?: readonly string[] } = {}) {
    super("rejected", message, { retryable: reason === "backlog_full", cause: options.cause });
    this.name = "StorageRejected";
    this.reason = reason;
    this.identities = options.identities ?? [];
  }
}

/**
 * The outcome of a commit is unknown. The handle is poisoned: every later call throws this too.
 * Reopen and read the log to learn the truth.
 */
export class StorageFailure extends CairnError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super("uncertain", message, { retryable: false, ...options });
    this.name = "StorageFailure";
  }
}

/** The named database does not exist (only when the caller asked not to create it). */
export class DatabaseNotFound extends CairnError {
  constructor(name: string) {
    super("not_found", `database "${name}" does not exist; start a run with \`cairn run\` to create it, or check --db and --data-dir.`);
    this.name = "DatabaseNotFound";
  }
}

/** The storage cannot be reached or used at all (a missing directory, a down cluster at open). */
export class StorageUnavailable extends CairnError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super("unavailable", message, { retryable: true, ...options });
    this.name = "StorageUnavailable";
  }
}
