/**
 * The commit path of an owned replicated database.
 *
 * One etcd transaction per group of commits: concurrent `commit()` calls queue while a transaction is
 * in flight and go out together in the next one (within MAX_TXN_OPS and MAX_BATCH_BYTES). Each caller
 * still gets its own receipt. When the last transaction carried more than one commit and fewer than
 * GROUP_WAIT_BELOW (several sessions commit at once, in small groups), the next waits up to
 * `groupDelayMs` (default 2 ms) for more to join, and goes as soon as as many are queued as the
 * largest of the last eight transactions carried. Each etcd transaction costs every member a raft
 * round and a WAL fsync whatever it carries, so fewer, larger transactions leave the machine's CPU to
 * the sessions; committers that come back together (a closed loop of commits) are not held up, and a
 * lone committer never waits.
 *
 * The transaction is guarded by `the epoch key is as my claim wrote it AND head == expected` (the
 * first is ops.ts `ownerGuard`: the key's mod revision is the claim's, which no later claim, nor a
 * database deleted and created again at the same epoch number, can keep), so a fenced process can
 * never append and a retry can never append twice. Duplicate identities are refused here, before anything is
 * sent, from the local copy, which holds every identity of the log (layout.ts says why that is exact):
 * a commit made while nothing is queued or in flight is checked at once; the others are checked
 * together when their group is taken, in one lookup for the group.
 *
 * Unknown outcomes (deadline, lost connection, no quorum) are resolved by sending the same guarded
 * transaction again after a backoff: its failure branch reads back the epoch, the head and the record
 * at our first seq in the same round trip. Our token there: it was durable. Head unchanged: the retry
 * applies it. Epoch key written since our claim: fenced, nothing of ours was written. Anything else, or the handle closing
 * while unsure: StorageFailure and the handle is poisoned. While the quorum is lost this waits
 * (onOutage "wait") with no limit; onOutage "reject" refuses new commits once the backlog is full.
 */
import { randomBytes } from "node:crypto";
import type { IRequestOp, IResponseOp } from "etcd3";
import type { NewEvent } from "../../src/state/events.js";
import type { CommitReceipt } from "../../src/storage/contract.js";
import { ResetError, StorageFailure, StorageRejected } from "../../src/storage/errors.js";
import { duplicateIdentity, prepareBatch } from "../../src/storage/semantics.js";
import type { Context } from "./context.js";
import { classifyEtcdError } from "./etcd-errors.js";
import { MAX_BATCH_BYTES, MAX_BATCH_EVENTS, MAX_TXN_OPS, chainHash, decodeBatch, encodeBatch, type BatchRecord, type Keys } from "./layout.js";
import type { LocalCopy } from "./local-copy.js";
import { fencedBy, get, kvsOf, ownerGuard, put, valueIs, valueOf } from "./ops.js";
import { Retry } from "./retry.js";

/** What the pipeline needs from its handle. */
export interface PipelineInit {
  readonly name: string;
  readonly epoch: number;
  /** The etcd revision of this owner's epoch claim: the owner's guard (ops.ts `ownerGuard`). */
  readonly claimRevision: string;
  readonly keys: Keys;
  readonly copy: LocalCopy;
  readonly head: number;
  readonly lastHash: string;
  /** Throws when the handle is closed, fenced or poisoned. */
  guard(): void;
  fence(epoch: number | null): void;
  poison(failure: StorageFailure): StorageFailure;
  isClosed(): boolean;
}

interface Pending {
  readonly events: readonly NewEvent[];
  readonly identities: readonly string[];
  /** Each event's JSON (eventsJson is their array): the local copy stores them as they are. */
  readonly jsons: readonly string[];
  readonly eventsJson: string;
  readonly bytes: number;
  /**
   * True once its identities were found absent from the log while no commit holding one of them was
   * queued ahead of it or in flight. Sending a group clears it on every queued commit sharing an
   * identity with that group; an unchecked commit is checked when its group is taken (checkAhead).
   */
  checked: boolean;
  resolve(receipt: CommitReceipt): void;
  reject(err: unknown): void;
}

