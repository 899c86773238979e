/**
 * A new sqlite database appears whole or not at all. SQLite creates a 0-byte file at open and writes
 * the schema only later, and Cairn refuses a file that is not a Cairn database and leaves it
 * untouched; so a creation cut short (a full disk, a process killed there) must never leave an empty
 * `<name>.db` that no later open could use (a worker restarted hundreds of times on a full disk would
 * otherwise be stuck). These cases cut creation short for real and then open again.
 */
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { assertCairnFile } from "../../storage-adapters/sqlite/format.js";
import { SCHEMA_VERSION } from "../../storage-adapters/sqlite/connection.js";
import { REPO } from "../../chaos/support/cli.js";
import { tempDir } from "../replicated/helpers.js";

const isRoot = typeof process.getuid === "function" && process.getuid() === 0;

describe("sqlite: creating a database", { timeout: 240_000 }, () => {
  const t = tempDir("create");
  after(() => t.remove());

  it("leaves no file behind when the disk is full, and creates it whole once there is room", { skip: isRoot ? false : "needs root to mount a small tmpfs" }, async () => {
    const mnt = join(t.dir, "small");
    mkdirSync(mnt);
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt]);
    try {
      const dataDir = join(mnt, "data");
      mkdirSync(dataDir);
      const filler = join(mnt, "filler");
      const fd = openSync(filler, "w");
      try {
        for (;;) writeSync(fd, Buffer.alloc(4096));
      } catch {
        // ENOSPC: the file system is full
      } finally {
        closeSync(fd);
      }
      const storage = createSqliteStorage({ dataDir });
      try {
        await assert.rejects(storage.open("full"), (err: Error) => {
          assert.doesNotMatch(err.message, /not a Cairn database/, "the failure is the full disk, not a wedged file");
          return true;
        });
        assert.equal(existsSync(join(dataDir, "full.db")), false, "a creation that failed left no database file");
        assert.deepEqual(readdirSync(dataDir).filter((f) => !f.startsWith("full.db-")), [], "no temporary file left either");
        rmSync(filler);
        const db = await storage.open("full");
        assert.equal(db.epoch, 1);
        await db.close();
        assertCairnFile(join(dataDir, "full.db"), SCHEMA_VERSION);
      } finally {
        await storage.close();
      }
    } finally {
      execFileSync("umount", ["-l", mnt]);
    }
  });

  it("a process SIGKILLed again and again while it creates databases never leaves one that cannot be opened", async () => {
    const dataDir = join(t.dir, "killed");
    mkdirSync(dataDir);
    const script = `
      import { createSqliteStorage } from "./storage-adapters/sqlite/index.ts";
      const s = createSqliteStorage({ dataDir: process.argv[1] });
      process.stdout.write("ready\\n");
      for (let i = 0; ; i++) { const db = await s.open("d" + process.pid + "x" + i); await db.close(); }
    `;
    let kills = 0;
    for (let round = 0; round < 12; round++) {
      const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, dataDir], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
      let err = "";
      child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
      await new Promise<void>((resolve, reject) => {
        child.stdout.setEncoding("utf8").on("data", (d: string) => d.includes("ready") && resolve());
        child.once("exit", (code) => reject(new Error(`the creator exited ${code} before it was killed: ${err.slice(-2000)}`)));
      });
      await sleep(50 + round * 37);
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
      kills++;
    }
    assert.equal(kills, 12);
    const files = readdirSync(dataDir).filter((f) => f.endsWith(".db"));
    assert.ok(files.length > 12, `the creators made databases before they were killed (${files.length})`);
    const storage = createSqliteStorage({ dataDir });
    try {
      for (const f of files) {
        assertCairnFile(join(dataDir, f), SCHEMA_VERSION);
        const db = await storage.open(f.slice(0, -3), { create: false });
        await db.close();
      }
      assert.equal((await storage.list()).length, files.length, "list shows every database and no temporary file");
    } finally {
      await storage.close();
    }
  });
});
