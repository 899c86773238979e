/**
 * Issue 10: the sqlite adapter refuses, read-only and before anything writes, a file that is not a
 * Cairn database (empty, another program's SQLite file, not SQLite, damaged, a newer format), on every
 * entry point (open, reader, post), and leaves it byte-identical. Its own files carry a format marker.
 */
import assert from "node:assert/strict";
import BetterSqlite3 from "better-sqlite3";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { tempDir } from "../harness/support.js";

const t = tempDir("cairn-hostile-format-");
after(() => t.cleanup());
const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

const foreign: { name: string; make: (path: string) => void }[] = [
  { name: "a 0-byte file", make: (p) => writeFileSync(p, "") },
  {
    name: "another program's SQLite database",
    make: (p) => {
      const c = new BetterSqlite3(p);
      c.exec("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('mine');");
      c.close();
    },
  },
  {
    name: "another program's SQLite database with a meta table",
    make: (p) => {
      const c = new BetterSqlite3(p);
      c.exec("CREATE TABLE meta (key TEXT, value TEXT); INSERT INTO meta VALUES ('schema_version', '7');");
      c.close();
    },
  },
  {
    name: "an empty SQLite database",
    make: (p) => {
      const c = new BetterSqlite3(p);
      c.pragma("user_version = 1");
      c.close();
    },
  },
  { name: "a text file", make: (p) => writeFileSync(p, "hello, this is not a database\n".repeat(100)) },
  { name: "a damaged file with an SQLite header", make: (p) => writeFileSync(p, Buffer.concat([Buffer.from("SQLite format 3\u0000"), Buffer.alloc(4080, 0x5a)])) },
];

describe("sqlite adapter: files that are not Cairn databases", () => {
  for (const [k, c] of foreign.entries()) {
    it(`${c.name}: open, open without create, reader and post refuse it (config), and it stays byte-identical`, async () => {
      const dir = join(t.dir, `f${k}`);
      mkdirSync(dir, { recursive: true });
      const file = join(dir, "X.db");
      c.make(file);
      const before = sha(file);
      const storage = createSqliteStorage({ dataDir: dir });
      try {
        const attempts: [string, () => Promise<unknown>][] = [
          ["open", () => storage.open("X")],
          ["open (no create)", () => storage.open("X", { create: false })],
          ["reader", () => storage.reader("X")],
          ["post", () => storage.post("X", { id: "a", session: "s1", kind: "k", payload: 1, at: new Date().toISOString() })],
        ];
        for (const [what, call] of attempts) {
          await assert.rejects(call(), (e: Error & { code?: string }) => {
            assert.equal(e.code, "config", `${what}: ${e.message}`);
            assert.match(e.message, /is not a Cairn database/);
            assert.equal(e.message.includes("\n"), false, "one sentence");
            return true;
          });
          assert.equal(sha(file), before, `${what} changed the file`);
          assert.equal(existsSync(`${file}-wal`), false, `${what} created a WAL file`);
        }
      } finally {
        await storage.close();
      }
    });
  }

  it("a Cairn database of a later format version is refused with the version named", async () => {
    const dir = join(t.dir, "newer");
    const storage = createSqliteStorage({ dataDir: dir });
    const db = await storage.open("N");
    await db.close();
    const c = new BetterSqlite3(join(dir, "N.db"));
    c.prepare("UPDATE meta SET value = '2' WHERE key = 'schema_version'").run();
    c.close();
    const before = sha(join(dir, "N.db"));
    await assert.rejects(storage.open("N"), /format version 2, and this release reads version 1/);
    assert.equal(sha(join(dir, "N.db")), before);
    await storage.close();
  });

  it("a new database carries the marker; a Cairn file from before the marker still opens and gains it", async () => {
    const dir = join(t.dir, "own");
    const storage = createSqliteStorage({ dataDir: dir });
    const db = await storage.open("O");
    await db.close();
    const read = (key: string) => {
      const c = new BetterSqlite3(join(dir, "O.db"), { readonly: true });
      try {
        return c.prepare("SELECT value FROM meta WHERE key = ?").pluck().get(key);
      } finally {
        c.close();
      }
    };
    assert.equal(read("format"), "cairn");
    assert.equal(read("schema_version"), "1");
    const c = new BetterSqlite3(join(dir, "O.db"));
    c.prepare("DELETE FROM meta WHERE key = 'format'").run();
    c.close();
    const again = await storage.open("O");
    await again.close();
    assert.equal(read("format"), "cairn");
    await storage.close();
  });
});
