/**
 * The owner's handle. Commits go to the log one at a time, each with the next producer seq of this
 * owner's epoch, so the server refuses (403) every append of a superseded owner: that refusal is the
 * fence, and it writes nothing. Every other call first reads the log's tail (a newer claim there is
 * the fence too), then answers. `watch` follows the owners stream (claims) and the mail stream with
 * long-polls, so a fence or new mail is reported without a commit.
 *
 * A commit whose answer was lost is sent again unchanged until the server answers (append.ts); when
 * the answer does not say where the record is (a duplicate, a fence, a refusal after a lost answer),
 * the log is read back: the batch was committed exactly when its record is counted there.
 */
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import type { CommitReceipt, Database, DatabaseSignal, DatabaseStats, PostedMessage, StoredSnapshot } from "../../src/storage/contract.js";
import { ResetError, StorageFailure, StorageRejected } from "../../src/storage/errors.js";
import { guardHandle, Watchers } from "../../src/storage/handle.js";
import { checkAckBound, checkRange, duplicateIdentity, lostAcknowledgement, prepareBatch } from "../../src/storage/semantics.js";
import { checkSnapshotWrite, snapshotDigest } from "../../src/storage/snapshots.js";
import { appendResolving } from "./append.js";
import { cloneState, topEpoch } from "./fold.js";
import { DsTransportError } from "./http.js";
import { readFailure, type LogView } from "./log-view.js";
import { MailView, sleep } from "./mailbox.js";
import { pendingMessages } from "./mail-fold.js";
import type { DsContext } from "./options.js";
import { commitRecord, noticeEpoch, streamsOf, type CommitRecord, type IndexEntry } from "./records.js";
import { cutOf, storedOf, writeSegment, writeSnapshotBody, type LoadedSnapshot, type SnapshotIndex } from "./snapshots.js";

/** How often an owner whose watch heard of no claim still reads the log's tail (a claimant that died before its notice). */
const QUIET_FENCE_CHECK_MS = 10_000;

/** A long-poll answered sooner than this with nothing new is followed by a pause of this long. */
const LONG_POLL_FLOOR_MS = 500;

/** What `openDatabase` hands the handle. */
export interface OwnerParts {
  readonly ctx: DsContext;
  readonly name: string;
  readonly epoch: number;
  readonly view: LogView;
  readonly identities: Set<string>;
  readonly index: SnapshotIndex;
  readonly latest: LoadedSnapshot | null;
  /** The owners stream's offset after this owner's notice. */
  readonly ownersEnd: string;
  readonly onClose: () => void;
}

/** Counters beyond the contract's, for tests and `cairn status`. */
export interface DurableStreamsStats extends DatabaseStats {
  /** The log offset this handle has read or written up to. */
  readonly logOffset: string;
}

export class DsDatabase implements Database {
  readonly name: string;
  readonly epoch: number;
  private readonly ctx: DsContext;
  private readonly view: LogView;
  private readonly identities: Set<string>;
  private readonly index: SnapshotIndex;
  private latest: LoadedSnapshot | null;
  private readonly mail: MailView;
  private readonly watchers = new Watchers();
  private readonly onClose: () => void;
  private nextSeq = 2;
  private closed = false;
  private fencedBy: number | null | undefined = undefined;
  private poisoned: StorageFailure | null = null;
  private watching: AbortController | null = null;
  private ownersEnd: string;
  private mailSeen = 0;

  constructor(parts: OwnerParts) {
    this.ctx = parts.ctx;
    this.name = parts.name;
    this.epoch = parts.epoch;
    this.view = parts.view;
    this.identities = parts.identities;
    this.index = parts.index;
    this.latest = parts.latest;
    this.ownersEnd = parts.ownersEnd;
    this.onClose = parts.onClose;
    this.mail = new MailView(parts.ctx.wire, parts.name);
  }

