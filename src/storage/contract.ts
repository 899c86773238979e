/**
 * The Storage contract (ARCHITECTURE.md section 5): one narrow interface, adapters behind it (memory,
 * sqlite and replicated in this repository; others outside it), the rules they share in
 * `semantics.ts` and `handle.ts`, and one conformance suite (`conformance/`, exported as
 * `cairn/storage/conformance`) that every adapter runs.
 *
 * Ownership: `Storage.open(name)` claims the database. The last opener wins: every earlier handle is
 * fenced, and its next call (commit, read, drain, ack) throws `ResetError {action: "stop", reason:
 * "fenced"}` and writes nothing. Readers (`Storage.reader`) and posters (`Storage.post`) never take
 * ownership, so `cairn status` and `cairn post` never disturb the running owner.
 *
 * Errors: `ResetError` (taken over, deleted, diverged), `StorageRejected` (nothing became durable:
 * duplicate identity, too large, backlog full), `StorageFailure` (outcome unknown; the handle is
 * poisoned until reopened). Never "not found" for an outage: failure is a throw.
 */
import type { LogEvent, NewEvent } from "../state/events.js";

/**
 * The name an adapter declares for itself ("memory", "sqlite", "replicated", or any other adapter's
 * own name): it labels metrics and logs. Adding an adapter never edits this contract.
 */
export type AdapterName = string;

/** What a resolved commit returns: the sequence numbers the batch received, in order. */
export interface CommitReceipt {
  readonly firstSeq: number;
  readonly lastSeq: number;
}

/** An outside observation, posted to a database's mailbox by anyone, without taking ownership. */
export interface MailboxMessage {
  /** Stable id chosen by the sender: delivering the same id again is a no-op. */
  readonly id: string;
  readonly session: string;
  readonly kind: string;
  readonly payload: unknown;
  readonly at: string;
}

/** A message as the owner drains it: `mseq` orders the mailbox and is what `ack` takes. */
export interface PostedMessage extends MailboxMessage {
  readonly mseq: number;
}

/** What `watch` reports: new mail arrived, or this handle was fenced by a newer opener. */
export type DatabaseSignal = { type: "mailbox" } | { type: "fenced"; epoch: number | null } | { type: "appended"; seq: number };

/** Counters an adapter can report; every field optional (the memory adapter has no quorum). */
export interface DatabaseStats {
  readonly adapter: AdapterName;
  readonly epoch: number;
  readonly fenced: boolean;
  readonly poisoned: boolean;
  /** Replicated only: members answering, and whether a majority does. */
  readonly membersReachable?: number;
  readonly membersTotal?: number;
  readonly quorumHeld?: boolean;
  /** Commits waiting for the quorum, and their bytes. */
  readonly backlogCommits?: number;
  readonly backlogBytes?: number;
  /** Seconds spent waiting for quorum since open. */
  readonly quorumWaitSeconds?: number;
}

/**
 * The owner's lease: liveness for the world outside the log, never safety (that is the
 * epoch: a fenced handle writes nothing, whatever the clocks say). The owner renews it; when it
 * cannot be sure it still holds it, `onLost` fires early enough that its cells can be stopped before
 * the lease can have expired anywhere (clocks may drift by a bounded rate; no bound on skew is needed:
 * every duration is measured on one machine's monotonic clock). A new owner launches nothing until
 * `previousGone()` resolves.
 */
export interface OwnershipLease {
  /** The lease's length in ms. */
  readonly ttlMs: number;
  /** Resolves once every earlier owner's lease is gone: released by a clean close, expired, or its process on this host gone. */
  previousGone(): Promise<void>;
  /** Calls `listener` once when this owner can no longer be sure it holds the lease: stop acting at once. Returns an unsubscribe. */
  onLost(listener: (reason: string) => void): () => void;
  /** Whether the lease is held (renewed in time and not released). */
  held(): boolean;
  /**
   * How long, in ms from now, this owner is still sure to hold the lease without another renewal:
   * the moment `onLost` would fire, which lies a margin before the lease can expire anywhere. 0 once
   * lost or released. The cell keeper (src/exec/keeper.ts) kills the owner's cells at that moment
   * when the owner can no longer do it itself.
   */
  remainingMs(): number;
  /** Gives the lease up now (after the owner's cells are stopped); the next owner need not wait for it. Idempotent, bounded, never throws. */
  release(): Promise<void>;
}

/**
 * A projection snapshot as stored: the log position it covers (`seq`: the events 1..seq are folded
 * into it) and its text (opaque to the storage; see src/state/snapshot.ts). Adapters store a digest
 * with it and check it on read, so a damaged snapshot is reported (StorageFailure), never returned.
 */
