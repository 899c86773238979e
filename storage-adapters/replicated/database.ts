/**
 * An owned replicated database: the handle `Storage.open` returns.
 *
 * Ownership: the handle holds the epoch it claimed, and the revision of that claim. Every request
 * that must be the owner's is guarded in etcd itself by the epoch key being as the claim wrote it
 * (ops.ts `ownerGuard`: commit, drain, ack, snapshots) or preceded by a linearizable read of that key
 * (read, head), and a watch on the epoch key fences the handle as soon as anyone else writes it: a
 * newer opener's claim, or the database deleted and created again outside Cairn, whose epoch starts
 * again at 1 and may equal this owner's. Commits go through `CommitPipeline` (commit-pipeline.ts).
 */
import type { ICompare, IResponseOp } from "etcd3";
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import type { CommitReceipt, Database, DatabaseSignal, DatabaseStats, MailboxMessage, PostedMessage, StoredSnapshot } from "../../src/storage/contract.js";
import { readSnapshot, writeSnapshot } from "./snapshots.js";
import { ResetError, StorageFailure } from "../../src/storage/errors.js";
import { guardHandle, Watchers } from "../../src/storage/handle.js";
import { checkAckBound, checkRange } from "../../src/storage/semantics.js";
import { CommitPipeline } from "./commit-pipeline.js";
import type { Context } from "./context.js";
import { readEpochHead } from "./cluster-log.js";
import type { Keys } from "./layout.js";
import type { ReplicatedLease } from "./liveness.js";
import type { LocalCopy } from "./local-copy.js";
import { ResilientWatch } from "./watch.js";
import { count, del, fencedBy, fencedByEvent, fencer, get, kvsOf, ownerGuard, prefixEnd, range } from "./ops.js";

/** Mailbox messages deleted per ack transaction (two deletes each, under MAX_TXN_OPS). */
const ACK_CHUNK = 60;

/** Stats of a replicated handle: the contract's, plus commit grouping counters. */
export interface ReplicatedStats extends DatabaseStats {
  /** etcd transactions this Storage sent to append (retries included); fewer than commits when grouped. */
  readonly commitTxns: number;
  /** Attempts of those transactions, one per member tried. */
  readonly commitAttempts: number;
  /** Commits this Storage resolved with a receipt. */
  readonly commitsResolved: number;
  /** Transactions that waited `groupDelayMs` for company (only after a transaction that carried several commits). */
  readonly commitGroupWaits: number;
}

/** What `openReplicatedDatabase` hands the handle. */
export interface HandleInit {
  readonly name: string;
  readonly epoch: number;
  readonly keys: Keys;
  readonly copy: LocalCopy;
  readonly head: number;
  readonly lastHash: string;
  /** The etcd revision of the epoch claim: watches start right after it, so no fence is missed. */
  readonly claimRevision: string;
  /** The owner's lease, renewing since the claim. */
  readonly lease: ReplicatedLease;
  readonly onClose: () => void;
}

/** The owner's handle on one database. */
export class ReplicatedDatabase implements Database {
  readonly name: string;
  readonly epoch: number;
  /** Concurrent commits go out together, one etcd transaction per group (commit-pipeline.ts). */
  readonly groupsCommits = true;
  private readonly keys: Keys;
  private readonly copy: LocalCopy;
  private readonly pipeline: CommitPipeline;
  private readonly listeners = new Watchers();
  private readonly watchers: ResilientWatch[] = [];
  readonly lease: ReplicatedLease;
  private fencedBy: { epoch: number | null } | null = null;
  private poison: StorageFailure | null = null;
  private closed = false;
  private readonly openedLostSeconds: number;

  constructor(
    private readonly ctx: Context,
    private readonly init: HandleInit,
  ) {
    this.name = init.name;
    this.epoch = init.epoch;
    this.keys = init.keys;
    this.copy = init.copy;
    this.lease = init.lease;
    this.openedLostSeconds = ctx.health.view().lostSeconds;
    this.pipeline = new CommitPipeline(ctx, {
      name: init.name,
      epoch: init.epoch,
      claimRevision: init.claimRevision,
      keys: init.keys,
      copy: init.copy,
      head: init.head,
      lastHash: init.lastHash,
      guard: () => this.guard(),
      fence: (epoch) => this.markFenced(epoch),
      poison: (failure) => this.setPoison(failure),
      isClosed: () => this.closed,
    });
  }

