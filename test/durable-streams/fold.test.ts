/**
 * The log fold (storage-adapters/durable-streams/fold.ts), pure:
 *  - worked examples of what it voids and what it refuses;
 *  - a model-based property: a simulated server that checks producers exactly as the protocol says
 *    and, like the reference server killed between its data fsync and its producer-state update,
 *    sometimes keeps a record while forgetting it accepted it ("orphan"), or loses only the answer;
 *    writers follow the adapter's protocol (claim, read back, opened, commits, the same record resent
 *    after a lost answer, reads back after a duplicate or a fence). Over random histories (seeded:
 *    FC_SEED=<n> re-runs one): the fold never refuses such a log, every acknowledged commit is counted
 *    at the seqs its receipt named, no acknowledged commit of an owner lands after a later owner's
 *    completed open, and a fold started at any offset from the state stored there ends the same.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { applyRecord, claimFrame, cloneState, emptyState, LogDiverged, topEpoch, type FoldState } from "../../storage-adapters/durable-streams/fold.js";
import { commitRecord, type LogRecord } from "../../storage-adapters/durable-streams/records.js";

const claim = (e: number, n = `n${e}`): LogRecord => ({ v: 1, t: "claim", e, s: 0, n, host: "h", pid: 1, at: "t" });
const opened = (e: number): LogRecord => ({ v: 1, t: "opened", e, s: 1 });
const commit = (e: number, s: number, f: number, c = 1, tag = ""): LogRecord => commitRecord(e, s, f, c, JSON.stringify({ e, s, f, tag }));

function fold(records: readonly LogRecord[], from: FoldState = emptyState()): FoldState {
  const state = cloneState(from);
  for (const r of records) applyRecord(state, r);
  return state;
}

describe("durable-streams log fold: examples", () => {
  it("counts a clean chain: claim, opened, commits; a newer claim supersedes", () => {
    const s = fold([claim(1), opened(1), commit(1, 2, 1, 3), commit(1, 3, 4, 2), claim(2), opened(2), commit(2, 2, 6)]);
    assert.equal(s.head, 6);
    assert.equal(topEpoch(s), 2);
    assert.equal(s.maxEpoch, 2);
    assert.ok(s.frames.length <= 2, "only the last proven frame and the top are kept");
  });

  it("voids a claim the server forgot when the old owner's next append follows it (the old owner's receipt stands)", () => {
    const s = fold([claim(1), opened(1), commit(1, 2, 1), claim(2, "orphan"), commit(1, 3, 2)]);
    assert.equal(s.head, 2);
    assert.equal(topEpoch(s), 1);
    assert.equal(claimFrame(s, 2), undefined);
    assert.equal(s.maxEpoch, 2, "the voided claim's epoch is still never reused");
  });

  it("voids a commit the server forgot when its writer resent the same one: the events count once, at the same seqs", () => {
    const s = fold([claim(1), opened(1), commit(1, 2, 1, 2), commit(1, 3, 3, 2, "x"), commit(1, 3, 3, 2, "x"), commit(1, 4, 5)]);
    assert.equal(s.head, 5);
  });

  it("of two claims at one epoch (the first forgotten), the second counts", () => {
    const s = fold([claim(1), opened(1), claim(2, "a"), claim(2, "b"), opened(2)]);
    assert.equal(claimFrame(s, 2)?.n, "b");
  });

  it("refuses a record of an older epoch after a completed open (only a server that lost acknowledged state accepts it)", () => {
    assert.throws(() => fold([claim(1), opened(1), commit(1, 2, 1), claim(2), opened(2), commit(1, 3, 2)]), LogDiverged);
  });

  it("refuses another commit at a seq already counted, and a commit whose first seq does not follow the log", () => {
    assert.throws(() => fold([claim(1), opened(1), commit(1, 2, 1, 1, "a"), commit(1, 3, 2), commit(1, 3, 2, 1, "b")]), LogDiverged);
    assert.throws(() => fold([claim(1), opened(1), commit(1, 2, 2)]), LogDiverged);
    assert.throws(() => fold([opened(1)]), LogDiverged, "a log starts with a claim");
  });

  it("leaves the state as it was when it refuses a record", () => {
    const s = fold([claim(1), opened(1), commit(1, 2, 1)]);
    const before = JSON.stringify(s);
    assert.throws(() => applyRecord(s, commit(1, 9, 2)), LogDiverged);
    assert.equal(JSON.stringify(s), before);
  });
});

// ---- the model ----

type Answer = "appended" | "duplicate" | "stale" | "gap" | "epoch-unknown" | "lost";

/** A server that checks producers as PROTOCOL.md 5.2.1 says; `orphan` keeps the record but not the state, `lostAnswer` keeps both but drops the answer. */
class ModelServer {
  readonly log: LogRecord[] = [];
  private state: { e: number; s: number } | null = null;

