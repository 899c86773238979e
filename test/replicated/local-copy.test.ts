/**
 * The local copy's append (multi-row inserts, src/storage/sqlite-rows.ts) without a cluster:
 * many records in one call, records already held skipped, a gap refused with nothing written, and
 * the hash chain intact afterwards.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { GENESIS_HASH, chainHash, type BatchRecord } from "../../storage-adapters/replicated/layout.js";
import { LocalCopy } from "../../storage-adapters/replicated/local-copy.js";
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

exitAfterTests("test/replicated/local-copy.test.ts");
