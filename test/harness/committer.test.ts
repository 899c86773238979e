/**
 * The harness's commit path (src/harness/committer.ts).
 *
 * Against a Database whose commits resolve when the test says so: how many batches are in flight per
 * adapter kind, folding strictly in seq order whatever order receipts arrive in, owner claims never
 * left out when a claiming batch is refused, a receipt gap filled by reading the log, and close
 * waiting for what is in flight.
 *
 * Where it sends several batches at once (an adapter with `groupsCommits`):
 * - against a simulated grouping adapter driven by a seeded random schedule: groups of any size,
 *   receipts delivered in any order (across groups too), batches refused as duplicates inside a
 *   group, sessions that need an owner claim, and fencing with batches queued, grouped and landed;
 *   the followers must see every durable event exactly once in seq order, callers must hear of their
 *   batch only once it is folded, in seq order, nothing durable may be left unacknowledged, each
 *   session is claimed exactly once before its first event of the epoch, and the projection equals a
 *   fold of the log;
 * - on a real replicated dev cluster (etcd members started and stopped here): many sessions with a
 *   scripted model and `true` cells, with snapshots every few events, ending with a log whose reopen
 *   (a fresh Harness.open, from the latest snapshot plus the tail) equals both the live projection
 *   and a fold of the whole log; concurrent posts of one id refused as duplicates inside a group; a
 *   second opener fencing the first while its batches are in flight (then resuming, posting and
 *   starting at once under its own claims); a close from inside a follower while batches are in
 *   flight; the etcd leader killed mid-run;
 * - on sqlite: still one commit at a time.
 *
 * Hang guards only (120 s); nothing here asserts on wall time.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import Sqlite from "better-sqlite3";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Committer } from "../../src/harness/committer.js";
import { Harness } from "../../src/harness/harness.js";
import { event, identity, parseLogEvent, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { sessionCreated } from "../../src/state/outcomes.js";
import { Reducer } from "../../src/state/reducer.js";
import type { CommitReceipt, Database, Storage } from "../../src/storage/contract.js";
import { ResetError, StorageRejected } from "../../src/storage/errors.js";
import { createReplicatedStorage, localCopyPath } from "../../storage-adapters/replicated/index.js";
import { FLUSH_MS } from "../../storage-adapters/replicated/local-copy.js";
import { setTimeout as sleep } from "node:timers/promises";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { passThrough, passThroughStorage } from "../../chaos/support/passthrough.js";
import { devCluster, tempDir } from "../replicated/helpers.js";
import { exitAfterTests } from "../support/exit.js";
import { LoopModel } from "../../chaos/support/loop-model.js";
import { rng } from "../../chaos/nemesis/rng.js";
import { withHarness } from "../support/harness.js";

const AT = "2026-12-04T00:00:00.000Z";
const EPOCH = 7;
const OWNER = { epoch: EPOCH, host: "h", boot_id: "b", pid: 1 };
const HANG = 120_000;

interface Sent {
  readonly events: readonly NewEvent[];
  resolve(receipt: CommitReceipt): void;
  reject(err: unknown): void;
}

/** A Database whose commits wait for the test; `log` is what `read` returns. */
function fakeDb(groupsCommits: boolean): { db: Database; sent: Sent[]; log: LogEvent[]; reads: number[] } {
  const sent: Sent[] = [];
  const log: LogEvent[] = [];
  const reads: number[] = [];
  const db = {
    name: "t",
    epoch: OWNER.epoch,
    groupsCommits,
    commit: (events: readonly NewEvent[]) => new Promise<CommitReceipt>((resolve, reject) => sent.push({ events, resolve, reject })),
    read: async (after = 0) => {
      reads.push(after);
      return log.filter((e) => e.seq > after);
    },
  } as unknown as Database;
  return { db, sent, log, reads };
}

function harness(db: Database, open = () => true) {
  const reducer = new Reducer();
  const committed: LogEvent[][] = [];
  const failures: unknown[] = [];
  const committer = new Committer({
    db,
    reducer: () => reducer,
    assertOpen: () => {
      if (!open()) throw new Error("the harness was closed");
    },
    owner: () => OWNER,
    committed: (logged) => committed.push([...logged]),
    failed: (err) => failures.push(err),
  });
  return { committer, reducer, committed, failures };
}

const created = (s: string): NewEvent => sessionCreated(s, { goal: "g", cwd: "/" }, AT);
const refusal = (s: string, n: number): NewEvent => event("post_refused", s, identity.postRefused(s, n), AT, { id: `m${n}`, kind: "note", code: "invalid", reason: "r" });
const tick = () => new Promise((r) => setImmediate(r));

/** Receipt for a sent batch at `first`. */
const receipt = (s: Sent, first: number): CommitReceipt => ({ firstSeq: first, lastSeq: first + s.events.length - 1 });

