/**
 * The local copy's append (multi-row inserts, src/storage/sqlite-rows.ts) without a cluster:
 * many records in one call, records already held skipped, a gap refused with nothing written, and
 * the hash chain intact afterwards. Then the owner's deferred append (appendSoon): its identities
 * refused at once, written by the timer, by any read, by close, and a failure reported.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { GENESIS_HASH, chainHash, type BatchRecord } from "../../storage-adapters/replicated/layout.js";
import { FLUSH_MS, LocalCopy } from "../../storage-adapters/replicated/local-copy.js";
import { setTimeout as sleep } from "node:timers/promises";
import Sqlite from "better-sqlite3";
import { INSERT_ROWS, RowInserter } from "../../src/storage/sqlite-rows.js";
import { exitAfterTests } from "../support/exit.js";

const dir = mkdtempSync(join(tmpdir(), "cairn-local-copy-"));
after(() => rmSync(dir, { recursive: true, force: true }));

/** `sizes.length` chained records starting after seq `from` (hash `prev`), record k holding sizes[k] events. */
function records(sizes: readonly number[], from = 0, prev = GENESIS_HASH): BatchRecord[] {
  const out: BatchRecord[] = [];
  let seq = from;
  for (const [k, n] of sizes.entries()) {
    const events = Array.from({ length: n }, (_, i) => ({ identity: `id-${seq + i + 1}`, kind: "owner_claimed", session: "s", at: "2026-12-05T00:00:00.000Z", body: { k, i } }));
    const eventsJson = JSON.stringify(events);
    const hash = chainHash(prev, seq + 1, eventsJson);
    out.push({ header: { v: 1, first: seq + 1, last: seq + n, epoch: 1, token: `t${k}`, hash }, eventsJson });
    seq += n;
    prev = hash;
  }
  return out;
}

describe("local copy append", () => {
  it("appends many records in one call (more rows than one statement holds) and skips those already held", () => {
    const copy = new LocalCopy(join(dir, "many.replica.sqlite"));
    try {
      // 70 records of 1 to 3 events: 70 batch rows and 140 event rows, several statements each.
      const all = records(Array.from({ length: 70 }, (_, k) => 1 + (k % 3)));
      copy.append(all.slice(0, 10));
      const held = copy.head();
      assert.equal(held, all[9]!.header.last);
      copy.append(all); // the first 10 are held already: skipped, not duplicated
      const total = all.at(-1)!.header.last;
      assert.ok(total > 4 * INSERT_ROWS, `the test needs more than ${4 * INSERT_ROWS} events, has ${total}`);
      assert.equal(copy.head(), total);
      assert.equal(copy.verify(), null);
      assert.equal(copy.tipHash(), all.at(-1)!.header.hash);
      const events = copy.read(0, undefined);
      assert.deepEqual(events.map((e) => e.seq), Array.from({ length: total }, (_, i) => i + 1));
      assert.deepEqual(events.map((e) => e.identity), Array.from({ length: total }, (_, i) => `id-${i + 1}`));
      assert.deepEqual(copy.existing(["id-1", "id-77", `id-${total}`, `id-${total + 1}`]), ["id-1", "id-77", `id-${total}`]);
    } finally {
      copy.close();
    }
  });

  it("refuses a record that does not follow the head and writes nothing of the call", () => {
    const copy = new LocalCopy(join(dir, "gap.replica.sqlite"));
    try {
      const all = records([2, 2, 2, 2]);
      copy.append(all.slice(0, 1));
      assert.throws(() => copy.append([all[1]!, all[3]!]), /cannot append batch 7\.\.8 to a local copy at seq 4/);
      assert.equal(copy.head(), 2, "the record before the gap was not written either");
      assert.equal(copy.verify(), null);
      copy.append(all.slice(1));
      assert.equal(copy.head(), 8);
      assert.equal(copy.verify(), null);
    } finally {
      copy.close();
    }
  });

  it("refuses a record whose events do not match its seqs, writing nothing", () => {
    const copy = new LocalCopy(join(dir, "short.replica.sqlite"));
    try {
      const [r] = records([3]);
      const short: BatchRecord = { header: { ...r!.header, last: 4 }, eventsJson: r!.eventsJson };
      assert.throws(() => copy.append([short]), /batch 1\.\.4 holds 3 events/);
      assert.equal(copy.head(), 0);
    } finally {
      copy.close();
    }
  });
});