  /**
   * Starts the epoch and mailbox watches (from right after the claim). Each is created within the
   * request deadline and moves to another member when its member goes silent (watch.ts).
   */
  async startWatches(): Promise<void> {
    const after = String(BigInt(this.init.claimRevision) + 1n);
    const epochWatch = new ResilientWatch(this.ctx, {
      what: "epoch",
      key: this.keys.epoch,
      startRevision: after,
      // Any write of the epoch key after this owner's claim is another's (ops.ts `fencedByEvent`).
      onPut: (kv) => this.fenceIf(fencedByEvent("put", kv, this.epoch, this.init.claimRevision)),
      onDelete: (kv) => this.fenceIf(fencedByEvent("delete", kv, this.epoch, this.init.claimRevision)),
      recheck: async () => {
        const state = await readEpochHead(this.ctx, this.keys);
        this.fenceIf(this.fencerOf(state));
      },
    });
    this.watchers.push(epochWatch);
    const mailWatch = new ResilientWatch(this.ctx, {
      what: "mailbox",
      prefix: this.keys.mailPrefix,
      onlyPut: true,
      startRevision: after,
      onPut: () => this.notify({ type: "mailbox" }),
      recheck: async () => this.notify({ type: "mailbox" }),
    });
    this.watchers.push(mailWatch);
    try {
      await epochWatch.start();
      await mailWatch.start();
    } catch (err) {
      await Promise.all(this.watchers.map((w) => w.cancel()));
      throw err;
    }
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    checkRange(afterSeq, limit);
    const head = await this.ownedHead("read");
    // The copy holds every batch this owner's commits resolved. It may trail the cluster's head only
    // by a commit still in flight (applied in etcd, not yet acknowledged here); otherwise it is a bug.
    if (this.copy.head() < head && this.pipeline.backlog().commits === 0) {
      throw this.setPoison(new StorageFailure(`the local copy of "${this.name}" lags the cluster (seq ${this.copy.head()} < ${head}) while this process owns it; reopen to rebuild it.`));
    }
    return this.copy.read(afterSeq, limit);
  }

  commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    return this.pipeline.commit(events);
  }

  async head(): Promise<number> {
    this.guard();
    return this.ownedHead("read the head of");
  }

  /**
   * Writes the snapshot (chunks, identity segment, pointer: snapshots.ts), then compacts etcd: the
   * batches up to the cut (and identity keys an earlier version left) are deleted in bounded transactions. The local copy
   * keeps them. Resolves once the pointer names the snapshot and compaction ran.
   */
  async writeSnapshot(seq: number, data: string): Promise<void> {
    this.guard();
    const head = await this.ownedHead("write a snapshot of");
    try {
      await writeSnapshot(
        this.ctx,
        { name: this.name, epoch: this.epoch, claimRevision: this.init.claimRevision, keys: this.keys, copy: this.copy, fenced: (epoch) => this.fenceError(epoch) },
        seq,
        data,
        head,
      );
    } catch (err) {
      throw this.ctx.fail(err, "write a snapshot of", this.name);
    }
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    await this.ownedHead("read the snapshot of");
    try {
      return await readSnapshot(this.ctx, this.keys, this.name);
    } catch (err) {
      throw this.ctx.fail(err, "read the snapshot of", this.name);
    }
  }

  async drain(): Promise<PostedMessage[]> {
    this.guard();
    let res;
    try {
      res = await this.ctx.txn([this.guardOp()], [range(this.keys.mailPrefix, prefixEnd(this.keys.mailPrefix))], [get(this.keys.epoch)]);
    } catch (err) {
      throw this.ctx.fail(err, "drain the mailbox of", this.name);
    }
    if (!res.succeeded) this.refused(res.responses);
    return kvsOf(res.responses, 0).map((kv) => {
      const mseq = Number(kv.key.toString("utf8").slice(this.keys.mailPrefix.length));
      return { ...(JSON.parse(kv.value.toString("utf8")) as MailboxMessage), mseq };
    });
  }

  async ack(upTo: number): Promise<void> {
    this.guard();
    checkAckBound(upTo);
    if (upTo < 1) return;
    const end = Buffer.from(this.keys.mail(upTo + 1));
    try {
      for (;;) {
        const res = await this.ctx.txn([this.guardOp()], [range(this.keys.mailPrefix, end, ACK_CHUNK)], [get(this.keys.epoch)]);
        if (!res.succeeded) this.refused(res.responses);
        const kvs = kvsOf(res.responses, 0);
        if (kvs.length === 0) return;
        const deletes = kvs.flatMap((kv) => {
          const key = kv.key.toString("utf8");
          const id = (JSON.parse(kv.value.toString("utf8")) as MailboxMessage).id;
          return [del(key), del(this.keys.mailId(id))];
        });
        const removed = await this.ctx.txn([this.guardOp()], deletes, [get(this.keys.epoch)]);
        if (!removed.succeeded) this.refused(removed.responses);
      }
    } catch (err) {
      throw this.ctx.fail(err, "acknowledge the mailbox of", this.name);
    }
  }

  watch(listener: (signal: DatabaseSignal) => void): () => void {
    if (this.closed) return () => {};
    const stop = this.listeners.add(listener);
    if (this.fencedBy) this.listeners.deliver(listener, { type: "fenced", epoch: this.fencedBy.epoch });
    else {
      // Like the reference adapter: mail already waiting is reported to a new watcher.
      this.ctx
        .txn([], [count(this.keys.mailPrefix)])
        .then((res) => {
          if (Number(res.responses[0]?.response_range.count ?? 0) > 0) this.listeners.deliver(listener, { type: "mailbox" });
        })
        .catch(() => undefined);
    }
    return stop;
  }

  stats(): ReplicatedStats {
    const q = this.ctx.health.view();
    const backlog = this.pipeline.backlog();
    return {
      adapter: "replicated",
      epoch: this.epoch,
      fenced: this.fencedBy !== null,
      poisoned: this.poison !== null,
      membersReachable: q.membersReachable,
      membersTotal: q.membersTotal,
      quorumHeld: q.quorumHeld,
      backlogCommits: backlog.commits,
      backlogBytes: backlog.bytes,
      quorumWaitSeconds: Math.max(0, q.lostSeconds - this.openedLostSeconds),
      commitTxns: this.ctx.counters.commitTxns,
      commitAttempts: this.ctx.counters.commitAttempts,
      commitsResolved: this.ctx.counters.commitsResolved,
      commitGroupWaits: this.ctx.counters.commitGroupWaits,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.listeners.clear();
    // A commit in flight is waited for while this handle holds its lease (not fenced, not lost, not
    // given up by a harness that stopped), and no longer: then its outcome no longer matters here
    // (the next owner reads the truth), and it may be waiting for a quorum this process cannot reach
    // (the lease is lost within a lease length of that).
    const shutdown = this.pipeline.shutdown();
    void shutdown.catch(() => undefined);
    if (this.fencedBy === null && this.lease.held()) await untilSettledOrLost(shutdown, this.lease);
    // Bounded: a silent member is not waited for (watch.ts, lease.ts).
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)));
    await this.lease.release();
    this.copy.close();
    this.init.onClose();
  }

  /** The cluster's head after checking (linearizably) that this handle still owns the database. */
  private async ownedHead(op: string): Promise<number> {
    let state;
    try {
      state = await readEpochHead(this.ctx, this.keys);
    } catch (err) {
      throw this.ctx.fail(err, op, this.name);
    }
    const by = this.fencerOf(state);
    if (by !== null) throw this.fenceError(by.epoch);
    return state.head;
  }

  /** The owner's guard (ops.ts): the epoch key is as this owner's claim wrote it. */
  private guardOp(): ICompare {
    return ownerGuard(this.keys.epoch, this.init.claimRevision);
  }

  /** Who fenced this owner, from a linearizable read of the epoch key (ops.ts `fencer`); null: nobody. */
  private fencerOf(state: { epoch: number | null; epochRevision: string | null }): { epoch: number | null } | null {
    return fencer({ epoch: state.epoch, revision: state.epochRevision }, this.epoch, this.init.claimRevision);
  }

  private fenceIf(by: { epoch: number | null } | null): void {
    if (by !== null) this.markFenced(by.epoch);
  }

  /** A transaction guarded only by the owner's guard (its read-back: the epoch key first) was refused: fenced. */
  private refused(responses: readonly IResponseOp[]): never {
    throw this.fenceError(fencedBy(responses, 0, this.epoch, this.init.claimRevision)?.epoch ?? null);
  }

  /** Marks the handle fenced (by the epoch the cluster holds, null when unknown or gone) and returns the error to throw. */
  private fenceError(epoch: number | null): ResetError {
    this.markFenced(epoch);
    return ResetError.fenced(this.name, this.epoch, epoch);
  }

  private markFenced(epoch: number | null): void {
    if (this.fencedBy) return;
    this.fencedBy = { epoch };
    this.lease.stopRenewing();
    this.ctx.log.warn({ db: this.name, epoch: this.epoch, newEpoch: epoch }, "database opened by another process: this handle is fenced and must stop");
    this.listeners.fenced(epoch);
  }

  private setPoison(failure: StorageFailure): StorageFailure {
    if (!this.poison) {
      this.poison = failure;
      this.ctx.log.error({ db: this.name, epoch: this.epoch, err: failure.message }, "database handle poisoned: a commit's outcome is unknown");
    }
    return failure;
  }

  private guard(): void {
    guardHandle(this.name, this.epoch, { closed: this.closed, fencedBy: this.fencedBy?.epoch, poisoned: this.poison });
  }

  private notify(signal: DatabaseSignal): void {
    this.listeners.notify(signal);
  }}

/** Resolves when `work` settles or `lease` is lost, whichever comes first. Never rejects. */
function untilSettledOrLost(work: Promise<unknown>, lease: ReplicatedLease): Promise<void> {
  return new Promise<void>((resolve) => {
    const off = lease.onLost(() => resolve());
    const done = () => {
      off();
      resolve();
    };
    work.then(done, done);
  });
}