  append(r: LogRecord, fault: "none" | "orphan" | "lostAnswer"): Answer {
    const st = this.state;
    let ok = false;
    if (st === null) {
      if (r.s !== 0) return "gap";
      ok = true;
    } else if (r.e < st.e) return "stale";
    else if (r.e > st.e) {
      if (r.s !== 0) return "epoch-unknown";
      ok = true;
    } else if (r.s <= st.s) return "duplicate";
    else if (r.s === st.s + 1) ok = true;
    else return "gap";
    assert.ok(ok);
    this.log.push(r);
    if (fault === "orphan") return "lost";
    this.state = { e: r.e, s: r.s };
    return fault === "lostAnswer" ? "lost" : "appended";
  }
}

interface Writer {
  readonly id: number;
  phase: "claiming" | "opening" | "owner" | "done";
  epoch: number;
  nonce: string;
  nextSeq: number;
  /** The writer's head: the fold's head when it read, plus its own commits. */
  head: number;
  /** A record whose answer was lost: resent unchanged before anything else. */
  pending: LogRecord | null;
  /** Log length when `pending` was first sent. */
  pendingSince: number;
  /** An opened mark was acknowledged for this epoch at this log length. */
  openedAt: number | null;
}

interface Receipt {
  readonly writer: number;
  readonly record: Extract<LogRecord, { t: "commit" }>;
  /** Log length when the writer first sent it. */
  readonly sentAt: number;
}

type Step = { w: number; fault: "none" | "orphan" | "lostAnswer" };

function runModel(steps: readonly Step[], writers: number): { server: ModelServer; receipts: Receipt[]; opens: { epoch: number; at: number }[] } {
  const server = new ModelServer();
  const ws: Writer[] = Array.from({ length: writers }, (_, id) => ({ id, phase: "claiming", epoch: 0, nonce: "", nextSeq: 2, head: 0, pending: null, pendingSince: 0, openedAt: null }));
  const receipts: Receipt[] = [];
  const opens: { epoch: number; at: number }[] = [];
  let nonces = 0;
  for (const { w, fault } of steps) {
    const writer = ws[w % writers]!;
    if (writer.phase === "done") {
      // A process that stopped may be started again: a new open.
      Object.assign(writer, { phase: "claiming", pending: null, openedAt: null });
    }
    const view = fold(server.log);
    let record: LogRecord;
    if (writer.pending !== null) record = writer.pending;
    else if (writer.phase === "claiming") {
      writer.epoch = view.maxEpoch + 1;
      writer.nonce = `w${writer.id}-${nonces++}`;
      record = claim(writer.epoch, writer.nonce);
    } else if (writer.phase === "opening") record = opened(writer.epoch);
    else record = commitRecord(writer.epoch, writer.nextSeq, writer.head + 1, 1 + (writer.nextSeq % 3), JSON.stringify({ w: writer.id, e: writer.epoch, s: writer.nextSeq }));
    const firstSent = writer.pending !== null ? writer.pendingSince : server.log.length;
    const answer = server.append(record, fault);
    if (answer === "lost") {
      writer.pending = record;
      writer.pendingSince = firstSent;
      continue;
    }
    const resent = writer.pending !== null;
    writer.pending = null;
    const after = fold(server.log);
    if (record.t === "claim") {
      if (answer !== "appended" && answer !== "duplicate") {
        writer.phase = "claiming";
        continue;
      }
      const mine = claimFrame(after, record.e);
      writer.phase = mine?.n === record.n && topEpoch(after) === record.e ? "opening" : "claiming";
      writer.head = after.head;
    } else if (record.t === "opened") {
      if (answer === "appended" || answer === "duplicate") {
        writer.phase = "owner";
        writer.nextSeq = 2;
        writer.head = after.head;
        writer.openedAt = server.log.length;
        opens.push({ epoch: record.e, at: server.log.length });
      } else writer.phase = answer === "stale" ? "done" : "claiming";
    } else {
      // A commit: appended, or resolved by reading back (the adapter's readBack: counted at its first seq with its digest).
      const counted = (): boolean => countedCommits(server.log).some((c) => c.f === record.f && c.h === record.h);
      const readsBack = answer === "duplicate" || (resent && (answer === "stale" || answer === "gap" || answer === "epoch-unknown"));
      const landed = answer === "appended" || (readsBack && counted());
      if (answer === "duplicate") assert.ok(landed, "a duplicate answer for a commit means it is counted");
      if (landed) {
        receipts.push({ writer: writer.id, record: record as Receipt["record"], sentAt: firstSent });
        writer.nextSeq += 1;
        writer.head += record.c;
      }
      if (answer === "stale" || answer === "gap" || answer === "epoch-unknown") writer.phase = "done";
    }
  }
  return { server, receipts, opens };
}

