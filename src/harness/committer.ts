/**
 * The harness's one commit path: every batch any part of the harness writes goes through `commit`,
 * and is folded into the owner's projection in log order before its caller hears of it.
 *
 * How many commits are in flight at once depends on the adapter:
 * - one at a time (sqlite, memory): a batch is sent only after the previous one was folded, so each
 *   batch is prepared against a projection that holds every earlier commit;
 * - several (an adapter with `groupsCommits`, the replicated one): a batch is sent as soon as it is
 *   asked for, and the adapter sends the batches that queued while its last write was in flight
 *   together, in one durable write. Without this, the sessions of one process wait for each
 *   other's commits in turn: 8 sessions on the replicated adapter reached 55 rounds/s, one etcd
 *   transaction at a time.
 *
 * Either way each batch succeeds or fails alone, and receipts are folded strictly in seq order: a
 * receipt that arrives ahead of a lower seq waits for it. If no commit in flight can fill the gap,
 * the log is read from the projection's head (the truth is read, never guessed).
 *
 * Owner claims (`owner_claimed`, the first event of each session under a new epoch) are added when a
 * batch is sent. A batch that needs the claim of a session whose claiming batch is still in flight
 * waits, with every batch after it, until that one settles: a refused claiming batch must not leave
 * a later batch of the same session logged without a claim.
 */
import { performance } from "node:perf_hooks";
import { copyJson } from "../state/canonical.js";
import type { EventBody, LogEvent, NewEvent } from "../state/events.js";
import { parseLogEvent } from "../state/events.js";
import { withOwnerClaims } from "../state/outcomes.js";
import type { Reducer } from "../state/reducer.js";
import type { CommitReceipt, Database } from "../storage/contract.js";

/** What the committer needs from its harness. */
export interface CommitterHost {
  readonly db: Database;
  /** The owner's projection (set once at open, before any commit). */
  reducer(): Reducer;
  /** Throws the harness's stop error when it no longer acts. */
  assertOpen(): void;
  /** The owner recorded in `owner_claimed` events. */
  owner(): EventBody<"owner_claimed">;
  /**
   * Events were folded, in seq order: a batch of ours that was durable after `seconds`, or (null)
   * events read from the log to fill a gap (the batches of ours among them included).
   */
  committed(logged: readonly LogEvent[], seconds: number | null): void;
  /** A batch failed (refused, fenced, unknown outcome, or its fold threw). */
  failed(err: unknown, seconds: number, events: number): void;
}

interface Entry {
  readonly caller: readonly NewEvent[];
  readonly resolve: (logged: readonly LogEvent[]) => void;
  readonly reject: (err: unknown) => void;
  events: readonly NewEvent[];
  claims: readonly string[];
  t0: number;
  receipt: CommitReceipt | null;
}

export class Committer {
  /** Asked for, not yet sent. */
  private readonly waiting: Entry[] = [];
  /** Sent and not yet folded or failed (landed ones included). */
  private readonly inflight = new Set<Entry>();
  /** Landed, waiting for the seqs before them to be folded; by first seq. */
  private readonly landed = new Map<number, Entry>();
  /** Identities of `owner_claimed` events in batches in flight. */
  private readonly claimsInFlight = new Set<string>();
  private readonly concurrent: boolean;
  private scheduled = false;
  private catchingUp = false;
  private idle: (() => void)[] = [];

  constructor(private readonly host: CommitterHost) {
    this.concurrent = host.db.groupsCommits === true;
  }

  /** Commits `caller` (with owner claims added where due); resolves with what was logged once folded. */
  commit(caller: readonly NewEvent[]): Promise<readonly LogEvent[]> {
    return new Promise<readonly LogEvent[]>((resolve, reject) => {
      this.waiting.push({ caller, resolve, reject, events: caller, claims: [], t0: 0, receipt: null });
      if (!this.scheduled) {
        // Sent from a microtask, never inside the caller's own stack; a burst of commits asked for
        // in one tick goes to the adapter together.
        this.scheduled = true;
        queueMicrotask(() => {
          this.scheduled = false;
          this.send();
        });
      }
    });
  }

  /** Resolves when nothing is waiting or in flight (what was waiting is refused once the harness stopped). */
  settled(): Promise<void> {
    this.send();
    if (this.waiting.length === 0 && this.inflight.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idle.push(resolve));
  }