type Outcome =
  | { kind: "ok" }
  | { kind: "fenced"; epoch: number | null }
  | { kind: "failed"; error: unknown }
  /** Refused, nothing written, and the keys it compares were changed outside Cairn: the handle stops. */
  | { kind: "damaged"; reason: string }
  | { kind: "unknown"; reason: string; cause?: unknown };

/** How many recent transactions the group-commit wait looks back on (see expectedGroup). */
const RECENT_GROUPS = 8;
/**
 * After a transaction of this many commits or more, the next one does not wait: the fixed cost per
 * transaction is already shared that many ways, and a wait would only slow committers down.
 */
const GROUP_WAIT_BELOW = 16;

/** At most this many queued commits are checked against the local copy in one lookup (checkAhead). */
const CHECK_AHEAD = MAX_TXN_OPS;

export class CommitPipeline {
  private readonly queue: Pending[] = [];
  private inflight: readonly Pending[] = [];
  private running: Promise<void> | null = null;
  private head: number;
  private lastHash: string;
  /**
   * Names this pipeline's transactions (with the epoch and a counter): a token read back in a
   * failure branch is ours only if it is this exact string. Random once per pipeline, not per
   * transaction (the OpenSSL call cost 0.07 ms of a round's three commits).
   */
  private readonly tokenPrefix = randomBytes(8).toString("hex");
  private tokens = 0;
  /** Commits in the last transaction sent: more than one means others commit at the same time. */
  private lastGroupSize = 0;
  /** Commits in each of the last RECENT_GROUPS transactions: the company a waiting group expects. */
  private readonly recentGroups: number[] = [];
  /** Ends the group-commit wait early (set while the pump waits for company). */
  private wake: (() => void) | null = null;

  constructor(
    private readonly ctx: Context,
    private readonly init: PipelineInit,
  ) {
    this.head = init.head;
    this.lastHash = init.lastHash;
  }

  /** Commits waiting or in flight, and their bytes. */
  backlog(): { commits: number; bytes: number } {
    const all = [...this.queue, ...this.inflight];
    return { commits: all.length, bytes: all.reduce((n, p) => n + p.bytes, 0) };
  }