  async read(afterSeq = 0, limit?: number): Promise<LogEvent[]> {
    this.guard();
    checkRange(afterSeq, limit);
    await this.fresh("reading its log");
    if (afterSeq >= this.view.cacheHead) return this.view.cachedEvents(afterSeq, limit);
    try {
      return await this.view.eventsFromStart(afterSeq, limit);
    } catch (err) {
      throw readFailure(this.name, "reading its log from the beginning", err);
    }
  }

  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    this.guard();
    const batch = prepareBatch(events);
    if (this.ctx.faults !== undefined) {
      await this.ctx.faults("commit:before");
      this.guard();
    }
    const receipt = await this.view.lock.run(() => this.commitLocked(batch));
    if (this.ctx.faults !== undefined) {
      try {
        await this.ctx.faults("commit:after-durable");
      } catch (cause) {
        this.poisoned = lostAcknowledgement(this.name, cause);
        throw this.poisoned;
      }
    }
    return receipt;
  }

  async head(): Promise<number> {
    this.guard();
    await this.fresh("reading its head");
    return this.view.state.head;
  }

  async writeSnapshot(seq: number, data: string): Promise<void> {
    this.guard();
    await this.fresh("writing a snapshot");
    await this.view.lock.run(async () => {
      this.guard();
      checkSnapshotWrite(this.name, seq, data, this.view.state.head, this.latest?.entry.seq ?? 0);
      const previous = this.latest;
      const prevCut = cutOf(previous);
      let cut = this.view.boundaryAtOrBelow(seq);
      if (cut.state.head < prevCut.state.head) cut = prevCut;
      let ids = previous?.body.ids ?? [];
      try {
        if (cut.state.head > prevCut.state.head) {
          const list = this.view.identitiesBetween(prevCut.state.head, cut.state.head);
          ids = [...ids, await writeSegment(this.ctx.wire, this.name, prevCut.state.head, cut.state.head, list)];
        }
        const digest = snapshotDigest(data);
        const body = { v: 1 as const, seq, digest, ids, data };
        const path = await writeSnapshotBody(this.ctx.wire, this.name, body);
        const entry: IndexEntry = { v: 1, t: "snapshot", seq, path, digest, cut: { offset: cut.offset, state: cloneState(cut.state) } };
        await this.appendPlain(streamsOf(this.name).snaps, entry);
        this.latest = { entry, body };
        this.index.wrote(this.latest);
        this.view.trimTo(cut);
        if (previous !== null && previous.entry.path !== path) void this.ctx.wire.remove(previous.entry.path).catch(() => undefined);
      } catch (err) {
        throw readFailure(this.name, "writing a snapshot", err);
      }
    });
  }

  async latestSnapshot(): Promise<StoredSnapshot | null> {
    this.guard();
    await this.fresh("reading its latest snapshot");
    return storedOf(this.name, this.latest);
  }

  async drain(): Promise<PostedMessage[]> {
    this.guard();
    await this.fresh("draining its mailbox");
    try {
      await this.mail.catchUp();
    } catch (err) {
      throw readFailure(this.name, "reading its mailbox", err);
    }
    return pendingMessages(this.mail.state);
  }

  async ack(upTo: number): Promise<void> {
    this.guard();
    checkAckBound(upTo);
    await this.fresh("acknowledging mail");
    try {
      await this.mail.lock.run(async () => {
        await this.mail.catchUpLocked();
        const first = this.mail.state.unacked.values().next();
        if (first.done === true || first.value.mseq > upTo) return;
        await this.mail.append({ v: 1, t: "ack", upTo, e: this.epoch }, this.ctx.outageMs);
        await this.mail.catchUpLocked();
      });
    } catch (err) {
      throw readFailure(this.name, "acknowledging mail", err);
    }
  }

  watch(listener: (signal: DatabaseSignal) => void): () => void {
    if (this.closed) return () => {};
    const stop = this.watchers.add(listener, () => this.stopWatching());
    if (this.fencedBy !== undefined) {
      this.watchers.deliver(listener, { type: "fenced", epoch: this.fencedBy });
    } else {
      if (this.mail.state.unacked.size > 0) this.watchers.deliver(listener, { type: "mailbox" });
      this.startWatching();
    }
    return stop;
  }

  stats(): DurableStreamsStats {
    return { adapter: "durable-streams", epoch: this.epoch, fenced: this.fencedBy !== undefined, poisoned: this.poisoned !== null, logOffset: this.view.end };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopWatching();
    this.watchers.clear();
    this.onClose();
  }

  private async commitLocked(batch: NewEvent[]): Promise<CommitReceipt> {
    this.guard();
    const present = batch.map((e) => e.identity).filter((id) => this.identities.has(id));
    if (present.length > 0) throw duplicateIdentity(present, "in the log");
    const first = this.view.state.head + 1;
    const record = commitRecord(this.epoch, this.nextSeq, first, batch.length, JSON.stringify(batch));
    const log = streamsOf(this.name).log;
    let resolved;
    try {
      resolved = await appendResolving(this.ctx.wire, log, JSON.stringify(record), { id: this.ctx.producerId, epoch: this.epoch, seq: this.nextSeq }, this.ctx.outageMs);
    } catch (err) {
      if (err instanceof DsTransportError) {
        this.poisoned = new StorageFailure(
          `commit to database "${this.name}" may or may not be durable: the Durable Streams server gave no answer for ${this.ctx.outageMs} ms (${err.message}); this handle is unusable: reopen and read the log.`,
          { cause: err },
        );
      } else {
        this.poisoned = new StorageFailure(`commit to database "${this.name}" was refused unexpectedly (${(err as Error).message}); reopen and read the log.`, { cause: err });
      }
      throw this.poisoned;
    }
    const { result, ambiguous } = resolved;
    let landed = false;
    switch (result.kind) {
      case "appended":
        await this.landOwn(record, result.next);
        landed = true;
        break;
      case "duplicate":
        // Only this handle writes this epoch: the server holds this seq from an attempt whose answer was lost.
        landed = await this.readBack(record);
        if (!landed) {
          this.poisoned = new StorageFailure(`database "${this.name}": the server answered that producer seq (${this.epoch}, ${record.s}) was already appended, but the log does not hold this commit there; reopen and read the log.`);
          throw this.poisoned;
        }
        break;
      case "stale":
        landed = ambiguous && (await this.readBack(record));
        this.markFenced(result.epoch);
        if (!landed) throw ResetError.fenced(this.name, this.epoch, result.epoch);
        // It was appended before the newer owner's claim: committed. The next call reports the fence.
        break;
      case "gap":
      case "epoch-unknown":
        landed = ambiguous && (await this.readBack(record));
        this.poisoned = new StorageFailure(
          `database "${this.name}": the Durable Streams server no longer knows this owner's producer state (epoch ${this.epoch}${result.kind === "gap" ? `, expected producer seq ${result.expected ?? "?"}` : ""}); it lost acknowledged state (a restart without durable producer state?). ${landed ? "The last commit was durable. " : "The commit was not written. "}Reopen to claim a new epoch.`,
        );
        if (!landed) throw this.poisoned;
        break;
      case "too-large":
        landed = ambiguous && (await this.readBack(record));
        if (!landed) throw new StorageRejected("too_large", `database "${this.name}": the Durable Streams server refused a commit of ${batch.length} events as too large (413); nothing was written.`);
        break;
      case "rate-limited":
        landed = ambiguous && (await this.readBack(record));
        if (!landed) throw new StorageRejected("backlog_full", `database "${this.name}": the Durable Streams server kept refusing the commit as rate limited (429) for ${this.ctx.outageMs} ms; nothing was written. Retry later.`);
        break;
      case "not-found":
      case "gone":
        throw new ResetError("stop", "deleted", `database "${this.name}": its log stream is gone (deleted on the server); nothing was written.`);
    }
    this.nextSeq += 1;
    for (const e of batch) this.identities.add(e.identity);
    return { firstSeq: first, lastSeq: first + batch.length - 1 };
  }

  /** Applies this owner's record, answered with `next`; falls back to reading the log when the fold cannot place it. */
  private async landOwn(record: CommitRecord, next: string): Promise<void> {
    if (this.view.rewoundBefore(next)) {
      this.poisoned = new StorageFailure(
        `commit to database "${this.name}": the Durable Streams server answered it with offset ${next}, not after ${this.view.end}, up to which it had already returned the log: it lost or rewound data it had returned. The log is damaged on the server; this handle is unusable.`,
      );
      throw this.poisoned;
    }
    try {
      this.view.applyOwn(record, next);
      return;
    } catch {
      // Something the fold did not expect lies before it: read the stream as it is.
    }
    if (!(await this.readBack(record))) {
      this.poisoned = new StorageFailure(`database "${this.name}": the server appended a commit that the log does not count; reopen and read the log.`);
      throw this.poisoned;
    }
  }

  /** Reads the log's tail and says whether `record` is counted in it (lock held). Poisons the handle when reading fails. */
  private async readBack(record: CommitRecord): Promise<boolean> {
    const deadline = Date.now() + this.ctx.outageMs;
    for (;;) {
      try {
        await this.view.catchUpLocked();
        return this.view.counts(record.f, record.h);
      } catch (err) {
        if (err instanceof DsTransportError && Date.now() < deadline) {
          await sleep(250);
          continue;
        }
        this.poisoned = new StorageFailure(`commit to database "${this.name}" may or may not be durable: reading the log back to learn it failed (${(err as Error).message}); this handle is unusable: reopen and read the log.`, { cause: err });
        throw this.poisoned;
      }
    }
  }

  /** Appends a record without producer headers (the snapshot index), retrying lost answers (a second copy is harmless). */
  private async appendPlain(path: string, record: unknown): Promise<void> {
    const body = JSON.stringify(record);
    const deadline = Date.now() + this.ctx.outageMs;
    for (let attempt = 0; ; attempt++) {
      try {
        const res = await this.ctx.wire.append(path, body);
        if (res.kind === "appended") return;
        if (res.kind !== "rate-limited") throw new StorageFailure(`database "${this.name}": ${path} refused an append (${res.kind}).`);
      } catch (err) {
        if (!(err instanceof DsTransportError) || Date.now() > deadline) throw err;
      }
      await sleep(Math.min(1000, 50 * 2 ** attempt));
    }
  }

  /** Reads the log's tail (a newer claim there fences this handle), then checks the handle again. */
  private async fresh(what: string): Promise<void> {
    try {
      await this.view.catchUp();
    } catch (err) {
      throw readFailure(this.name, what, err);
    }
    this.checkFence();
    this.guard();
  }

  private checkFence(): void {
    const top = topEpoch(this.view.state);
    if (top > this.epoch) this.markFenced(top);
  }

  private markFenced(by: number | null): void {
    if (this.fencedBy !== undefined) return;
    this.fencedBy = by;
    this.stopWatching();
    this.watchers.fenced(by);
  }

  private guard(): void {
    guardHandle(this.name, this.epoch, { closed: this.closed, fencedBy: this.fencedBy, poisoned: this.poisoned });
  }

  private startWatching(): void {
    if (this.watching !== null || this.closed) return;
    const ac = new AbortController();
    this.watching = ac;
    void this.watchOwners(ac.signal);
    void this.watchMail(ac.signal);
  }

  private stopWatching(): void {
    this.watching?.abort();
    this.watching = null;
  }

  /** Long-polls the owners stream; a notice of a newer epoch is confirmed in the log, then reported. */
  private async watchOwners(signal: AbortSignal): Promise<void> {
    const owners = streamsOf(this.name).owners;
    let lastLogCheck = Date.now();
    while (!signal.aborted) {
      try {
        const asked = Date.now();
        const res = await this.ctx.wire.read(owners, this.ownersEnd, true, signal);
        let check = Date.now() - lastLogCheck >= QUIET_FENCE_CHECK_MS;
        if (res.kind === "data" && res.messages.length > 0) {
          if (res.messages.some((m) => (noticeEpoch(m) ?? 0) > this.epoch)) check = true;
          this.ownersEnd = res.next;
        } else if (res.kind === "data" || res.kind === "timeout") {
          this.ownersEnd = res.next;
          // A server that answers a long-poll at once with nothing must not make this loop spin.
          if (Date.now() - asked < LONG_POLL_FLOOR_MS) await sleep(LONG_POLL_FLOOR_MS);
        } else {
          await sleep(1000);
        }
        if (check && !signal.aborted) {
          lastLogCheck = Date.now();
          await this.view.catchUp();
          this.checkFence();
        }
      } catch {
        if (signal.aborted) return;
        await sleep(1000);
      }
    }
  }

  /** Long-polls the mail stream; reports new posts. */
  private async watchMail(signal: AbortSignal): Promise<void> {
    const mail = streamsOf(this.name).mail;
    while (!signal.aborted) {
      try {
        await this.mail.catchUp();
        if (signal.aborted) return;
        if (this.mail.state.lastMseq > this.mailSeen) {
          this.mailSeen = this.mail.state.lastMseq;
          if (this.mail.state.unacked.size > 0) this.watchers.notify({ type: "mailbox" });
        }
        const asked = Date.now();
        const res = await this.ctx.wire.read(mail, this.mail.end, true, signal);
        if ((res.kind === "timeout" || (res.kind === "data" && res.messages.length === 0)) && Date.now() - asked < LONG_POLL_FLOOR_MS) await sleep(LONG_POLL_FLOOR_MS);
      } catch {
        if (signal.aborted) return;
        await sleep(1000);
      }
    }
  }
}
