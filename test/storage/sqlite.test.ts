/**
 * Sqlite-adapter specifics beyond the conformance suite: file layout and pragmas, names, the owner
 * row, damaged files, the mailbox bound and mseq monotonicity, and the SQLite error mapping.
 *
 * And its multi-row insert (commit() writes one INSERT per 32 rows, firstSeq = lastInsertRowid -
 * rows + 1 of the first statement): receipts must be contiguous and match what reading back gives; a
 * duplicate identity in any chunk must refuse the whole batch ("duplicate_identity", naming exactly
 * the identities already in the log) and write nothing; fencing between two handles and two
 * processes must hold with large batches.
 */
import assert from "node:assert/strict";
import BetterSqlite3 from "better-sqlite3";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, describe, it } from "node:test";
import { StorageRejected } from "../../src/storage/errors.js";
import { MAILBOX_LIMIT, type Database } from "../../src/storage/contract.js";
import type { NewEvent } from "../../src/state/events.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { mapSqliteError } from "../../storage-adapters/sqlite/errors.js";
import { AT, hasError, inbox, inboxBatch, isFenced, message, sessionCreated } from "../../src/storage/conformance/fixtures.js";

const root = mkdtempSync(join(tmpdir(), "cairn-sqlite-"));
let n = 0;
const freshDir = () => join(root, `d${n++}`);
after(() => rmSync(root, { recursive: true, force: true }));

const opened: Database[] = [];
after(async () => {
  for (const db of opened) await db.close().catch(() => undefined);
});

describe("sqlite storage", () => {
  it("creates dataDir and <name>.db in WAL mode with the owner row; list() names it", async () => {
    const dataDir = join(freshDir(), "nested", "dir");
    const storage = createSqliteStorage({ dataDir });
    assert.deepEqual(await storage.list(), [], "a missing dataDir lists nothing");
    const db = await storage.open("run-1");
    await db.commit([sessionCreated("s1")]);
    assert.ok(existsSync(join(dataDir, "run-1.db")));
    assert.deepEqual(await storage.list(), ["run-1"]);
    const raw = new BetterSqlite3(join(dataDir, "run-1.db"), { readonly: true });
    try {
      assert.equal(raw.pragma("journal_mode", { simple: true }), "wal");
      const owner = raw.prepare("SELECT epoch, host, pid, opened_at FROM owner").get() as { epoch: number; pid: number; opened_at: string };
      assert.equal(owner.epoch, db.epoch);
      assert.equal(owner.pid, process.pid);
      assert.ok(owner.opened_at.length > 0);
      assert.equal(raw.prepare("SELECT value FROM meta WHERE key = 'schema_version'").pluck().get(), "1");
    } finally {
      raw.close();
    }
    assert.equal(db.stats().adapter, "sqlite");
    await storage.close();
    await assert.rejects(db.head(), hasError("reset"), "Storage.close closes its open handles");
  });

  it("refuses invalid names with a ConfigError naming the rule", async () => {
    const storage = createSqliteStorage({ dataDir: freshDir() });
    for (const bad of ["", "../escape", "a/b", ".hidden", "-dash", "x".repeat(129), "tab\t"]) {
      await assert.rejects(storage.open(bad), (err: unknown) => hasError("config")(err) && /A-Za-z0-9/.test((err as Error).message), JSON.stringify(bad));
    }
    await storage.close();
  });

  it("a damaged file is refused at open with a clear error (not a Cairn database: configuration, exit 2)", async () => {
    const dataDir = freshDir();
    const storage = createSqliteStorage({ dataDir });
    await (await storage.open("probe")).close();
    writeFileSync(join(dataDir, "bad.db"), Buffer.alloc(8192, 0x5a));
    await assert.rejects(storage.open("bad"), (err: unknown) => hasError("config")(err) && /bad\.db is not a Cairn database/.test((err as Error).message));
    await storage.close();
  });

  it("a stored event that is not a valid event is reported on read, never returned", async () => {
    const dataDir = freshDir();
    const storage = createSqliteStorage({ dataDir });
    const db = await storage.open("t");
    await db.commit([sessionCreated("s1")]);
    const raw = new BetterSqlite3(join(dataDir, "t.db"));
    raw.prepare("UPDATE events SET body = '{\"goal\": 5}' WHERE seq = 1").run();
    raw.close();
    await assert.rejects(db.read(), (err: unknown) => hasError("uncertain")(err) && /seq 1/.test((err as Error).message));
    await storage.close();
  });

  it("refuses mail at MAILBOX_LIMIT unacknowledged messages; mseq keeps increasing after everything is acked", async () => {
    const dataDir = freshDir();
    const storage = createSqliteStorage({ dataDir });
    const db = await storage.open("box");
    await storage.post("box", message("first"));
    const [first] = await db.drain();
    await db.ack(first!.mseq);
    await storage.post("box", message("second"));
    const [second] = await db.drain();
    assert.ok(second!.mseq > first!.mseq, `mseq ${second!.mseq} > ${first!.mseq} even with an empty mailbox in between`);
    // Fill the rest directly (1000 fsynced posts would only slow the test down), then post through the adapter.
    const raw = new BetterSqlite3(join(dataDir, "box.db"));
    const insert = raw.prepare("INSERT INTO mailbox (id, session, kind, payload, at) VALUES (?, 's1', 'note', '{}', ?)");
    raw.transaction(() => {
      for (let i = 1; i < MAILBOX_LIMIT; i++) insert.run(`fill-${i}`, AT);
    })();
    raw.close();
    await assert.rejects(storage.post("box", message("overflow")), (err: unknown) => {
      hasError("rejected", "backlog_full")(err);
      assert.equal((err as StorageRejected).retryable, true);
      return true;
    });
    assert.equal((await db.drain()).length, MAILBOX_LIMIT);
    await db.ack(second!.mseq);
    await storage.post("box", message("overflow"));
    assert.equal((await db.drain()).at(-1)!.id, "overflow");
    await storage.close();
  });

  it("maps SQLite errors in one function: busy is retryable, I/O and full disk poison, COMMIT is uncertain", () => {
    const sqliteError = (code: string) => Object.assign(new Error(code.toLowerCase()), { code });
    const busy = mapSqliteError(sqliteError("SQLITE_BUSY"), "write", "commit");
    assert.equal(busy.error.code, "unavailable");
    assert.equal(busy.error.retryable, true);
    assert.equal(busy.poison, false);
    for (const code of ["SQLITE_IOERR_FSYNC", "SQLITE_FULL", "SQLITE_CORRUPT"]) {
      const m = mapSqliteError(sqliteError(code), "write", "commit");
      assert.equal(m.error.code, "uncertain", code);
      assert.equal(m.poison, true, code);
    }
    const atCommit = mapSqliteError(sqliteError("SQLITE_BUSY"), "commit", "commit");
    assert.deepEqual([atCommit.error.code, atCommit.poison], ["uncertain", true], "anything failing during COMMIT is uncertain");
    const unique = mapSqliteError(sqliteError("SQLITE_CONSTRAINT_UNIQUE"), "write", "commit");
    assert.equal((unique.error as StorageRejected).reason, "duplicate_identity");
    const cantOpen = mapSqliteError(sqliteError("SQLITE_CANTOPEN"), "open", "open");
    assert.deepEqual([cantOpen.error.code, cantOpen.poison], ["unavailable", false]);
    const own = new StorageRejected("invalid", "x");
    assert.equal(mapSqliteError(own, "write", "commit").error, own, "Cairn errors pass through");
  });
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

describe("sqlite multi-row insert", () => {
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