describe("the harness's committer", () => {
  it("groups: sends every batch asked for at once, and folds them in seq order when receipts arrive out of order", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const done = [h.committer.commit([created("a")]), h.committer.commit([created("b")]), h.committer.commit([created("c")])];
    await tick();
    assert.equal(sent.length, 3, "all three in flight together");
    // session_created + owner_claimed each: seqs 1-2, 3-4, 5-6. The last receipt arrives first.
    sent[2]!.resolve(receipt(sent[2]!, 5));
    await tick();
    assert.equal(h.reducer.headSeq, 0, "seq 5 waits for 1..4");
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await tick();
    assert.equal(h.reducer.headSeq, 2);
    sent[1]!.resolve(receipt(sent[1]!, 3));
    const logged = await Promise.all(done);
    assert.equal(h.reducer.headSeq, 6);
    assert.deepEqual(h.committed.map((l) => l.map((e) => e.seq)), [[1, 2], [3, 4], [5, 6]], "folded in seq order");
    assert.deepEqual(logged.map((l) => l.map((e) => e.kind)), [["session_created"], ["session_created"], ["session_created"]], "callers do not see the claims added for them");
    assert.deepEqual(h.reducer.projection().order, ["a", "b", "c"]);
  });

  it("one at a time: the next batch is sent only after the previous one was folded", async () => {
    const { db, sent } = fakeDb(false);
    const h = harness(db);
    const first = h.committer.commit([created("a")]);
    const second = h.committer.commit([created("b")]);
    await tick();
    assert.equal(sent.length, 1);
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await first;
    await tick();
    assert.equal(sent.length, 2);
    sent[1]!.resolve(receipt(sent[1]!, 3));
    await second;
    assert.equal(h.reducer.headSeq, 4);
  });

  it("a refused batch fails alone; the ones around it are folded", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const a = h.committer.commit([created("a")]);
    const b = h.committer.commit([created("b")]);
    const c = h.committer.commit([created("c")]);
    await tick();
    sent[1]!.reject(new StorageRejected("duplicate_identity", "already in the log"));
    sent[0]!.resolve(receipt(sent[0]!, 1));
    sent[2]!.resolve(receipt(sent[2]!, 3));
    await a;
    await assert.rejects(b, /already in the log/);
    await c;
    assert.equal(h.reducer.headSeq, 4);
    assert.equal(h.failures.length, 1);
  });

  it("a batch that needs a claim still in flight waits for it, and carries the claim itself when the claiming batch is refused", async () => {
    const { db, sent } = fakeDb(true);
    const h = harness(db);
    const s = "s";
    // Session s was created under an earlier owner: epoch 7 has not claimed it yet.
    h.reducer.apply([{ ...created(s), seq: 1 } as LogEvent]);
    const one = h.committer.commit([refusal(s, 1)]);
    const two = h.committer.commit([refusal(s, 2)]);
    const other = h.committer.commit([created("t")]);
    await tick();
    assert.equal(sent.length, 1, "the second batch of s (and everything after it) waits for the first's claim");
    assert.deepEqual(sent[0]!.events.map((e) => e.kind), ["owner_claimed", "post_refused"]);
    sent[0]!.reject(new StorageRejected("duplicate_identity", "refused"));
    await assert.rejects(one, /refused/);
    await tick();
    assert.equal(sent.length, 3);
    assert.deepEqual(sent[1]!.events.map((e) => e.kind), ["owner_claimed", "post_refused"], "the claim moved to the next batch of s");
    assert.deepEqual(sent[2]!.events.map((e) => e.kind), ["session_created", "owner_claimed"]);
    sent[1]!.resolve(receipt(sent[1]!, 2));
    sent[2]!.resolve(receipt(sent[2]!, 4));
    await Promise.all([two, other]);
    assert.ok(h.reducer.folded(identity.owner(s, OWNER.epoch)));
  });

  it("a receipt that continues nothing in flight is filled by reading the log", async () => {
    const { db, sent, log, reads } = fakeDb(true);
    const h = harness(db);
    const p = h.committer.commit([created("b")]);
    await tick();
    // Someone's batch at seqs 1..2 (not expected in practice: this owner is the one writer).
    log.push({ ...created("a"), seq: 1 } as LogEvent, { ...event("owner_claimed", "a", identity.owner("a", 7), AT, OWNER), seq: 2 } as LogEvent);
    for (const [i, e] of sent[0]!.events.entries()) log.push({ ...e, seq: 3 + i } as LogEvent);
    sent[0]!.resolve(receipt(sent[0]!, 3));
    const logged = await p;
    assert.deepEqual(reads, [0]);
    assert.deepEqual(logged.map((e) => e.seq), [3]);
    assert.equal(h.reducer.headSeq, 4);
    assert.deepEqual(h.reducer.projection().order, ["a", "b"]);
    assert.deepEqual(h.committed.flat().map((e) => e.seq).sort(), [1, 2, 3, 4], "the events read are shown to the listeners too");
  });

  it("a listener that throws after a fold rejects that caller (never a hang), and later commits go on", async () => {
    const { db, sent } = fakeDb(true);
    const reducer = new Reducer();
    const failures: unknown[] = [];
    let throwOnce = true;
    const committer = new Committer({
      db,
      reducer: () => reducer,
      assertOpen: () => undefined,
      owner: () => OWNER,
      committed: () => {
        if (throwOnce) {
          throwOnce = false;
          throw new Error("a listener's bug");
        }
      },
      failed: (err) => failures.push(err),
    });
    const first = committer.commit([created("a")]);
    const second = committer.commit([created("b")]);
    await tick();
    sent[0]!.resolve(receipt(sent[0]!, 1));
    sent[1]!.resolve(receipt(sent[1]!, 3));
    await assert.rejects(first, /a listener's bug/);
    assert.deepEqual((await second).map((e) => e.seq), [3]);
    assert.equal(failures.length, 1);
    await committer.settled();
  });

  it("settled() waits for what is in flight, and refuses what waits once the harness stopped", async () => {
    const { db, sent } = fakeDb(false);
    let open = true;
    const h = harness(db, () => open);
    const first = h.committer.commit([created("a")]);
    const second = h.committer.commit([created("b")]);
    await tick();
    open = false;
    let settled = false;
    const idle = h.committer.settled().then(() => (settled = true));
    await tick();
    assert.equal(settled, false, "the first batch is still in flight");
    sent[0]!.resolve(receipt(sent[0]!, 1));
    await first;
    await idle;
    await assert.rejects(second, /closed/);
    assert.equal(sent.length, 1, "the waiting batch was never sent");
  });
});