  /** See `Database.commit`. Validation and local duplicate checks refuse before anything is sent. */
  async commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    const { name } = this.init;
    this.init.guard();
    const batch = prepareBatch(events);
    const jsons = batch.map((e) => JSON.stringify(e));
    const eventsJson = `[${jsons.join(",")}]`;
    const bytes = Buffer.byteLength(eventsJson);
    if (batch.length > MAX_BATCH_EVENTS) {
      throw new StorageRejected(
        "too_large",
        `refused a commit of ${batch.length} events to database "${name}": the replicated adapter takes at most ${MAX_BATCH_EVENTS} events per commit (etcd --max-txn-ops ${MAX_TXN_OPS}); nothing was written.`,
      );
    }
    if (bytes > MAX_BATCH_BYTES) {
      const largest = Math.max(...jsons.map((j) => Buffer.byteLength(j)));
      throw new StorageRejected(
        "too_large",
        `refused a commit of ${bytes} bytes (largest event ${largest} bytes) to database "${name}": the replicated adapter takes at most ${MAX_BATCH_BYTES} bytes per commit (etcd's request limit is 1.5 MiB); nothing was written. Split large output across events.`,
      );
    }
    const faults = this.ctx.opts.faults;
    if (faults !== undefined) {
      await faults("commit:before");
      this.init.guard();
    }
    const identities = batch.map((e) => e.identity);
    // Nothing queued or in flight: every identity that can be in the log is in the local copy (or
    // pending its write there), so one lookup now is exact. Otherwise the group's lookup decides.
    const checked = this.queue.length === 0 && this.inflight.length === 0;
    if (checked) {
      const present = this.init.copy.existing(identities);
      if (present.length > 0) throw duplicateIdentity(present, "in the log");
    }
    const backlog = this.backlog().commits;
    if (this.ctx.opts.onOutage === "reject" && backlog >= this.ctx.opts.backlogLimit && !this.ctx.health.view().quorumHeld) {
      throw new StorageRejected(
        "backlog_full",
        `refused a commit to database "${name}": the etcd quorum is lost and ${backlog} commits already wait (backlogLimit ${this.ctx.opts.backlogLimit}); nothing was written, retry when the cluster is back.`,
      );
    }
    const outage = this.outageRefusal();
    if (outage !== null) throw outage;
    return new Promise<CommitReceipt>((resolve, reject) => {
      this.queue.push({ events: batch, identities, jsons, eventsJson, bytes, checked, resolve, reject });
      // As many commits wait as the recent transactions carried: the company came, stop waiting.
      if (this.wake !== null && this.queue.length >= this.expectedGroup()) this.wake();
      this.kick();
    });
  }

  /** onOutage "reject": the refusal once the quorum has been lost for longer than outageTimeoutMs, else null. */
  private outageRefusal(): StorageRejected | null {
    const { onOutage, outageTimeoutMs } = this.ctx.opts;
    const lostMs = this.ctx.health.lostForMs();
    if (onOutage !== "reject" || lostMs <= outageTimeoutMs) return null;
    return new StorageRejected(
      "backlog_full",
      `refused a commit to database "${this.init.name}": the etcd quorum has been lost for ${(lostMs / 1000).toFixed(1)} s, longer than the outage timeout of ${outageTimeoutMs / 1000} s (--on-outage reject); nothing was written, retry when the cluster is back.`,
    );
  }

  /** The largest of the last few transactions' commits: a waiting group goes once that many are queued. */
  private expectedGroup(): number {
    return Math.max(0, ...this.recentGroups);
  }

  /** Refuses queued commits and waits for the one in flight to settle. */
  async shutdown(): Promise<void> {
    this.wake?.();
    this.rejectQueued(new ResetError("stop", "closed", `database handle "${this.init.name}" was closed before this commit was sent; nothing was written.`));
    await this.running;
  }

  private kick(): void {
    if (this.running) return;
    this.running = this.pump().finally(() => {
      this.running = null;
      if (this.queue.length > 0 && !this.init.isClosed()) this.kick();
    });
  }

  private rejectQueued(err: unknown): void {
    for (const p of this.queue.splice(0)) p.reject(err);
  }

  private async pump(): Promise<void> {
    while (this.queue.length > 0) {
      const delay = this.ctx.opts.groupDelayMs;
      if (delay > 0 && this.lastGroupSize > 1 && this.lastGroupSize < GROUP_WAIT_BELOW && this.queue.length < this.expectedGroup()) {
        this.ctx.counters.commitGroupWaits++;
        await new Promise<void>((resolve) => {
          const done = (): void => {
            clearTimeout(timer);
            this.wake = null;
            resolve();
          };
          const timer = setTimeout(done, delay);
          this.wake = done;
        });
      }
      try {
        this.init.guard();
      } catch (err) {
        this.rejectQueued(err);
        return;
      }
      const group = this.takeGroup();
      this.lastGroupSize = group.length;
      if (group.length > 0) {
        this.recentGroups.push(group.length);
        if (this.recentGroups.length > RECENT_GROUPS) this.recentGroups.shift();
      }
      if (group.length === 0) continue;
      this.inflight = group;
      try {
        await this.runGroup(group);
      } catch (err) {
        // A bug or a local disk error: nothing may be left hanging.
        const failure = this.init.poison(new StorageFailure(`commit to database "${this.init.name}" failed unexpectedly; reopen and read the log.`, { cause: err }));
        for (const p of group) p.reject(failure);
      } finally {
        this.inflight = [];
      }
    }
  }

  /**
   * The next group: queue order, within etcd's limits (a record per commit and the head), no identity
   * twice, none already in the log. Called with nothing in flight, so every identity of the log is in
   * the local copy or pending its write there.
   */
  private takeGroup(): Pending[] {
    const group: Pending[] = [];
    const ids = new Set<string>();
    let bytes = 0;
    let i = 0;
    while (i < this.queue.length) {
      const p = this.queue[i]!;
      if (!p.checked) {
        this.checkAhead(i);
        continue; // p was refused (and removed) or is checked now
      }
      if (p.identities.some((id) => ids.has(id))) {
        p.checked = false;
        i++; // waits for the next group, where it will be refused as a duplicate if the first one lands
        continue;
      }
      if (group.length > 0 && (group.length + 2 > MAX_TXN_OPS || bytes + p.bytes > MAX_BATCH_BYTES)) break;
      group.push(p);
      this.queue.splice(i, 1);
      for (const id of p.identities) ids.add(id);
      bytes += p.bytes;
    }
    // Commits left queued that share an identity with this group must be checked again after it.
    for (let k = i; k < this.queue.length; k++) {
      const p = this.queue[k]!;
      if (p.checked && p.identities.some((id) => ids.has(id))) p.checked = false;
    }
    return group;
  }

  /**
   * Checks the unchecked commits from queue index `from` on (up to CHECK_AHEAD of them) against the
   * log in one lookup, and refuses (removing them from the queue) those holding an identity in it.
   */
  private checkAhead(from: number): void {
    const batch: Pending[] = [];
    const ids: string[] = [];
    for (let k = from; k < this.queue.length && batch.length < CHECK_AHEAD; k++) {
      const p = this.queue[k]!;
      if (p.checked) continue;
      batch.push(p);
      for (const id of p.identities) ids.push(id);
    }
    const present = new Set(this.init.copy.existing(ids));
    for (const p of batch) {
      p.checked = true;
      if (present.size === 0) continue;
      const held = p.identities.filter((id) => present.has(id));
      if (held.length === 0) continue;
      this.queue.splice(this.queue.indexOf(p), 1);
      p.reject(duplicateIdentity(held, "in the log"));
    }
  }

  private async runGroup(group: readonly Pending[]): Promise<void> {
    const { keys, epoch, name } = this.init;
    const expected = this.head;
    const token = `${epoch}.${this.tokenPrefix}.${(this.tokens++).toString(36)}`;
    let prev = this.lastHash;
    let seq = expected + 1;
    const records: BatchRecord[] = group.map((p) => {
      const first = seq;
      const last = seq + p.events.length - 1;
      seq = last + 1;
      const hash = chainHash(prev, first, p.eventsJson);
      prev = hash;
      return { header: { v: 1, first, last, epoch, token, hash }, eventsJson: p.eventsJson };
    });
    const newHead = seq - 1;
    const compare = [ownerGuard(keys.epoch, this.init.claimRevision), valueIs(keys.head, String(expected))];
    const success = [...records.map((r) => put(keys.log(r.header.first), encodeBatch(r))), put(keys.head, String(newHead))];
    const readBack = [get(keys.epoch), get(keys.head), get(keys.log(expected + 1))];

    const outcome = await this.send(compare, success, readBack, expected, token);
    switch (outcome.kind) {
      case "ok":
        await this.applied(group, records);
        return;
      case "fenced": {
        this.init.fence(outcome.epoch);
        const err = ResetError.fenced(name, epoch, outcome.epoch);
        for (const p of group) p.reject(err);
        return;
      }
      case "failed":
        for (const p of group) p.reject(outcome.error);
        return;
      case "damaged": {
        const failure = this.init.poison(
          new StorageFailure(
            `commit to database "${name}" was refused and nothing of it was written: ${outcome.reason}. This handle is unusable: find out what changed the database in etcd before reopening it.`,
          ),
        );
        for (const p of group) p.reject(failure);
        return;
      }
      case "unknown": {
        const failure = this.init.poison(
          new StorageFailure(`commit to database "${name}" may or may not be durable (${outcome.reason}); this handle is unusable: reopen and read the log.`, {
            cause: outcome.cause,
          }),
        );
        for (const p of group) p.reject(failure);
        return;
      }
    }
  }

  /** Sends the guarded txn until its outcome is known (see the file comment). */
  private async send(compare: ReturnType<typeof valueIs>[], success: IRequestOp[], readBack: IRequestOp[], expected: number, token: string): Promise<Outcome> {
    let maybeApplied = false;
    const retry = new Retry();
    for (;;) {
      if (this.init.isClosed()) {
        return maybeApplied
          ? { kind: "unknown", reason: "the handle was closed while the etcd quorum did not answer" }
          : { kind: "failed", error: new ResetError("stop", "closed", `database handle "${this.init.name}" was closed; nothing was written.`) };
      }
      try {
        this.ctx.counters.commitTxns++;
        const res = await this.ctx.commitTxn(compare, success, readBack);
        if (res.succeeded) return { kind: "ok" };
        return this.decide(res.responses, expected, token);
      } catch (err) {
        const kind = classifyEtcdError(err);
        if (kind !== "outage") {
          const error = this.ctx.fail(err, "commit to", this.init.name);
          // A definite refusal after an unanswered attempt says nothing about that attempt.
          if (maybeApplied || kind === "other" || kind === "closed") return { kind: "unknown", reason: error.message, cause: err };
          return { kind: "failed", error };
        }
        maybeApplied = true;
        const refusal = this.outageRefusal();
        if (refusal !== null) {
          // Queued commits were never sent: refused. This one may have applied: unknown.
          this.rejectQueued(refusal);
          return { kind: "unknown", reason: `${refusal.message.replace(/; nothing was written.*$/, "")}, while this commit was unanswered`, cause: err };
        }
        await retry.pause();
      }
    }
  }

  /** Reads the failure branch: epoch, head and the record at our first seq. */
  private decide(responses: readonly IResponseOp[], expected: number, token: string): Outcome {
    const headValue = valueOf(responses, 1);
    const kv = kvsOf(responses, 2)[0];
    if (kv) {
      const record = decodeBatch(kv.key.toString("utf8"), kv.value.toString("utf8"));
      if (record.header.token === token) return { kind: "ok" };
    }
    const fencer = fencedBy(responses, 0, this.init.epoch, this.init.claimRevision);
    if (fencer !== null) return { kind: "fenced", epoch: fencer.epoch };
    if (headValue === null) return { kind: "damaged", reason: `the head key was removed outside Cairn under this owner's epoch (it held ${expected})` };
    if (Number(headValue) !== expected) return { kind: "unknown", reason: `the cluster's head moved from ${expected} to ${headValue} under this owner's epoch without this commit` };
    // Both guards read back as they were compared, yet the transaction was refused: only a head
    // rewritten outside Cairn in another form (say "01" for 1) gets here.
    return { kind: "damaged", reason: `the epoch key (as this owner's claim wrote it) and the head (${headValue}) read back as this owner expects, yet etcd refused the guard: the head was rewritten outside Cairn` };
  }

  private async applied(group: readonly Pending[], records: readonly BatchRecord[]): Promise<void> {
    const last = records[records.length - 1]!.header;
    this.head = last.last;
    this.lastHash = last.hash;
    // Written to the local copy within a few ms (local-copy.ts); a failure to write it poisons the
    // handle then, as it would now (the commits themselves are durable).
    this.init.copy.appendSoon(records, group, (err) =>
      this.init.poison(new StorageFailure(`the local copy of "${this.init.name}" could not be written (the commits are durable); reopen to rebuild it.`, { cause: err })),
    );
    this.ctx.counters.commitsResolved += group.length;
    const faults = this.ctx.opts.faults;
    for (const [i, p] of group.entries()) {
      const h = records[i]!.header;
      if (faults !== undefined) {
        try {
          await faults("commit:after-durable");
        } catch (cause) {
          p.reject(
            this.init.poison(
              new StorageFailure(
                `commit to database "${this.init.name}" may or may not be durable (the acknowledgement was lost); this handle is unusable: reopen and read the log.`,
                { cause },
              ),
            ),
          );
          continue;
        }
      }
      p.resolve({ firstSeq: h.first, lastSeq: h.last });
    }
  }
}
