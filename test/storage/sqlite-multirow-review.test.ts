/**
 * Review of the sqlite adapter's multi-row insert (storage-adapters/sqlite/database.ts commit(): one
 * INSERT per 32 rows, firstSeq = lastInsertRowid - rows + 1 of the first statement). Receipts must be
 * contiguous and match what reading back gives; a duplicate identity in any chunk must refuse the
 * whole batch ("duplicate_identity", naming exactly the identities already in the log) and write
 * nothing; fencing between two handles must hold as before.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, describe, it } from "node:test";
import BetterSqlite3 from "better-sqlite3";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { hasError, inbox, inboxBatch, isFenced, sessionCreated } from "../../src/storage/conformance/fixtures.js";
import type { Database } from "../../src/storage/contract.js";
import type { NewEvent } from "../../src/state/events.js";

const root = mkdtempSync(join(tmpdir(), "cairn-multirow-review-"));
let n = 0;
const freshDir = () => join(root, `d${n++}`);
after(() => rmSync(root, { recursive: true, force: true }));

const opened: Database[] = [];
after(async () => {
  for (const db of opened) await db.close().catch(() => undefined);
});

async function open(dataDir: string, name = "run") {
  const storage = createSqliteStorage({ dataDir });
  const db = await storage.open(name);
  opened.push(db);
  return { storage, db };
}

/** Asserts the log holds exactly `events` at seqs 1.. in order (identity, kind, session, at, body). */
async function logIs(db: Database, events: NewEvent[]): Promise<void> {
  const read = await db.read();
  assert.equal(read.length, events.length, "log length");
  for (const [i, e] of read.entries()) {
    assert.equal(e.seq, i + 1, `seq at ${i}`);
    assert.deepEqual({ ...e, seq: undefined }, { ...events[i], seq: undefined }, `event at seq ${i + 1}`);
  }
  assert.equal(await db.head(), events.length);
}

function rejectsDuplicate(identities: string[]) {
  return (err: unknown) => {
    hasError("rejected", "duplicate_identity")(err);
    assert.deepEqual([...(err as { identities: string[] }).identities], identities);
    return true;
  };
}