interface Queued {
  readonly events: readonly NewEvent[];
  resolve(r: CommitReceipt): void;
  reject(e: unknown): void;
}

/**
 * A grouping adapter as the contract allows it to behave: batches queue; a group takes the first k
 * queued; inside a group a batch whose identity is already in the log or earlier in the group is
 * refused and takes no seq (the pipeline defers it to the next group, where it is refused: the
 * same for the caller); the rest get consecutive seqs in queue order and are durable at once; each
 * outcome is then delivered when the schedule says so, in any order. Fencing refuses what is queued
 * and everything after; what was grouped before stays durable and is delivered.
 */
class SimDb {
  readonly name = "sim";
  readonly epoch = EPOCH;
  readonly groupsCommits = true;
  readonly log: LogEvent[] = [];
  readonly queue: Queued[] = [];
  readonly undelivered: (() => void)[] = [];
  fenced = false;
  groups = 0;
  maxGroup = 0;

  commit(events: readonly NewEvent[]): Promise<CommitReceipt> {
    return new Promise((resolve, reject) => {
      if (this.fenced) reject(ResetError.fenced(this.name, EPOCH, EPOCH + 1));
      else this.queue.push({ events: events.map((e) => structuredClone(e)), resolve, reject });
    });
  }

  async read(after = 0): Promise<LogEvent[]> {
    return this.log.filter((e) => e.seq > after).map((e) => structuredClone(e));
  }

  group(k: number): void {
    const group = this.queue.splice(0, k);
    if (group.length === 0) return;
    this.groups++;
    this.maxGroup = Math.max(this.maxGroup, group.length);
    const inLog = new Set(this.log.map((e) => e.identity));
    for (const q of group) {
      const ids = q.events.map((e) => e.identity);
      const dup = ids.filter((id) => inLog.has(id));
      if (dup.length > 0 || new Set(ids).size !== ids.length) {
        this.undelivered.push(() => q.reject(new StorageRejected("duplicate_identity", `refused the whole batch: identity in the log: ${dup.join(", ")}`)));
        continue;
      }
      const first = this.log.length + 1;
      q.events.forEach((e, i) => this.log.push({ ...structuredClone(e), seq: first + i } as LogEvent));
      for (const id of ids) inLog.add(id);
      this.undelivered.push(() => q.resolve({ firstSeq: first, lastSeq: first + q.events.length - 1 }));
    }
  }

  deliver(i: number): void {
    const [d] = this.undelivered.splice(i, 1);
    d?.();
  }

  fence(): void {
    this.fenced = true;
    for (const q of this.queue.splice(0)) this.undelivered.push(() => q.reject(ResetError.fenced(this.name, EPOCH, EPOCH + 1)));
  }
}

interface Scenario {
  readonly followed: LogEvent[][];
  readonly resolvedOrder: number[];
  readonly acknowledged: Set<string>;
  readonly refusedOnPurpose: Set<string>;
  readonly unexpected: string[];
  readonly db: SimDb;
  readonly reducer: Reducer;
  readonly initial: number;
  readonly fencedAt: number | null;
}