/** The owner's split of a record (what the commit pipeline hands over). */
function split(r: BatchRecord): { identities: string[]; jsons: string[] } {
  const events = JSON.parse(r.eventsJson) as { identity: string }[];
  return { identities: events.map((e) => e.identity), jsons: events.map((e) => JSON.stringify(e)) };
}

/** The seqs the file holds, read through a connection of its own (what another process sees). */
function seqsOnDisk(path: string): number[] {
  const db = new Sqlite(path, { readonly: true });
  try {
    return (db.prepare("SELECT seq FROM events ORDER BY seq").pluck().all() as number[]);
  } finally {
    db.close();
  }
}

describe("local copy deferred append (appendSoon)", () => {
  const noError = (err: unknown): void => assert.fail(`unexpected flush error: ${String(err)}`);

  it("refuses pending identities at once, and the timer writes them within FLUSH_MS in one go", async () => {
    const path = join(dir, "soon.replica.sqlite");
    const copy = new LocalCopy(path);
    try {
      const all = records([1, 2, 1]);
      for (const r of all) copy.appendSoon([r], [split(r)], noError);
      assert.deepEqual(copy.existing(["id-1", "id-3", "id-4", "id-5"]), ["id-1", "id-3", "id-4"], "pending identities count as in the log");
      assert.deepEqual(seqsOnDisk(path), [], "nothing written yet");
      const until = Date.now() + 20 * FLUSH_MS;
      while (seqsOnDisk(path).length < 4 && Date.now() < until) await sleep(FLUSH_MS / 5);
      assert.deepEqual(seqsOnDisk(path), [1, 2, 3, 4], "the timer wrote them");
      assert.deepEqual(copy.existing(["id-1", "id-4", "id-5"]), ["id-1", "id-4"], "and they are still refused once written");
      assert.equal(copy.verify(), null);
    } finally {
      copy.close();
    }
  });

  it("every read writes what is pending first; close writes it too", () => {
    const reads: [string, (c: LocalCopy) => unknown][] = [
      ["head", (c) => c.head()],
      ["read", (c) => c.read(0, undefined)],
      ["lastBatch", (c) => c.lastBatch()],
      ["tipHash", (c) => c.tipHash()],
      ["tip", (c) => c.tip()],
      ["batchEndingBy", (c) => c.batchEndingBy(100)],
      ["identitiesIn", (c) => c.identitiesIn(0, 100)],
      ["verify", (c) => c.verify()],
      ["hashBefore", (c) => c.hashBefore(3)],
      ["append", (c) => c.append([])],
      ["close", (c) => c.close()],
    ];
    for (const [name, op] of reads) {
      const path = join(dir, `read-${name}.replica.sqlite`);
      const copy = new LocalCopy(path);
      try {
        const all = records([2, 1]);
        copy.appendSoon(all, all.map(split), noError);
        assert.deepEqual(seqsOnDisk(path), [], `${name}: nothing written before it`);
        op(copy);
        assert.deepEqual(seqsOnDisk(path), [1, 2, 3], `${name} wrote what was pending`);
      } finally {
        copy.close();
      }
    }
  });

  it("writes at once when many events are pending, and a write that fails on the timer is reported", async () => {
    const path = join(dir, "fail.replica.sqlite");
    const copy = new LocalCopy(path);
    try {
      const many = records(Array.from({ length: 2100 }, () => 1));
      for (const r of many) copy.appendSoon([r], [split(r)], noError);
      assert.ok(seqsOnDisk(path).length >= 2048, "2,048 pending events were written without waiting for the timer");
      copy.flush();
      assert.equal(seqsOnDisk(path).length, 2100);
      // A record that does not follow the head (a bug upstream): the timer's write fails, and says so.
      const errors: unknown[] = [];
      const [gap] = records([1], 2200);
      copy.appendSoon([gap!], [split(gap!)], (err) => void errors.push(err));
      const until = Date.now() + 20 * FLUSH_MS;
      while (errors.length === 0 && Date.now() < until) await sleep(FLUSH_MS / 5);
      assert.equal(errors.length, 1, "the failure reached the pending records' owner");
      assert.match(String(errors[0]), /cannot append batch 2201\.\.2201 to a local copy at seq 2100/);
      assert.equal(copy.head(), 2100, "nothing of the failed write is held");
      // A read that writes it fails with the error the owner returns (its handle's failure).
      const [gap2] = records([1], 2300);
      copy.appendSoon([gap2!], [split(gap2!)], (err) => {
        errors.push(err);
        return new Error(`the handle is poisoned: ${String(err)}`);
      });
      assert.throws(() => copy.read(2100, undefined), /the handle is poisoned: .*cannot append batch 2301\.\.2301 to a local copy at seq 2100/);
      assert.equal(errors.length, 2);
    } finally {
      copy.close();
    }
  });
});