describe("sqlite multi-row insert (review)", () => {
  it("batches of 1, 31, 32, 33, 64, 65, 200, 5000 events: contiguous receipts equal to what is read back", async () => {
    const { db } = await open(freshDir());
    const all: NewEvent[] = [];
    let i = 0;
    for (const size of [1, 31, 32, 33, 64, 65, 200, 1, 5000, 2, 63]) {
      const batch = inboxBatch("s1", `b${i++}-`, size);
      const receipt = await db.commit(batch);
      assert.deepEqual(receipt, { firstSeq: all.length + 1, lastSeq: all.length + size }, `receipt of a ${size}-event batch`);
      const back = await db.read(receipt.firstSeq - 1);
      assert.deepEqual(back.map((e) => [e.seq, e.identity]), batch.map((e, k) => [receipt.firstSeq + k, e.identity]), `read-back of a ${size}-event batch`);
      all.push(...batch);
    }
    await logIs(db, all);
  });

  it("a duplicate of a logged identity in the last chunk, first chunk, middle chunk, or last row of a 5000-event batch: refused whole, nothing written, exactly that identity named", async () => {
    const { db } = await open(freshDir());
    const logged = inboxBatch("s1", "L", 100);
    await db.commit(logged);
    const big = inboxBatch("s1", "B", 5000);
    for (const at of [0, 31, 32, 2500, 4991, 4999]) {
      const batch = [...big];
      batch[at] = logged[at % 100]!;
      await assert.rejects(db.commit(batch), rejectsDuplicate([logged[at % 100]!.identity]), `duplicate at index ${at}`);
      assert.equal(await db.head(), 100, `duplicate at ${at}: nothing written`);
    }
    // several, spread over chunks: all of them named, in batch order
    const batch = [...big];
    const spots = [5, 40, 1000, 4990, 4999];
    for (const [k, at] of spots.entries()) batch[at] = logged[k * 10]!;
    await assert.rejects(db.commit(batch), rejectsDuplicate(spots.map((_, k) => logged[k * 10]!.identity)));
    assert.equal(await db.head(), 100);
    assert.deepEqual(await db.commit(big), { firstSeq: 101, lastSeq: 5100 });
    await logIs(db, [...logged, ...big]);
  });

  it("identities repeated within one batch (same chunk, different chunks): refused, nothing written", async () => {
    const { db } = await open(freshDir());
    await db.commit([sessionCreated("s1")]);
    const batch = inboxBatch("s1", "r", 100);
    for (const [a, b] of [[0, 1], [0, 99], [31, 32], [40, 90]] as const) {
      const dup = [...batch];
      dup[b] = dup[a]!;
      await assert.rejects(db.commit(dup), rejectsDuplicate([dup[a]!.identity]), `repeat at ${a}/${b}`);
      assert.equal(await db.head(), 1);
    }
    assert.deepEqual(await db.commit(batch), { firstSeq: 2, lastSeq: 101 });
  });

  it("a duplicate identity in the batch AND one already in the log, in a later chunk: refused with the in-batch repeat (checked before any write)", async () => {
    const { db } = await open(freshDir());
    const logged = inboxBatch("s1", "L", 3);
    await db.commit(logged);
    const batch = inboxBatch("s1", "x", 70);
    batch[10] = batch[5]!;
    batch[69] = logged[0]!;
    await assert.rejects(db.commit(batch), (err: unknown) => hasError("rejected", "duplicate_identity")(err));
    assert.equal(await db.head(), 3);
  });

  it("large bodies: 40 events of ~256 KiB each (two statements carrying ~8 MiB of parameters) round-trip", async () => {
    const { db } = await open(freshDir());
    const big = "y".repeat(256 * 1024);
    const batch = Array.from({ length: 40 }, (_, i) => inbox("s1", `big${i}`, { i, big: `${i}${big}` }));
    assert.deepEqual(await db.commit(batch), { firstSeq: 1, lastSeq: 40 });
    await logIs(db, batch);
    // and a single huge event after them
    const huge = inbox("s1", "huge", { text: "z".repeat(8 * 1024 * 1024) });
    assert.deepEqual(await db.commit([huge]), { firstSeq: 41, lastSeq: 41 });
    assert.equal(((await db.read(40))[0]!.body as { observation: { payload: { text: string } } }).observation.payload.text.length, 8 * 1024 * 1024);
  });

  it("interleaved with reopen (statement caches start empty): receipts continue from the log's head", async () => {
    const dataDir = freshDir();
    const all: NewEvent[] = [];
    for (const [round, size] of [33, 1, 64, 32, 65, 31].entries()) {
      const { db } = await open(dataDir);
      const batch = inboxBatch("s1", `o${round}-`, size);
      assert.deepEqual(await db.commit(batch), { firstSeq: all.length + 1, lastSeq: all.length + size });
      all.push(...batch);
      // a refused batch between commits of the same handle does not disturb the next receipt
      await assert.rejects(db.commit([...inboxBatch("s1", `z${round}-`, 40), all[0]!]), rejectsDuplicate([all[0]!.identity]));
      await db.close();
    }
    const { db } = await open(dataDir);
    await logIs(db, all);
  });

  it("two handles on one file: the fenced one's large batch is refused and writes nothing; the new owner's receipts are contiguous", async () => {
    const dataDir = freshDir();
    const a = await open(dataDir);
    await a.db.commit(inboxBatch("s1", "a", 10));
    const b = await open(dataDir);
    await assert.rejects(a.db.commit(inboxBatch("s1", "late", 100)), isFenced);
    assert.deepEqual(await b.db.commit(inboxBatch("s1", "b", 100)), { firstSeq: 11, lastSeq: 110 });
    const read = await b.db.read();
    assert.equal(read.length, 110);
    assert.ok(read.every((e, i) => e.seq === i + 1));
    assert.ok(!read.some((e) => e.identity.includes(":late")), "the fenced handle wrote");
  });

  it("two processes committing large batches in turn (each open fences the other): every receipt matches the file, no partial batch", async () => {
    const dataDir = freshDir();
    const DB = pathToFileURL(new URL("../../storage-adapters/sqlite/index.ts", import.meta.url).pathname).href;
    const FIX = pathToFileURL(new URL("../../src/storage/conformance/fixtures.ts", import.meta.url).pathname).href;
    const script = `
      import { createSqliteStorage } from ${JSON.stringify(DB)};
      import { inboxBatch } from ${JSON.stringify(FIX)};
      const [dataDir, tag] = process.argv.slice(1);
      const out = [];
      for (let r = 0; r < 6; r++) {
        const db = await createSqliteStorage({ dataDir }).open("run");
        try { out.push({ ok: await db.commit(inboxBatch("s1", tag + r + "-", 33 + r * 31)), size: 33 + r * 31, tag: tag + r }); }
        catch (e) { out.push({ err: String(e.code ?? e) }); }
        await db.close();
      }
      console.log(JSON.stringify(out));
    `;
    const run = (tag: string) =>
      new Promise<string>((resolve, reject) => {
        const c = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, dataDir, tag], { stdio: ["ignore", "pipe", "pipe"] });
        let out = "";
        let err = "";
        c.stdout.on("data", (d: Buffer) => (out += String(d)));
        c.stderr.on("data", (d: Buffer) => (err += String(d)));
        const timer = setTimeout(() => c.kill("SIGKILL"), 90_000);
        c.on("exit", (code) => {
          clearTimeout(timer);
          if (code === 0) resolve(out);
          else reject(new Error(`child ${tag} exited ${code}: ${err}`));
        });
      });
    const results = (await Promise.all([run("P"), run("Q")])).flatMap((o) => JSON.parse(o.trim().split("\n").at(-1)!) as { ok?: { firstSeq: number; lastSeq: number }; size?: number; tag?: string; err?: string }[]);
    const raw = new BetterSqlite3(join(dataDir, "run.db"), { readonly: true });
    try {
      const rows = raw.prepare("SELECT seq, identity FROM events ORDER BY seq").all() as { seq: number; identity: string }[];
      rows.forEach((r, i) => assert.equal(r.seq, i + 1, "seqs are contiguous"));
      const oks = results.filter((r) => r.ok !== undefined);
      assert.ok(oks.length >= 2, `only ${oks.length} of 12 commits succeeded: ${JSON.stringify(results)}`);
      let covered = 0;
      for (const r of results) {
        if (r.ok === undefined) continue;
        assert.equal(r.ok.lastSeq - r.ok.firstSeq + 1, r.size);
        const span = rows.slice(r.ok.firstSeq - 1, r.ok.lastSeq);
        assert.deepEqual(span.map((x) => x.identity), Array.from({ length: r.size! }, (_, k) => `inbox:s1:${r.tag}-${k}`), `receipt ${JSON.stringify(r.ok)} of ${r.tag}`);
        covered += r.size!;
      }
      assert.equal(covered, rows.length, "every row belongs to an acknowledged batch (no partial batch from a refused one)");
    } finally {
      raw.close();
    }
  });
});
