/**
 * Sqlite-adapter specifics beyond the conformance suite: file layout and pragmas, names, the owner
 * row, damaged files, the mailbox bound and mseq monotonicity, and the SQLite error mapping.
 */
import assert from "node:assert/strict";
import BetterSqlite3 from "better-sqlite3";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { StorageRejected } from "../../src/storage/errors.js";
import { MAILBOX_LIMIT } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { mapSqliteError } from "../../storage-adapters/sqlite/errors.js";
import { AT, hasError, message, sessionCreated } from "../../src/storage/conformance/fixtures.js";

const root = mkdtempSync(join(tmpdir(), "cairn-sqlite-"));
let n = 0;
const freshDir = () => join(root, `d${n++}`);

describe("sqlite storage", () => {
  after(() => rmSync(root, { recursive: true, force: true }));

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