/** One random schedule. */
async function runScenario(seed: number): Promise<Scenario> {
  const r = rng(seed);
  const db = new SimDb();
  const reducer = new Reducer();
  // Sessions created under an earlier owner (epoch 6, already claimed then): this owner must claim them.
  const old = ["o1", "o2", "o3"].slice(0, 1 + Math.floor(r() * 3));
  for (const s of old) {
    const first = db.log.length + 1;
    db.log.push(
      { ...created(s), seq: first } as LogEvent,
      { ...event("owner_claimed", s, identity.owner(s, EPOCH - 1), AT, { ...OWNER, epoch: EPOCH - 1 }), seq: first + 1 } as LogEvent,
      { ...refusal(s, 1000), seq: first + 2 } as LogEvent,
    );
  }
  reducer.apply(db.log.map((e) => structuredClone(e)));
  const initial = db.log.length;

  let open = true;
  const followed: LogEvent[][] = [];
  const resolvedOrder: number[] = [];
  const acknowledged = new Set<string>();
  const refusedOnPurpose = new Set<string>();
  const unexpected: string[] = [];
  const committer = new Committer({
    db: db as unknown as Database,
    reducer: () => reducer,
    assertOpen: () => {
      if (!open) throw new ResetError("stop", "fenced", "the harness stopped");
    },
    owner: () => OWNER,
    committed: (logged) => followed.push(logged.map((e) => structuredClone(e))),
    failed: (err) => {
      if (err instanceof ResetError) open = false; // as the harness does: fenced means stopped, at once
    },
  });

  const commit = async (events: NewEvent[], duplicate: boolean): Promise<"ok" | "refused" | "stopped"> => {
    try {
      const logged = await committer.commit(events);
      // Heard of only once folded: every event of it, and everything before it, is in the projection.
      for (const e of logged) if (!reducer.folded(e.identity)) unexpected.push(`resolved before its fold: ${e.identity}`);
      const last = logged[logged.length - 1]!.seq;
      if (reducer.headSeq < last) unexpected.push(`resolved at head ${reducer.headSeq} < ${last}`);
      assert.deepEqual(
        logged.map((e) => e.identity),
        events.map((e) => e.identity),
      );
      resolvedOrder.push(logged[0]!.seq);
      for (const e of logged) {
        const inLog = db.log[e.seq - 1];
        if (inLog?.identity !== e.identity) unexpected.push(`caller told seq ${e.seq} = ${e.identity}, log has ${inLog?.identity}`);
        acknowledged.add(e.identity);
      }
      if (duplicate) unexpected.push(`a duplicate was accepted: ${events[0]!.identity}`);
      return "ok";
    } catch (err) {
      if (err instanceof ResetError) return "stopped";
      if (err instanceof StorageRejected && duplicate) {
        for (const e of events) refusedOnPurpose.add(e.identity);
        return "refused";
      }
      unexpected.push(`unexpected failure: ${(err as Error).message}`);
      return "stopped";
    }
  };

  // Drivers: each session commits its batches one after the other (as a session's round loop does);
  // now and then one also sends again, at once, a batch that was already committed (a duplicate), or
  // another part of the harness commits for the same session while its batch is in flight.
  const sessions = [...old, ...Array.from({ length: 2 + Math.floor(r() * 4) }, (_, i) => `n${i}`)];
  let n = 0;
  const drivers = sessions.map(async (s) => {
    const batches = 2 + Math.floor(r() * 5);
    const done: NewEvent[][] = [];
    const extra: Promise<unknown>[] = [];
    // The first batch an old session sends under this epoch is sometimes a duplicate of an event of
    // the earlier epoch: it carries the session's claim and is refused, so the claim must move on.
    if (old.includes(s) && r() < 0.5) extra.push(commit([refusal(s, 1000)], true));
    for (let b = 0; b < batches; b++) {
      const events: NewEvent[] = [];
      if (b === 0 && !old.includes(s)) events.push(created(s));
      const k = (b === 0 && !old.includes(s) ? 0 : 1) + Math.floor(r() * 3);
      for (let i = 0; i < k; i++) events.push(refusal(s, ++n));
      if (done.length > 0 && r() < 0.3) {
        const again = done[Math.floor(r() * done.length)]!;
        extra.push(commit(again.map((e) => structuredClone(e)), true));
      }
      // Another part of the harness (a post, a timer) commits for the same session at the same time.
      if (r() < 0.4 && !(b === 0 && !old.includes(s))) extra.push(commit([refusal(s, ++n)], false));
      const outcome = await commit(events, false);
      if (outcome !== "ok") break;
      done.push(events);
    }
    await Promise.all(extra);
  });
  let finished = false;
  void Promise.all(drivers).then(() => (finished = true));

  // The schedule.
  const fenceAfter = r() < 0.35 ? 3 + Math.floor(r() * 25) : null;
  let steps = 0;
  let fencedAt: number | null = null;
  while (!finished || db.queue.length > 0 || db.undelivered.length > 0) {
    steps++;
    if (steps > 20_000) throw new Error(`seed ${seed}: the schedule never ended (queue ${db.queue.length}, undelivered ${db.undelivered.length})`);
    if (fenceAfter !== null && fencedAt === null && steps >= fenceAfter) {
      db.fence();
      fencedAt = db.log.length;
    }
    const x = r();
    if (x < 0.35 && db.queue.length > 0) db.group(1 + Math.floor(r() * db.queue.length));
    else if (x < 0.75 && db.undelivered.length > 0) db.deliver(Math.floor(r() * db.undelivered.length));
    else await tick();
  }
  await Promise.race([committer.settled(), new Promise((_, reject) => setTimeout(() => reject(new Error(`seed ${seed}: settled() never resolved`)), HANG).unref())]);
  return { followed, resolvedOrder, acknowledged, refusedOnPurpose, unexpected, db, reducer, initial, fencedAt };
}