  private send(): void {
    while (this.waiting.length > 0) {
      if (this.catchingUp || (!this.concurrent && this.inflight.size > 0)) return;
      const entry = this.waiting[0]!;
      try {
        this.host.assertOpen();
      } catch (err) {
        this.waiting.shift();
        entry.reject(err);
        continue;
      }
      const reducer = this.host.reducer();
      let blocked = false;
      const events = withOwnerClaims(
        entry.caller,
        (id) => {
          if (reducer.folded(id)) return true;
          if (this.claimsInFlight.has(id)) blocked = true;
          return blocked;
        },
        this.host.owner(),
      );
      if (blocked) return; // sent once the claiming batch settles
      this.waiting.shift();
      entry.events = events;
      entry.claims = events === entry.caller ? [] : events.filter((e) => e.kind === "owner_claimed").map((e) => e.identity);
      for (const id of entry.claims) this.claimsInFlight.add(id);
      entry.t0 = performance.now();
      this.inflight.add(entry);
      let sent: Promise<CommitReceipt>;
      try {
        sent = this.host.db.commit(events);
      } catch (err) {
        sent = Promise.reject(err); // an adapter that throws instead of rejecting
      }
      sent.then(
        (receipt) => this.land(entry, receipt),
        (err: unknown) => this.fail(entry, err),
      );
    }
    this.checkIdle();
  }

  private land(entry: Entry, receipt: CommitReceipt): void {
    entry.receipt = receipt;
    this.landed.set(receipt.firstSeq, entry);
    this.foldReady();
  }

  private fail(entry: Entry, err: unknown): void {
    this.done(entry);
    this.host.failed(err, (performance.now() - entry.t0) / 1000, entry.events.length);
    entry.reject(err);
    this.foldReady();
  }

  private done(entry: Entry): void {
    this.inflight.delete(entry);
    for (const id of entry.claims) this.claimsInFlight.delete(id);
  }

  /** Folds the landed batches that continue the projection, in seq order; then sends what waits. */
  private foldReady(): void {
    const reducer = this.host.reducer();
    for (;;) {
      const entry = this.landed.get(reducer.headSeq + 1);
      if (entry === undefined) break;
      this.landed.delete(reducer.headSeq + 1);
      const receipt = entry.receipt!;
      if (receipt.lastSeq !== receipt.firstSeq + entry.events.length - 1) {
        // Not the batch's own shape: read the truth instead.
        this.landed.set(receipt.firstSeq, entry);
        break;
      }
      this.fold(entry, () => {
        // A copy: what the reducer holds must not change if the caller reuses its event objects.
        const logged = entry.events.map((e, i) => {
          const copy = copyJson(e) as { -readonly [K in keyof LogEvent]: LogEvent[K] };
          copy.seq = receipt.firstSeq + i;
          return copy as LogEvent;
        });
        reducer.apply(logged);
        return logged;
      });
    }
    if (this.landed.size > 0 && this.landed.size === this.inflight.size && !this.catchingUp) {
      // Every batch in flight has landed, and none continues the projection: read the log.
      void this.catchUp();
      return;
    }
    this.send();
  }

  private fold(entry: Entry, apply: () => readonly LogEvent[]): void {
    this.done(entry);
    let logged: readonly LogEvent[];
    try {
      logged = apply();
      this.host.committed(logged, (performance.now() - entry.t0) / 1000);
    } catch (err) {
      // The fold or what follows it threw (a bug): the caller hears of it, never a hang.
      this.host.failed(err, (performance.now() - entry.t0) / 1000, entry.events.length);
      entry.reject(err);
      return;
    }
    entry.resolve(entry.events === entry.caller ? logged : logged.filter((e) => e.kind !== "owner_claimed"));
  }

  /**
   * Folds the log from the projection's head, shows everything read to the listeners at once (in seq
   * order), then resolves the landed batches it covers.
   */
  private async catchUp(): Promise<void> {
    this.catchingUp = true;
    const reducer = this.host.reducer();
    let read: LogEvent[] = [];
    let failure: unknown = null;
    try {
      read = (await this.host.db.read(reducer.headSeq)).map((e) => parseLogEvent(e));
      reducer.apply(read);
    } catch (err) {
      failure = err;
    }
    this.catchingUp = false;
    if (failure === null && read.length > 0) {
      try {
        this.host.committed(read, null);
      } catch (err) {
        failure = err;
      }
    }
    const bySeq = new Map(read.map((e) => [e.seq, e]));
    const entries = [...this.landed.values()].sort((a, b) => a.receipt!.firstSeq - b.receipt!.firstSeq);
    this.landed.clear();
    for (const entry of entries) {
      const { firstSeq, lastSeq } = entry.receipt!;
      this.done(entry);
      const mine: LogEvent[] = [];
      for (let seq = firstSeq; seq <= lastSeq && failure === null; seq++) {
        const e = bySeq.get(seq);
        if (e === undefined) failure = new Error(`commit receipt ${firstSeq}..${lastSeq} is not in the log read after it (head ${reducer.headSeq})`);
        else mine.push(e);
      }
      if (failure !== null) {
        this.host.failed(failure, (performance.now() - entry.t0) / 1000, entry.events.length);
        entry.reject(failure);
        continue;
      }
      entry.resolve(entry.events === entry.caller ? mine : mine.filter((e) => e.kind !== "owner_claimed"));
    }
    this.send();
  }

  private checkIdle(): void {
    if (this.waiting.length > 0 || this.inflight.size > 0 || this.idle.length === 0) return;
    const idle = this.idle;
    this.idle = [];
    for (const resolve of idle) resolve();
  }
}