export interface StoredSnapshot {
  readonly seq: number;
  readonly data: string;
  /**
   * True when the adapter checked `data` against the digest taken when it was written (every
   * adapter in this tree does, through `verifiedSnapshot`). Opening then trusts the text's shape to
   * be what this code's `encodeSnapshot` wrote and checks its structure only; a snapshot without it
   * is validated against the full schema.
   */
  readonly verified?: boolean;
}

/** An owned database: the only handle that may append. */
export interface Database {
  readonly name: string;
  /** The ownership epoch this handle claimed at open; strictly greater than every earlier opener's. */
  readonly epoch: number;

  /**
   * True when concurrent `commit()` calls are grouped into one durable write (the replicated
   * adapter: one etcd transaction for the batches queued while the last one was in flight). A
   * caller may then send several batches without waiting for each. Each batch still succeeds or
   * fails alone, and seqs follow the call order, except that a batch held back behind one with the
   * same identity may land after later ones. Absent or false: send one batch at a time, as nothing
   * is gained by sending more.
   */
  readonly groupsCommits?: boolean;

  /**
   * Committed events with `seq > afterSeq` (default 0), in order, at most `limit` of them (default:
   * all). Throws ResetError when fenced, StorageFailure when poisoned.
   */
  read(afterSeq?: number, limit?: number): Promise<LogEvent[]>;

  /**
   * Appends the batch atomically: all of it becomes durable, or none. Resolves only when durable as
   * the adapter promises (fsynced; held by 2 of 3 zones). An identity already in the log, or twice in
   * the batch, refuses the whole batch with `StorageRejected {reason: "duplicate_identity"}`.
   * An empty batch is refused as `invalid`.
   */
  commit(events: readonly NewEvent[]): Promise<CommitReceipt>;

  /** The highest committed seq (0 for an empty log). Fenced and poisoned handles throw. */
  head(): Promise<number>;

  /**
   * Stores `data`, the projection of the events 1..seq, as the latest snapshot, atomically (a crash
   * leaves the previous snapshot in place). `seq` must be a committed seq (1..head), not below the
   * latest snapshot's (else StorageRejected `invalid`). Snapshots never change the log's meaning;
   * an adapter may then drop log entries before `seq` from replicated storage (the replicated
   * adapter does, after this resolves; its local copy keeps them). Owner only: fenced handles throw.
   */
  writeSnapshot(seq: number, data: string): Promise<void>;

  /** The latest snapshot, or null when none was written. Throws StorageFailure when it is damaged. */
  latestSnapshot(): Promise<StoredSnapshot | null>;

  /** Mailbox messages not yet acknowledged, in post order. Fenced handles throw. */
  drain(): Promise<PostedMessage[]>;

  /** Removes mailbox messages with `mseq <= upTo`: call after their events are committed. */
  ack(upTo: number): Promise<void>;

  /**
   * Calls `listener` when mail arrives or when this handle is fenced (promptly: within a few seconds,
   * without waiting for the next commit). Returns a function that stops watching.
   */
  watch(listener: (signal: DatabaseSignal) => void): () => void;

  /** Current counters; never throws. */
  stats(): DatabaseStats;

  /** The owner's lease (sqlite and replicated; the memory adapter has none: one process). */
  readonly lease?: OwnershipLease;

  /** Releases the handle. Idempotent. Does not give up the epoch: a later opener still advances it. */
  close(): Promise<void>;
}

/** A read-only view of a database, without ownership. */
export interface Reader {
  readonly name: string;
  read(afterSeq?: number, limit?: number): Promise<LogEvent[]>;
  head(): Promise<number>;
  /** Mailbox messages not yet acknowledged by the owner, in post order (read only; optional). */
  pending?(): Promise<PostedMessage[]>;
  /** As `Database.latestSnapshot`. */
  latestSnapshot(): Promise<StoredSnapshot | null>;
  close(): Promise<void>;
}

/**
 * Who owns a database, as its owner lease records it (liveness only, never safety: fencing by epoch
 * stays the guarantee). `epoch` is null between taking the lease and claiming the epoch.
 */
export interface OwnerInfo {
  readonly host: string;
  readonly pid: number;
  /** ISO time the holder took the lease. */
  readonly since: string;
  readonly epoch: number | null;
  /** The command holding it: serve, run, resume. */
  readonly role: string;
}

/** A lease as read by anyone: live while its holder keeps renewing it (itself, in its own process). */
export interface LeaseView {
  readonly owner: OwnerInfo;
  readonly live: boolean;
}

