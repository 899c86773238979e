/**
 * Self-fencing by the owner's lease: what a harness does with `Database.lease`.
 *
 * - Before a new owner launches anything, every earlier owner's lease must be gone
 *   (`openAfterPrevious`, which `Harness.open` calls to claim the database): an owner cut off from
 *   the cluster may still be running cells, and it stops them before its lease can have expired.
 * - When this owner's lease is lost (it could not renew in time: cut off, or its renewals went
 *   unanswered, or it was frozen past it), `guardLease` SIGKILLs the process groups of the cells it
 *   launched on this host at once (no grace: the lease deadline counts) and stops the harness: no
 *   launch, no model call, no commit. It then asks the storage, for a bounded time, whether another
 *   process claimed the database: the harness stops as "fenced" when one did (the CLI exits 3), as
 *   "unreachable" when the storage does not answer in time or shows no other owner (exit 4).
 * - Once the harness has stopped its cells (fenced, poisoned or closed), the lease is released so
 *   that the next owner need not wait for it to run out.
 *
 * Safety never rests on this: a fenced owner's writes are refused by its epoch, whatever the clocks.
 */
import type { Logger } from "pino";
import { hostName } from "../exec/identity.js";
import { signalGroup } from "../exec/group.js";
import { CellKeeper } from "../exec/keeper.js";
import type { LogEvent } from "../state/events.js";
import type { Database, Storage } from "../storage/contract.js";
import { ResetError, StorageUnavailable } from "../storage/errors.js";

/**
 * Opens `name` on `storage` (claiming it: every earlier opener is fenced) and returns only once every
 * earlier owner's lease is gone: an earlier owner's cells may still act until then, so nothing may
 * launch before. When the wait fails, the handle is closed again.
 */
export async function openAfterPrevious(storage: Storage, name: string, create: boolean, logger: Logger): Promise<Database> {
  const db = await storage.open(name, { create });
  try {
    await awaitPrevious(db, logger);
    return db;
  } catch (err) {
    await db.close().catch(() => undefined);
    throw err;
  }
}

/** Waits until every earlier owner's lease is gone (no wait without a lease, or when none is left). */
async function awaitPrevious(db: Database, logger: Logger): Promise<void> {
  const lease = db.lease;
  if (lease === undefined) return;
  const t0 = performance.now();
  await lease.previousGone();
  const waited = performance.now() - t0;
  if (waited > 50) logger.info({ waitedMs: Math.round(waited) }, "the previous owner's lease is gone: launching is allowed");
}

/** What `guardLease` needs from its harness (kept narrow so the harness files stay apart). */
export interface LeaseHost {
  readonly name: string;
  follow(listener: (events: readonly LogEvent[]) => void): () => void;
  onStop(listener: () => void): () => void;
  /**
   * Stops acting at once (no launch, no model call, no commit); running cells are stopped. The stop
   * is told once `fenced` resolves: as that ResetError (status "fenced"), or as `error` (status
   * "unreachable") when it resolves with null.
   */
  loseOwnership(error: StorageUnavailable, fenced: Promise<ResetError | null>): void;
}

/**
 * How long a harness that lost a lease asks the storage whether it was fenced. A takeover claims
 * right after it took the lease, so its claim lands within this; a quorum loss answers nothing.
 */
const FENCE_PROBE_MS = 3000;
const FENCE_PROBE_EVERY_MS = 200;

/**
 * Whether another process claimed `db`: the ResetError "fenced" a read of its head throws within
 * `probeMs` (asked again while the storage answers without it); else null: the storage did not
 * answer in time, or this process still holds the epoch and only its lease ran out.
 */
export async function probeFence(db: Database, probeMs = FENCE_PROBE_MS): Promise<ResetError | null> {
  const end = performance.now() + probeMs;
  while (performance.now() < end) {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      // Not unref'd: a process whose harness waits for this answer must not exit for want of work.
      timer = setTimeout(() => resolve("late"), Math.max(1, end - performance.now()));
    });
    const asked = db.head().then(
      () => "answered" as const,
      (err: unknown) => (err instanceof ResetError && err.reason === "fenced" ? err : ("answered" as const)),
    );
    try {
      const r = await Promise.race([asked, late]);
      if (r instanceof ResetError) return r;
      if (r === "late") return null;
    } finally {
      clearTimeout(timer);
    }
    await new Promise((resolve) => setTimeout(resolve, FENCE_PROBE_EVERY_MS));
  }
  return null;
}

/** The error a harness stops with when a lease of its owner was lost and no fence was found. */
export function lostLeaseError(name: string, why: string): StorageUnavailable {
  return new StorageUnavailable(
    `lost the ownership lease of database "${name}" (${why}): the storage could not be reached in time, so this process killed its running cells and stopped acting; another process may own the database now. Restart it only where the storage is reachable.`,
  );
}

/** Installs the self-fencing hook; returns its remover. */
export function guardLease(h: LeaseHost, db: Database, logger: Logger): () => void {
  const lease = db.lease;
  if (lease === undefined) return () => {};
  const host = hostName();
  /** Process groups of the cells this harness launched on this host and not yet seen finish. */
  const groups = new Map<string, number>();
  // Holds those groups to the lease even when this process is frozen or dead (src/exec/keeper.ts).
  const keeper = new CellKeeper(() => lease.remainingMs() - 50, h.name);
  const unfollow = h.follow((events) => {
    for (const e of events) {
      if (e.kind === "execution_started" && e.body.host === host) {
        groups.set(`${e.session}/${e.body.cell_id}`, e.body.pgid);
        keeper.add(e.body.pgid, e.body.start_time);
      } else if (e.kind === "execution_finished") {
        const k = `${e.session}/${e.body.cell_id}`;
        const pgid = groups.get(k);
        if (pgid !== undefined) keeper.drop(pgid);
        groups.delete(k);
      }
    }
  });
  const unlost = lease.onLost((reason) => {
    for (const pgid of groups.values()) {
      try {
        signalGroup(pgid, "SIGKILL");
      } catch {
        // a pgid <= 1 is never signalled
      }
    }
    logger.error({ reason, killedGroups: [...groups.values()] }, "ownership lease lost: killed the cells' process groups; acting no more");
    h.loseOwnership(lostLeaseError(h.name, reason), probeFence(db));
  });
  // Stopped (fenced, poisoned, closed: the drivers stopped every cell first; or the lease lost: the
  // cells were killed above): nothing is left for the keeper, and the lease can go.
  const unstop = h.onStop(() => {
    keeper.close(true);
    void lease.release();
  });
  return () => {
    unfollow();
    unlost();
    unstop();
  };
}
