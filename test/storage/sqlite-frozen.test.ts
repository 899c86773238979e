/**
 * Last opener wins on sqlite also over an owner frozen (SIGSTOP) *inside* its write transaction,
 * which keeps SQLite's write lock. A real owner process commits big batches; the test
 * SIGSTOPs it until a probe proves the pause landed inside the lock (BEGIN IMMEDIATE with no busy
 * timeout is refused), then opens the database: the opener finds the owner on this host, stopped,
 * with its heartbeat lease expired, ends it (SIGKILL releases the lock) and claims the next epoch.
 * The frozen transaction never committed: every batch in the log is whole.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import BetterSqlite3 from "better-sqlite3";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { ev, tempDir } from "../replicated/helpers.js";

const DRIVER = fileURLToPath(new URL("./sqlite-frozen-driver.ts", import.meta.url));

/** True when another connection holds the write lock now (BEGIN IMMEDIATE refused at once). */
function lockHeld(path: string): boolean {
  const probe = new BetterSqlite3(path, { fileMustExist: true, timeout: 0 });
  try {
    probe.pragma("busy_timeout = 0");
    probe.exec("BEGIN IMMEDIATE");
    probe.exec("ROLLBACK");
    return false;
  } catch (err) {
    if (String((err as { code?: string }).code).startsWith("SQLITE_BUSY")) return true;
    throw err;
  } finally {
    probe.close();
  }
}

describe("sqlite: an owner frozen inside its write transaction", { timeout: 120_000 }, () => {
  const t = tempDir("frozen");
  after(() => t.remove());

  it("the next opener on this host ends it (stopped, lease expired) and claims; no half batch in the log", async (tc) => {
    const child = spawn(process.execPath, ["--import", "tsx", DRIVER, t.dir, "frozen"], { stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
    after(() => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGCONT");
        child.kill("SIGKILL");
      }
    });
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
    const lines = () => out.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { t: string; epoch?: number; n?: number });
    const guard = Date.now() + 60_000;
    while (lines().filter((l) => l.t === "ok").length < 3) {
      assert.ok(Date.now() < guard && child.exitCode === null, `hang guard: the owner did not commit; stderr:\n${err}`);
      await sleep(50);
    }
    const ownerEpoch = lines().find((l) => l.t === "opened")!.epoch!;
    const path = join(t.dir, "frozen.db");

    // Pause it until the pause is caught inside the write lock.
    let tries = 0;
    for (;;) {
      tries++;
      assert.ok(tries < 500, "hang guard: never caught the owner inside its write transaction");
      child.kill("SIGSTOP");
      await sleep(20);
      if (lockHeld(path)) break;
      child.kill("SIGCONT");
      await sleep(5 + Math.random() * 40);
    }
    const frozenAt = performance.now();
    const storage = createSqliteStorage({ dataDir: t.dir });
    try {
      const db = await storage.open("frozen");
      const openedAt = performance.now();
      assert.ok(db.epoch > ownerEpoch, `the opener claims a newer epoch (${db.epoch} > ${ownerEpoch})`);
      const end = await Promise.race([exited, sleep(30_000).then(() => null)]);
      assert.ok(end !== null, "hang guard: the frozen owner was not ended");
      assert.equal(end.signal, "SIGKILL", "the frozen owner was ended with SIGKILL");
      // Its transaction never committed: only whole batches of 400, and every acknowledged one is there.
      const events = await db.read(0);
      assert.equal(events.length % 400, 0, `whole batches only, got ${events.length} events`);
      const acked = lines().filter((l) => l.t === "ok").length;
      assert.ok(events.length / 400 >= acked, `every acknowledged batch is in the log (${events.length / 400} >= ${acked})`);
      // The new owner commits.
      await db.commit([ev("after")]);
      tc.diagnostic(`caught inside the lock after ${tries} pause(s); the opener claimed ${((openedAt - frozenAt) / 1000).toFixed(2)} s after the freeze (SQLite busy timeout, then the owner ended)`);
      await db.close();
    } finally {
      await storage.close();
    }
  });
});