/** A lease this process holds; renewed by this process until released or lost. */
export interface HeldLease {
  /** Records the epoch the holder claimed. */
  update(epoch: number): Promise<void>;
  /** Called once when the lease could not be renewed in time or was taken by a forced acquire. */
  onLost(listener: (why: string) => void): void;
  /** Stops renewing and removes the lease if it is still ours (a standby then takes over at once). */
  release(): Promise<void>;
}

/**
 * A place in the queue of processes waiting for a database's lease, kept alive by this process (a
 * waiter that dies or freezes drops out after the lease length). When the lease falls free, the
 * oldest live waiter takes it first: a worker restarted by a restart-always scheduler queues behind
 * the standby that waited longer instead of racing it.
 */
export interface LeaseTicket {
  /** Leaves the queue (idempotent). */
  withdraw(): Promise<void>;
}

/**
 * Owner leases of an adapter whose databases are shared by several processes (sqlite on one host,
 * replicated anywhere). A starting worker that finds a live lease waits instead of taking over.
 */
export interface OwnerLeases {
  readonly ttlMs: number;
  read(name: string): Promise<LeaseView | null>;
  /**
   * Takes the lease unless a live holder has it, or a live waiter queued before `ticket` (any live
   * waiter, without a ticket): then null. `force` takes it regardless. Taking it withdraws `ticket`.
   */
  acquire(name: string, owner: OwnerInfo, options?: { readonly force?: boolean; readonly ticket?: LeaseTicket }): Promise<HeldLease | null>;
  /** Joins the queue of waiters for `name`'s lease. */
  enqueue(name: string, owner: OwnerInfo): Promise<LeaseTicket>;
}

export interface OpenOptions {
  /** Create the database when it does not exist (default true). When false, a missing one throws DatabaseNotFound. */
  readonly create?: boolean;
}

export interface Storage {
  readonly adapter: AdapterName;
  /** Claims ownership of `name` (creating it unless `create: false`). Every earlier opener is fenced. */
  open(name: string, options?: OpenOptions): Promise<Database>;
  /** A read-only handle; throws DatabaseNotFound when the database does not exist. */
  reader(name: string): Promise<Reader>;
  /**
   * Posts an outside message to `name`'s mailbox without taking ownership. The same id with the same
   * content is a no-op; with other content it is refused (`StorageRejected {reason: "conflict"}`);
   * a full mailbox refuses with `backlog_full` (retry later). Throws DatabaseNotFound for a missing database.
   */
  post(name: string, message: MailboxMessage): Promise<void>;
  /** Names of the databases this storage holds. */
  list(): Promise<string[]>;
  /** Owner leases (liveness for standby workers); absent on the memory adapter. */
  readonly leases?: OwnerLeases;
  /** Releases shared resources (connections). Open databases should be closed first. */
  close(): Promise<void>;
}

/**
 * Fault points an adapter calls, so tests can fail a commit at an exact boundary (DBOS's debugpoint
 * idea). `commit:before` runs before anything is sent or written: a throw there is a plain failure and
 * nothing is durable. `commit:after-durable` runs after the commit is durable and before the caller
 * learns of it: a throw there is the lost acknowledgement, and the adapter must report StorageFailure
 * and poison the handle. `open:before-claim` (replicated adapter only) runs when an open has checked
 * the local copy against the database's id and is about to claim the epoch: a test changes the
 * database there. `open:after-grant` (replicated only) runs between the grant of the lease a claim is
 * written with and the claim: a test makes the lease run out there, as a pause of the opener would.
 * `open:after-claim` (replicated only) runs right after the claim landed, before the lease is renewed
 * or anything else is sent: a test makes the new owner die there.
 * Unused in production (undefined: no cost).
 */
export type FaultPoint = "commit:before" | "commit:after-durable" | "open:before-claim" | "open:after-grant" | "open:after-claim";
/** `detail.lease`: at `open:after-grant` and `open:after-claim`, the id of the lease just granted (and claimed with). */
export type FaultHook = (point: FaultPoint, detail?: { readonly lease?: string }) => void | Promise<void>;

/** Limits every adapter enforces the same way: a mailbox holds at most this many unacknowledged messages. */
export const MAILBOX_LIMIT = 1000;

/**
 * What every adapter must accept in ONE commit, because the harness relies on it (an adapter may
 * accept more): `outputEvents` execution_output events of `outputEventChars` characters each (any
 * characters, so up to 6 bytes each once JSON-escaped), and a model_response or patch_accepted
 * event whose patch is `patchJsonChars` characters of JSON. The conformance suite commits exactly these.
 */
export const COMMIT_FLOOR = {
  outputEvents: 8,
  outputEventChars: 16 * 1024,
  patchJsonChars: 512 * 1024,
} as const;