describe("the committer against a simulated grouping adapter (seeded schedules)", () => {
  it("300 random schedules: followers see every durable event once, in seq order; callers hear after their fold, in seq order; nothing durable unacknowledged; one claim per session before its events; projection = fold of the log", async () => {
    let grouped = 0;
    let fenced = 0;
    let duplicates = 0;
    for (let seed = 1; seed <= 300; seed++) {
      const s = await runScenario(seed);
      const where = `seed ${seed}`;
      assert.deepEqual(s.unexpected, [], where);
      const seen = s.followed.flat().map((e) => e.seq);
      assert.deepEqual(
        seen,
        Array.from({ length: s.db.log.length - s.initial }, (_, i) => s.initial + 1 + i),
        `${where}: the followers saw seqs ${seen.join(",")}`,
      );
      for (const e of s.followed.flat()) assert.deepEqual(e, s.db.log[e.seq - 1], `${where}: seq ${e.seq} as followed`);
      assert.deepEqual(
        s.resolvedOrder,
        [...s.resolvedOrder].sort((a, b) => a - b),
        `${where}: callers heard in seq order`,
      );
      for (const e of s.db.log.slice(s.initial)) {
        if (e.kind === "owner_claimed") continue;
        assert.ok(s.acknowledged.has(e.identity), `${where}: ${e.identity} is durable (seq ${e.seq}) but its caller was not told`);
      }
      // Claims: exactly one per session under this epoch, before (or right after the creation of) any other event of it.
      const bySession = new Map<string, LogEvent[]>();
      for (const e of s.db.log.slice(s.initial)) bySession.set(e.session, [...(bySession.get(e.session) ?? []), e]);
      for (const [session, events] of bySession) {
        const claims = events.filter((e) => e.kind === "owner_claimed");
        assert.equal(claims.length, 1, `${where}: session ${session} claimed ${claims.length} times`);
        const at = events.indexOf(claims[0]!);
        assert.ok(at === 0 || (at === 1 && events[0]!.kind === "session_created"), `${where}: session ${session}'s claim is event ${at} of its ${events.map((e) => e.kind).join(",")}`);
        assert.equal(claims[0]!.identity, identity.owner(session, EPOCH));
      }
      const fold = new Reducer();
      fold.apply(s.db.log.map((e) => structuredClone(e)));
      assert.equal(s.reducer.headSeq, s.db.log.length, `${where}: the projection's head`);
      assert.deepEqual(s.reducer.projection().order, fold.projection().order);
      for (const id of fold.projection().order) assert.deepEqual(s.reducer.session(id), fold.session(id), `${where}: session ${id}`);
      if (s.db.maxGroup > 1) grouped++;
      if (s.fencedAt !== null) fenced++;
      if (s.refusedOnPurpose.size > 0) duplicates++;
    }
    // The schedules did exercise what they are for.
    assert.ok(grouped > 200, `${grouped} schedules had a group of more than one batch`);
    assert.ok(fenced > 50, `${fenced} schedules were fenced`);
    assert.ok(duplicates > 100, `${duplicates} schedules had a duplicate refused`);
  });

  it(
    "events read in a catch-up (a receipt that continues nothing) reach the followers in seq order",
    async () => {
      const db = new SimDb();
      const reducer = new Reducer();
      const followed: number[] = [];
      const committer = new Committer({
        db: db as unknown as Database,
        reducer: () => reducer,
        assertOpen: () => undefined,
        owner: () => OWNER,
        committed: (logged) => followed.push(...logged.map((e) => e.seq)),
        failed: () => undefined,
      });
      const p = committer.commit([created("b")]);
      await tick();
      // Someone else's batch lands first (seqs 1..2), then ours (3..4).
      db.log.push({ ...created("a"), seq: 1 } as LogEvent, { ...event("owner_claimed", "a", identity.owner("a", EPOCH), AT, OWNER), seq: 2 } as LogEvent);
      db.group(1);
      db.deliver(0);
      await p;
      assert.deepEqual(followed, [1, 2, 3, 4]);
    },
  );
});

// ---------------------------------------------------------------------------------------------
// On a real replicated dev cluster.


/** A storage whose databases count how many commits are in flight at once (the most seen). */
function counting(storage: Storage): { storage: Storage; maxInFlight: () => number; inFlight: () => number; commits: () => number; refused: string[] } {
  let inFlight = 0;
  let max = 0;
  let commits = 0;
  const refused: string[] = [];
  const wrapped = passThroughStorage(storage, (db) =>
    passThrough(db, {
      commit: (events) => {
        commits++;
        inFlight++;
        max = Math.max(max, inFlight);
        const p = db.commit(events);
        void p.then(
          () => inFlight--,
          (err: unknown) => {
            inFlight--;
            refused.push((err as { reason?: string }).reason ?? String(err));
          },
        );
        return p;
      },
    }),
  );
  return { storage: wrapped, maxInFlight: () => max, inFlight: () => inFlight, commits: () => commits, refused };
}

/** A follower that checks, as it goes, that batches come in seq order with no gap and no repeat. */
function follower(h: Harness, from: number): { events: LogEvent[]; problems: string[]; stop: () => void } {
  const events: LogEvent[] = [];
  const problems: string[] = [];
  let next = from + 1;
  const stop = h.follow((batch) => {
    for (const e of batch) {
      if (e.seq !== next) problems.push(`expected seq ${next}, got ${e.seq} (${e.identity})`);
      next = e.seq + 1;
      events.push(structuredClone(e));
    }
  });
  return { events, problems, stop };
}

/**
 * The whole log and its fold, from the machines' local copies (the cluster itself keeps only what
 * follows the last snapshot): every seq from 1 to the end, each the same wherever it is held.
 */
function fullLog(dataDirs: readonly string[], name: string): { log: LogEvent[]; fold: Reducer } {
  const bySeq = new Map<number, LogEvent>();
  for (const dir of dataDirs) {
    const file = localCopyPath(dir, name);
    if (!existsSync(file)) continue;
    const db = new Sqlite(file, { readonly: true });
    try {
      for (const row of db.prepare("SELECT seq, json FROM events ORDER BY seq").all() as { seq: number; json: string }[]) {
        const e = parseLogEvent({ ...(JSON.parse(row.json) as Omit<LogEvent, "seq">), seq: row.seq });
        const known = bySeq.get(e.seq);
        if (known !== undefined) assert.deepEqual(e, known, `seq ${e.seq} differs between local copies`);
        bySeq.set(e.seq, e);
      }
    } finally {
      db.close();
    }
  }
  const log = [...bySeq.values()].sort((a, b) => a.seq - b.seq);
  log.forEach((e, i) => assert.equal(e.seq, i + 1, "the local copies hold every seq"));
  const fold = new Reducer();
  fold.apply(log.map((e) => structuredClone(e)));
  return { log, fold };
}

/**
 * fullLog once the local copies hold seq `head` at least: a live owner writes its commits to its
 * copy within FLUSH_MS (local-copy.ts), so a file read beside it may trail by that much. Bounded:
 * a copy that never catches up is returned as it is, and the comparisons that follow fail.
 */
async function fullLogFrom(dataDirs: readonly string[], name: string, head: number): Promise<{ log: LogEvent[]; fold: Reducer }> {
  const until = Date.now() + 10_000;
  for (;;) {
    const got = fullLog(dataDirs, name);
    if (got.log.length >= head || Date.now() > until) return got;
    await sleep(FLUSH_MS);
  }
}

