/**
 * The sqlite owner-lease file and a process frozen (SIGSTOP) while it holds the file's write lock
 * (a fresh-clone CI run once saw a standby unable to read the lease for 90 s behind such an owner).
 * A real child process takes the lock with BEGIN EXCLUSIVE and is frozen until every thread of it is
 * stopped. Then: the lease stays readable (WAL); a standby does not ask for the lock while the holder's
 * lease is live; a write refused as busy ends the lock's holder only when it is stopped and its own row
 * has expired (or, with no row, it was seen stopped with the lock for a lease length); a running
 * holder is never ended, and neither is a stopped one whose lease is fresh.
 */
import assert from "node:assert/strict";
import { hostname } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { OwnerInfo } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { frozenLeaseWarnings, nodeKid, type Kid } from "../support/kid.js";
import { tempDir } from "../replicated/helpers.js";

const TTL = 600;
const me = (): OwnerInfo => ({ host: hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" });

const warnings = frozenLeaseWarnings();

/**
 * A child that (when `takeLease`) takes the lease of `name` in `dataDir`, then holds the lease file's
 * write lock with BEGIN EXCLUSIVE on a second connection, and says "locked".
 */
async function lockChild(dataDir: string, name: string, takeLease: boolean): Promise<Kid> {
  const c = nodeKid(`
    const { createSqliteStorage } = await import("./storage-adapters/sqlite/index.ts");
    const { default: Db } = await import("better-sqlite3");
    const s = createSqliteStorage({ dataDir: ${JSON.stringify(dataDir)}, leaseMs: ${TTL} });
    const info = { host: (await import("node:os")).hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" };
    // Either way the file is created as the adapter creates it; without the lease, no row is left.
    if (${takeLease}) await s.leases.acquire(${JSON.stringify(name)}, info);
    else await (await s.leases.enqueue(${JSON.stringify(name)}, info)).withdraw();
    const raw = new Db(${JSON.stringify(join(dataDir, "leases", `${name}.lease`))});
    // Referenced for the child's life: the garbage collector closes a connection nothing references,
    // which would end the transaction and release the lock.
    globalThis.keep = raw;
    raw.exec("BEGIN EXCLUSIVE");
    raw.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)");
    process.stdout.write("locked\\n");
    setInterval(() => undefined, 1000);
  `);
  await c.waitFor("locked");
  return c;
}

/** Whether `p` settles within `ms` (better-sqlite3 is synchronous: a blocked read would never yield). */
async function settlesWithin<T>(p: Promise<T>, ms: number): Promise<T> {
  return await Promise.race([p, sleep(ms).then(() => assert.fail(`not settled within ${ms} ms`))]);
}

describe("sqlite owner-lease file: a process frozen while it holds the file's write lock", { timeout: 120_000 }, () => {
  const t = tempDir("lease-frozen");
  after(() => t.remove());

  it("a holder frozen inside its write lock: the lease stays readable, a standby waits while it is live, then ends it (stopped, row expired) and takes the lease", async () => {
    const dataDir = join(t.dir, "a");
    const holder = await lockChild(dataDir, "w", true);
    await holder.freeze();
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;

    // Readable at once although the frozen child holds an exclusive lock (a rollback journal would refuse).
    const seen = await settlesWithin(leases.read("w"), 2000);
    assert.equal(seen?.owner.pid, holder.pid);
    assert.equal(seen?.live, true, "the holder's lease is still fresh");
    // Live: no write lock asked for, so no busy refusal and nobody is ended.
    assert.equal(await leases.acquire("w", me()), null);
    // A write while the frozen holder's lease is fresh: refused as busy, the holder is left alone.
    await assert.rejects(leases.enqueue("w", me()), /SQLITE_BUSY|locked/i);
    assert.ok(holder.alive(), "a stopped holder with a fresh lease was ended");
    assert.deepEqual(warnings, []);

    await sleep(TTL + 100);
    assert.equal((await leases.read("w"))?.live, false, "the frozen holder's lease expired");
    const held = await leases.acquire("w", me());
    assert.notEqual(held, null, "the standby took the lease after ending the frozen holder");
    const end = await settlesWithin(holder.exited, 10_000);
    assert.equal(end.signal, "SIGKILL");
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(warnings[0]!, new RegExp(`pid ${holder.pid}, which is stopped \\(SIGSTOP, or under a debugger\\) and has not renewed its lease for its length`));
    assert.equal((await leases.read("w"))?.owner.pid, process.pid);
    await held!.release();
  });

  it("a running process that holds the lock is never ended, even when its lease has expired", async () => {
    const dataDir = join(t.dir, "b");
    const holder = await lockChild(dataDir, "w", true);
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    // Its own renewals are refused by its own lock: the row ages past the lease.
    await sleep(TTL + 100);
    assert.equal((await leases.read("w"))?.live, false);
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i);
    await sleep(TTL + 100);
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i, "still refused a lease length later: the running holder is not judged by time");
    assert.ok(holder.alive(), "a running lock holder was ended");
    assert.deepEqual(warnings, []);
  });

  it("a stopped lock holder with no row in the file (not a lease holder or waiter) is ended only after it was seen stopped with the lock for a lease length", async () => {
    const dataDir = join(t.dir, "c");
    const holder = await lockChild(dataDir, "w", false);
    await holder.freeze();
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i, "first seen: not ended yet");
    assert.ok(holder.alive());
    await sleep(TTL + 100);
    const held = await leases.acquire("w", me());
    assert.notEqual(held, null);
    assert.equal((await settlesWithin(holder.exited, 10_000)).signal, "SIGKILL");
    assert.match(warnings.join("\n"), /has held the lock stopped for at least 600 ms/);
    await held!.release();
  });
});