/** The commits the fold counts, in order. */
function countedCommits(log: readonly LogRecord[]): { f: number; c: number; h: string }[] {
  const state = emptyState();
  const counted: { f: number; c: number; h: string }[] = [];
  for (const r of log) {
    const applied = applyRecord(state, r);
    for (const p of applied.popped) if (p.t === "commit") counted.pop();
    if (r.t === "commit") counted.push({ f: r.f, c: r.c, h: r.h });
  }
  return counted;
}

const seed = process.env["FC_SEED"] !== undefined ? Number(process.env["FC_SEED"]) : Date.now() % 2_147_483_647;

describe("durable-streams log fold: model of a server that forgets its last producer-state update", () => {
  it(`never refuses such a log, counts every receipted commit at its seqs, keeps the last opener's fence, and decides the same from any cut (seed ${seed})`, () => {
    let orphans = 0;
    let voided = 0;
    let receiptsTotal = 0;
    const step = fc.record({ w: fc.nat(3), fault: fc.constantFrom<Step["fault"]>("none", "none", "none", "none", "none", "orphan", "lostAnswer") });
    fc.assert(
      fc.property(fc.array(step, { minLength: 5, maxLength: 120 }), fc.integer({ min: 1, max: 4 }), (steps, writers) => {
        const { server, receipts, opens } = runModel(steps, writers);
        orphans += steps.filter((s) => s.fault === "orphan").length;
        receiptsTotal += receipts.length;
        // 1. The fold accepts the log, and counts every receipted commit at the seqs its receipt named.
        const counted = countedCommits(server.log);
        for (const r of receipts) assert.ok(counted.some((c) => c.f === r.record.f && c.h === r.record.h), `receipted commit at seq ${r.record.f} (epoch ${r.record.e}) is counted`);
        const seqs = counted.flatMap((c) => Array.from({ length: c.c }, (_, i) => c.f + i));
        assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1), "seqs are gap-free");
        // 2. No commit of an older epoch first sent after a newer owner's open completed is receipted (the fence).
        for (const r of receipts) for (const o of opens) assert.ok(!(o.epoch > r.record.e && o.at <= r.sentAt), `a commit of epoch ${r.record.e} first sent after epoch ${o.epoch} completed its open was receipted`);
        // 3. A fold started at any offset, from the state there, ends where the full fold ends.
        const full = fold(server.log);
        let state = emptyState();
        for (let i = 0; i <= server.log.length; i++) {
          assert.deepEqual(fold(server.log.slice(i), state), full, `a fold started at record ${i} ends the same`);
          if (i < server.log.length) {
            const applied = applyRecord(state, server.log[i]!);
            voided += applied.popped.length;
            state = cloneState(state);
          }
        }
      }),
      { seed, numRuns: Number(process.env["CAIRN_FOLD_RUNS"] ?? "400") },
    );
    assert.ok(orphans > 100 && voided > 20 && receiptsTotal > 400, `the model exercised too little (orphans ${orphans}, voided ${voided}, receipts ${receiptsTotal}, seed ${seed})`);
  });
});