/** The highest seq a harness has folded (its sessions' last events). */
function headOf(h: Harness): number {
  return Math.max(0, ...h.sessions().map((id) => h.session(id)?.last_seq ?? 0));
}

function assertSameProjection(h: Harness, fold: Reducer, what: string): void {
  assert.deepEqual([...h.sessions()], [...fold.projection().order], `${what}: sessions`);
  for (const id of fold.projection().order) assert.deepEqual(h.session(id), fold.session(id), `${what}: session ${id}`);
}

function withHangGuard<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not settle within ${HANG / 1000} s`)), HANG);
    }),
  ]);
}

describe("the committer on sqlite, one batch at a time", () => {
  it("8 sessions: never more than one commit in flight, followers in seq order, live projection = fold of the log", async () => {
    const tmp = tempDir("committer-sqlite");
    try {
      const c = counting(createSqliteStorage({ dataDir: join(tmp.dir, "data") }));
      await withHarness({ storage: c.storage, name: "one", model: new LoopModel(4), workDir: join(tmp.dir, "work") }, async (h) => {
        const f = follower(h, 0);
        const ids = await Promise.all(Array.from({ length: 8 }, () => h.start({ goal: "loop", cwd: tmp.dir, budgets: { max_rounds: 10 } })));
        const runs = await withHangGuard(Promise.all(ids.map((id) => h.wait(id))), "the runs");
        for (const o of runs) assert.equal(o.result, "success", o.reason);
        await h.settled();
        assert.equal(c.maxInFlight(), 1);
        assert.deepEqual(f.problems, []);
        const reader = await c.storage.reader("one");
        const fold = new Reducer();
        fold.apply(await reader.read());
        await reader.close();
        assertSameProjection(h, fold, "sqlite");
      }).finally(() => c.storage.close());
    } finally {
      tmp.remove();
    }
  });
});

describe("the committer on a real replicated dev cluster", () => {
  let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
  const dirs = tempDir("committer-replicated");
  const storages: Storage[] = [];
  const harnesses: Harness[] = [];
  let n = 0;
  const dataDirs: string[] = [];
  const machine = (): Storage => {
    const dataDir = join(dirs.dir, `m${++n}`);
    const s = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir });
    storages.push(s);
    dataDirs.push(dataDir);
    return s;
  };
  const open = async (storage: Storage, name: string, rounds: number): Promise<Harness> => {
    const h = await withHangGuard(Harness.open({ storage, name, model: new LoopModel(rounds), workDir: join(dirs.dir, "work"), snapshots: { events: 23 } }), "Harness.open");
    harnesses.push(h);
    return h;
  };
  const cwd = join(dirs.dir, "cwd");

  before(async () => {
    mkdirSync(cwd, { recursive: true });
    dc = await devCluster();
  });
  after(async () => {
    for (const h of harnesses) await h.close().catch(() => undefined);
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    dirs.remove();
  });

  it("12 sessions at once: batches in flight together, followers see seqs in order with no gap, and reopen (snapshot + tail) = live projection = fold of the whole log", async () => {
    const name = "many";
    const rounds = 5;
    const c = counting(machine());
    const h = await open(c.storage, name, rounds);
    const f = follower(h, 0);
    const ids = await Promise.all(Array.from({ length: 12 }, () => h.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
    const outcomes = await withHangGuard(Promise.all(ids.map((id) => h.wait(id))), "the runs");
    for (const o of outcomes) assert.equal(o.result, "success", o.reason);
    await h.settled();
    assert.ok(c.maxInFlight() > 1, `batches were in flight together (at most ${c.maxInFlight()} seen)`);
    assert.deepEqual(f.problems, []);

    const live = { sessions: [...h.sessions()], projections: h.sessions().map((id) => structuredClone(h.session(id))) };
    const { log, fold } = await fullLogFrom(dataDirs, name, headOf(h));
    assert.deepEqual(
      f.events.map((e) => e.identity),
      log.map((e) => e.identity),
      "the followers saw exactly the log",
    );
    assert.deepEqual(f.events, log, "with the same content");
    assertSameProjection(h, fold, "live");
    await h.close();

    // Reopened on another machine (an empty local copy) and on this one: from the latest snapshot plus the tail.
    for (const storage of [machine(), c.storage]) {
      const again = await open(storage, name, rounds);
      assertSameProjection(again, fold, "reopened");
      assert.deepEqual([...again.sessions()], live.sessions);
      await again.close();
    }
  });

  it("duplicates refused inside a group: concurrent posts of one id (same content) give exactly one new and the rest duplicates; of one id with other content, one wins and the other is refused as a conflict; nothing else is disturbed", async () => {
    const name = "posts";
    const rounds = 8;
    const c = counting(machine());
    const h = await open(c.storage, name, rounds);
    const f = follower(h, 0);
    const ids = await Promise.all(Array.from({ length: 4 }, () => h.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
    const posts: { session: string; id: string; content: number; p: Promise<{ duplicate: boolean }> }[] = [];
    for (const session of ids) {
      for (let k = 0; k < 5; k++) for (let copy = 0; copy < 3; copy++) posts.push({ session, id: `same-${k}`, content: 0, p: h.post(session, { id: `same-${k}`, kind: "ci", payload: { k } }) });
      for (let k = 0; k < 2; k++) for (const content of [1, 2]) posts.push({ session, id: `clash-${k}`, content, p: h.post(session, { id: `clash-${k}`, kind: "ci", payload: { content } }) });
    }
    const settled = await withHangGuard(Promise.allSettled(posts.map((x) => x.p)), "the posts");
    const outcomes = new Map<string, string[]>();
    settled.forEach((r, i) => {
      const key = `${posts[i]!.session}/${posts[i]!.id}`;
      const word = r.status === "fulfilled" ? (r.value.duplicate ? "duplicate" : "new") : `refused:${(r.reason as StorageRejected).reason}`;
      outcomes.set(key, [...(outcomes.get(key) ?? []), word]);
    });
    for (const [key, words] of outcomes) {
      if (key.includes("/same-")) assert.deepEqual([...words].sort(), ["duplicate", "duplicate", "new"], key);
      else assert.deepEqual([...words].sort(), ["new", "refused:conflict"], key);
    }
    assert.equal(h.status, "open");
    // Two starts of one explicit id at once: one run, the other refused with a sentence.
    const twice = await Promise.allSettled([h.start({ id: "dup", goal: "loop", cwd }), h.start({ id: "dup", goal: "loop", cwd })]);
    assert.deepEqual(twice.map((t) => t.status).sort(), ["fulfilled", "rejected"]);
    const refusedStart = twice.find((t) => t.status === "rejected") as PromiseRejectedResult;
    assert.match(String((refusedStart.reason as Error).message), /session:dup|dup/);
    ids.push("dup");
    const runs = await withHangGuard(Promise.all(ids.map((id) => h.wait(id))), "the runs");
    // The scripted model concludes blindly; a conclusion is refused while posted observations are
    // unread (admission's conclusion_blocked), so a run may end as a failure: either way it ended.
    for (const o of runs) assert.ok(o.result === "success" || /no admissible patch/.test(o.reason ?? ""), `${o.session}: ${o.result} ${o.reason}`);
    await h.settled();
    assert.deepEqual(f.problems, []);
    const { log, fold } = await fullLogFrom(dataDirs, name, headOf(h));
    assert.deepEqual(
      f.events.map((e) => e.seq),
      log.map((e) => e.seq),
    );
    assertSameProjection(h, fold, "live");
    // What each winner posted is what the log holds.
    for (const session of ids.filter((id) => id !== "dup")) {
      for (let k = 0; k < 2; k++) {
        const inbox = log.filter((e) => e.kind === "inbox_received" && e.identity === identity.inbox(session, `clash-${k}`));
        assert.equal(inbox.length, 1);
        const winner = posts.findIndex((x, i) => x.session === session && x.id === `clash-${k}` && settled[i]!.status === "fulfilled");
        assert.deepEqual((inbox[0]!.body as { observation: { payload: unknown } }).observation.payload, { content: posts[winner]!.content });
      }
    }
    await h.close();
  });

  it("fenced by a second opener while batches are in flight: the first stops and closes, everything its followers saw is in the log unchanged, the second's projection = fold of the log and it finishes the runs", async () => {
    const name = "fenced";
    const rounds = 40;
    const ca = counting(machine());
    const a = await open(ca.storage, name, rounds);
    const fa = follower(a, 0);
    const ids = await Promise.all(Array.from({ length: 8 }, () => a.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
    // Fenced in the middle of the runs: many batches are asked for, in flight and landing.
    await withHangGuard(
      new Promise<void>((resolve) => {
        const check = setInterval(() => {
          if (fa.events.length >= 150) {
            clearInterval(check);
            resolve();
          }
        }, 5);
      }),
      "150 events",
    );
    const inFlightAtFence = ca.inFlight();
    const storageB = machine();
    const opening = open(storageB, name, rounds);
    await withHangGuard(
      new Promise<void>((resolve) => {
        if (a.status !== "open") resolve();
        a.onStop(() => resolve());
      }),
      "the first harness stopping",
    );
    assert.equal(a.status, "fenced");
    const waits = await Promise.allSettled(ids.map((id) => a.wait(id)));
    for (const w of waits) {
      if (w.status === "fulfilled") continue; // a run may have ended before the fence
      assert.equal((w.reason as ResetError).reason, "fenced");
    }
    await withHangGuard(a.close(), "close of the fenced harness");
    const b = await opening;
    assert.deepEqual(fa.problems, []);

    const { log, fold } = await fullLogFrom(dataDirs, name, headOf(b));
    for (const e of fa.events) assert.deepEqual(log[e.seq - 1], e, `seq ${e.seq}: what the first owner's followers saw is in the log`);
    const firstOfB = log.findIndex((e) => e.kind === "owner_claimed" && e.body.epoch === b.epoch);
    const unacknowledged = (firstOfB < 0 ? log.length : firstOfB) - fa.events.length;
    assert.ok(unacknowledged >= 0);
    // The second owner's view after open: the fold of the log.
    assertSameProjection(b, fold, "the second owner at open");

    const fb = follower(b, log.length);
    // Every session needs this epoch's claim: resume, posts to every session and a new run all at
    // once, so batches of a session wait behind its claim in flight.
    const posted = ids.flatMap((id) => [0, 1, 2].map((k) => b.post(id, { id: `after-fence-${k}`, kind: "ci", payload: { k } })));
    const [, extraRun] = await Promise.all([b.resume(), b.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })]);
    ids.push(extraRun);
    await Promise.allSettled(posted);
    const outcomes = await withHangGuard(Promise.all(ids.map((id) => b.wait(id))), "the runs under the second owner");
    for (const o of outcomes) assert.ok(o.result === "success" || o.result === "failure", `${o.session}: ${o.result} ${o.reason}`);
    await b.settled();
    assert.deepEqual(fb.problems, []);
    const end = await fullLogFrom(dataDirs, name, headOf(b));
    assertSameProjection(b, end.fold, "the second owner at the end");
    assert.deepEqual(
      fb.events.map((e) => e.seq),
      end.log.slice(log.length).map((e) => e.seq),
    );
    // Claims never split: each session's first event under the second owner is its claim (right
    // after session_created for a new run), and it is claimed once.
    const bySession = new Map<string, LogEvent[]>();
    for (const e of end.log.slice(log.length)) bySession.set(e.session, [...(bySession.get(e.session) ?? []), e]);
    for (const [session, events] of bySession) {
      const claims = events.filter((e) => e.kind === "owner_claimed");
      assert.equal(claims.length, 1, `session ${session}: ${claims.length} claims`);
      assert.equal(claims[0]!.kind === "owner_claimed" && claims[0]!.body.epoch, b.epoch);
      const at = events.indexOf(claims[0]!);
      assert.ok(at === 0 || (at === 1 && events[0]!.kind === "session_created"), `session ${session}: claim at ${at} of ${events.map((e) => e.kind).join(",")}`);
    }
    await b.close();
    process.stderr.write(
      `committer (fenced): ${inFlightAtFence} commits in flight when the second opener started, ${ca.refused.length} refused after (${[...new Set(ca.refused)].join(", ")}), ${unacknowledged} events durable but never folded by the fenced owner (allowed: never acknowledged)\n`,
    );
  });

  it("closed while batches are in flight: close resolves, everything acknowledged is in the log, and a reopen = fold of the log and finishes the runs", async () => {
    const name = "closed";
    const rounds = 40;
    const storage = machine();
    const h = await open(storage, name, rounds);
    const f = follower(h, 0);
    const ids = await Promise.all(Array.from({ length: 8 }, () => h.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
    // Closed from inside a follower's call (synchronously, in the middle of folding a run of landed
    // batches), with the next batches asked for, in flight and landing.
    const closing = await withHangGuard(
      new Promise<{ done: Promise<void> }>((resolve) => {
        const stop = h.follow(() => {
          if (f.events.length >= 120) {
            stop();
            resolve({ done: h.close() });
          }
        });
      }),
      "120 events",
    );
    await withHangGuard(closing.done, "close with batches in flight");
    assert.equal(h.status, "closed");
    assert.deepEqual(f.problems, []);
    const { log, fold } = await fullLogFrom(dataDirs, name, f.events.at(-1)?.seq ?? 0);
    for (const e of f.events) assert.deepEqual(log[e.seq - 1], e, `seq ${e.seq}`);
    assert.ok(log.length >= f.events.length);

    const again = await open(storage, name, rounds);
    assertSameProjection(again, fold, "reopened after close");
    await again.resume();
    const outcomes = await withHangGuard(Promise.all(ids.map((id) => again.wait(id))), "the runs after reopen");
    for (const o of outcomes) assert.ok(o.result === "success" || o.result === "failure", `${o.session}: ${o.result} ${o.reason}`);
    await again.settled();
    const end = await fullLogFrom(dataDirs, name, headOf(again));
    assertSameProjection(again, end.fold, "at the end");
    await again.close();
  });

  it("the etcd leader killed (SIGKILL) while 8 sessions have batches in flight, then restarted: followers still see every seq once in order, and the end state (reopened) = fold of the log", async () => {
    const name = "leader";
    const rounds = 30;
    const c = counting(machine());
    const h = await open(c.storage, name, rounds);
    const f = follower(h, 0);
    const ids = await Promise.all(Array.from({ length: 8 }, () => h.start({ goal: "loop", cwd, budgets: { max_rounds: rounds + 5 } })));
    await withHangGuard(
      new Promise<void>((resolve) => {
        const stop = h.follow(() => {
          if (f.events.length >= 100) {
            stop();
            resolve();
          }
        });
      }),
      "100 events",
    );
    const status = await dc!.cluster.status();
    const leader = status.members.findIndex((m) => m.isLeader);
    assert.ok(leader >= 0, "a leader");
    const inFlight = c.inFlight();
    await dc!.cluster.kill(leader, "SIGKILL");
    try {
      const seen = f.events.length;
      await withHangGuard(
        new Promise<void>((resolve) => {
          const check = setInterval(() => {
            if (f.events.length >= seen + 100 || h.status !== "open") {
              clearInterval(check);
              resolve();
            }
          }, 10);
        }),
        "100 more events with the leader gone",
      );
    } finally {
      await dc!.cluster.restart(leader);
    }
    const ended = await Promise.allSettled(ids.map((id) => withHangGuard(h.wait(id), `run ${id}`)));
    const status2 = h.status;
    await h.settled();
    assert.deepEqual(f.problems, []);
    await withHangGuard(h.close(), "close");
    const { log, fold } = await fullLogFrom(dataDirs, name, f.events.at(-1)?.seq ?? 0);
    for (const e of f.events) assert.deepEqual(log[e.seq - 1], e, `seq ${e.seq}`);
    const again = await open(c.storage, name, rounds);
    assertSameProjection(again, fold, "reopened after the leader's death");
    await again.close();
    process.stderr.write(
      `committer (leader killed): ${inFlight} commits in flight at the kill; harness ${status2}; runs ${ended.map((e) => (e.status === "fulfilled" ? e.value.result : "stopped")).join(",")}; refused ${[...new Set(c.refused)].join(",") || "none"}\n`,
    );
    if (status2 === "open") for (const e of ended) assert.equal(e.status === "fulfilled" && e.value.result, "success");
  });
});

exitAfterTests("test/harness/committer.test.ts");
