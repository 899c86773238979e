/**
 * What the partition test and its owner process (owner.ts) tell each other: the owner's config (its
 * only argument, as JSON) and the JSON lines it prints on stdout.
 */

/** The session of owner A's events. */
export const OWNER_SESSION = "a";

/** What the test passes to owner.ts. */
export interface OwnerConfig {
  readonly endpoints: readonly string[];
  readonly dataDir: string;
  readonly db: string;
  /** Concurrent committers (default 3). */
  readonly workers?: number;
  /** Pause of a worker after each settled commit, in ms (default 20). */
  readonly pauseMs?: number;
  /** The adapter's per-request deadline (default: the adapter's). */
  readonly commitTimeoutMs?: number;
  /** Interval of the "stats" lines in ms (default 200). */
  readonly statsEveryMs?: number;
}

/** One line owner.ts prints. */
export interface OwnerLine {
  readonly t: "opened" | "submit" | "ok" | "err" | "signal" | "stats" | "paused" | "resumed" | "closed" | "fatal";
  readonly id?: string;
  readonly firstSeq?: number;
  readonly lastSeq?: number;
  readonly epoch?: number;
  readonly head?: number;
  readonly code?: string | null;
  readonly action?: string | null;
  readonly reason?: string | null;
  readonly message?: string;
  readonly signal?: { type: string; epoch?: number | null };
  /** On "stats" lines (every `statsEveryMs`): the handle's `stats()`. */
  readonly stats?: { commitTxns: number; quorumHeld?: boolean; membersReachable?: number; backlogCommits?: number; fenced: boolean };
}