describe("multi-row inserter", () => {
  it("inserts any number of rows, checks whole rows, and refuses a statement size out of range", async () => {
    const { default: Database } = await import("better-sqlite3");
    const db = new Database(":memory:");
    try {
      db.exec("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT NOT NULL)");
      const ins = new RowInserter(db, "INSERT INTO t (a, b)", 2);
      for (const n of [0, 1, INSERT_ROWS - 1, INSERT_ROWS, INSERT_ROWS + 1, 3 * INSERT_ROWS + 5]) {
        db.exec("DELETE FROM t");
        ins.insertAll(Array.from({ length: n }, (_, i) => [i + 1, `v${i + 1}`]).flat());
        const rows = db.prepare("SELECT a, b FROM t ORDER BY a").all() as { a: number; b: string }[];
        assert.deepEqual(rows, Array.from({ length: n }, (_, i) => ({ a: i + 1, b: `v${i + 1}` })), `${n} rows`);
      }
      assert.throws(() => ins.insertAll([1, "x", 2]), /3 values do not make whole rows of 2/);
      assert.throws(() => ins.statement(0), /1 to 32 rows, not 0/);
      assert.throws(() => ins.statement(INSERT_ROWS + 1), /1 to 32 rows, not 33/);
      // A duplicate key in the third statement fails the call (inside a transaction, nothing stays).
      db.exec("DELETE FROM t");
      const values = Array.from({ length: 3 * INSERT_ROWS }, (_, i) => [i === 70 ? 5 : i + 1, "v"]).flat();
      assert.throws(() => db.transaction(() => ins.insertAll(values))(), /UNIQUE constraint failed/);
      assert.equal((db.prepare("SELECT COUNT(*) AS n FROM t").get() as { n: number }).n, 0);
    } finally {
      db.close();
    }
  });
});

describe("local copy tip", () => {
  it("reads the head and its hash together, also after another connection to the file rebased it (no stale base)", () => {
    const path = join(dir, "tip.replica.sqlite");
    const a = new LocalCopy(path);
    const b = new LocalCopy(path);
    try {
      const all = records([2, 1]);
      a.append(all);
      assert.deepEqual(a.tip(), { head: 3, hash: all.at(-1)!.header.hash });
      assert.equal(a.tip().head, a.head());
      assert.equal(a.tip().hash, a.tipHash());
      // Another process on this data dir rebuilds the copy from a later snapshot: the file now
      // starts at seq 100. This connection cached the old base (seq 0) when it appended.
      b.discard();
      b.rebase(100, "h100", []);
      // A read before the new base is refused as compacted, not answered with a gap (this
      // connection still had the old base cached).
      assert.throws(() => a.read(0, undefined), (err: Error) => /dropped from the cluster after a snapshot/.test(err.message));
      assert.deepEqual(a.tip(), { head: 100, hash: "h100" }, "the base another connection wrote, not this one's cached base");
      const more = records([2], 100, "h100");
      b.append(more);
      assert.deepEqual(a.tip(), { head: 102, hash: more[0]!.header.hash });
      assert.deepEqual(a.read(100, undefined).map((e) => e.seq), [101, 102]);
    } finally {
      a.close();
      b.close();
    }
  });
});

exitAfterTests("test/replicated/local-copy.test.ts");
