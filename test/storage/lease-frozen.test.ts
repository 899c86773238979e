/**
 * The sqlite owner-lease file and processes frozen (SIGSTOP) while they hold its locks
 * (storage-adapters/sqlite/lease.ts): without care, a standby cannot even read the lease behind such
 * an owner. A real child process takes the lock with BEGIN EXCLUSIVE and
 * is frozen until every thread of it is stopped. Then: the lease stays readable (WAL); a standby does
 * not ask for the lock while the holder's lease is live; a write refused as busy ends the lock's
 * holder only when it is stopped and its own row has expired (or, with no row, it was seen stopped
 * with the lock for a lease length); a running holder is never ended, and neither is a stopped one
 * whose lease is fresh.
 *
 * Then the harder cases: a process frozen inside a connection's close (the WAL checkpoint), a lease
 * file in the older rollback-journal mode, a process stopped again after it ran, a lock on another
 * file system's file with the same inode number, a waiter frozen inside its renewal, a process that
 * holds only a read lock, two standbys behind one frozen holder, and an epoch update while the lock
 * is held. Real child processes, real signals.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { HeldLease, OwnerInfo } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { writeLockHolders } from "../../storage-adapters/sqlite/procs.js";
import { frozenLeaseWarnings, kid, nodeKid, type Kid } from "../support/kid.js";
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

/**
 * Script prelude for a child: `s` (the adapter's storage on `dataDir`), `info` (its OwnerInfo), `Db`
 * (better-sqlite3). Each child keeps its raw connection in `globalThis.keep`: a connection nothing
 * references is closed by the garbage collector, which ends its transaction and releases its lock
 * (the child would stop being the lock holder the test means it to be).
 */
const prelude = (dataDir: string, ttl = TTL) => `
  const { createSqliteStorage } = await import("./storage-adapters/sqlite/index.ts");
  const { default: Db } = await import("better-sqlite3");
  const s = createSqliteStorage({ dataDir: ${JSON.stringify(dataDir)}, leaseMs: ${ttl} });
  const info = { host: (await import("node:os")).hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" };
  const onLine = (f) => { let buf = ""; process.stdin.setEncoding("utf8").on("data", (d) => { buf += d; let i; while ((i = buf.indexOf("\\n")) >= 0) { const l = buf.slice(0, i); buf = buf.slice(i + 1); f(l); } }); };
  setInterval(() => undefined, 1000);
`;

/** The lines of /proc/locks held (not waited for) by `pid`. */
function locksOf(pid: number): string[] {
  return readFileSync("/proc/locks", "utf8")
    .split("\n")
    .filter((l) => l.trim().split(/\s+/)[4] === String(pid));
}

/** Tries `acquire` the way `takeLease` does (errors are retried) until it holds the lease or `ms` passed. */
async function acquireWithin(leases: ReturnType<typeof createSqliteStorage>["leases"] & object, name: string, ms: number): Promise<{ held: HeldLease | null; errors: string[] }> {
  const errors: string[] = [];
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try {
      const held = await leases.acquire(name, me());
      if (held !== null) return { held, errors };
    } catch (err) {
      errors.push((err as Error).message);
    }
    await sleep(120);
  }
  return { held: null, errors };
}

const summary = (errors: string[]) => `${errors.length} errors, e.g. ${JSON.stringify([...new Set(errors)].slice(0, 3))}`;

describe("sqlite owner-lease file: stopped processes in closes, old files, renewals and reads", { timeout: 200_000 }, () => {
  const t = tempDir("lease-frozen-cases");
  after(() => t.remove());

  it("a process frozen inside a connection's close (the last one checkpoints the WAL under the file's EXCLUSIVE lock) is ended once seen stopped with the lock for a lease length, and the standby takes the lease (otherwise every read and acquire fails, forever)", { timeout: 30_000 }, async () => {
    const dataDir = join(t.dir, "close");
    const file = join(dataDir, "leases", "w.lease");
    // The child creates the file as the adapter does (no row left), writes a WAL of ~8000 pages on a
    // raw connection (only to widen the close's window; the lock taken is the same for any WAL size)
    // and closes it: being the last connection, close() takes the file's EXCLUSIVE lock, checkpoints
    // and deletes the WAL. It is frozen while it holds that lock (as read(), withdraw() and release()
    // do when they close the last connection).
    let frozen: Kid | null = null;
    for (let attempt = 0; attempt < 3 && frozen === null; attempt++) {
      const c = nodeKid(`${prelude(dataDir)}
        await (await s.leases.enqueue("w", info)).withdraw();
        const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
        c.pragma("synchronous = OFF");
        c.pragma("wal_autocheckpoint = 0");
        c.exec("CREATE TABLE IF NOT EXISTS pad (x)");
        const ins = c.prepare("INSERT INTO pad VALUES (randomblob(4000))");
        c.transaction(() => { for (let i = 0; i < 8000; i++) ins.run(); })();
        c.exec("DROP TABLE pad");
        process.stdout.write("closing\\n");
        setTimeout(() => { c.close(); process.stdout.write("closed\\n"); }, 20);
      `);
      await c.waitFor("closing");
      const ino = statSync(file).ino;
      const end = Date.now() + 3000;
      while (Date.now() < end && !c.out().includes("closed")) {
        if (locksOf(c.pid).some((l) => l.includes(" WRITE ") && l.includes(`:${ino} `))) {
          await c.freeze();
          if (locksOf(c.pid).some((l) => l.includes(" WRITE ") && l.includes(`:${ino} `))) frozen = c;
          break;
        }
      }
      if (frozen === null) {
        c.child.kill("SIGCONT");
        c.child.kill("SIGKILL");
        await c.exited;
      }
    }
    assert.ok(frozen !== null, "could not freeze the child inside its close (3 attempts)");
    assert.ok(writeLockHolders(file).includes(frozen.pid), "the frozen child holds a WRITE lock on the lease file");

    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    // Nobody holds the lease (no row): a standby should get it, at the latest once the frozen process
    // was seen stopped with the lock for a lease length (the rule for a lock holder without a row).
    const { held, errors } = await acquireWithin(leases, "w", 4 * TTL + 3000);
    assert.ok(
      held !== null,
      `the standby never got the lease within ${4 * TTL + 3000} ms: ${summary(errors)}; frozen pid ${frozen.pid} still ${frozen.alive() ? "alive" : "gone"}; warnings: ${JSON.stringify(warnings)}`,
    );
    await held.release();
  });

  it("a rollback-journal lease file (as older versions made it), its holder frozen inside a renewal's commit: the standby ends it and takes the lease (otherwise it could neither read nor acquire, forever)", { timeout: 30_000 }, async () => {
    const dataDir = join(t.dir, "rollback");
    mkdirSync(join(dataDir, "leases"), { recursive: true });
    const file = join(dataDir, "leases", "w.lease");
    // A lease file as older versions wrote it: same schema, no journal_mode pragma (rollback
    // journal), synchronous OFF; the renewal's commit holds the EXCLUSIVE lock.
    const old = nodeKid(`${prelude(dataDir)}
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      c.pragma("busy_timeout = 5000");
      c.pragma("synchronous = OFF");
      c.exec("CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), token TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, since TEXT NOT NULL, epoch INTEGER, role TEXT NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)");
      c.exec("CREATE TABLE IF NOT EXISTS waiting (qid INTEGER PRIMARY KEY AUTOINCREMENT, token TEXT NOT NULL UNIQUE, host TEXT NOT NULL, pid INTEGER NOT NULL, renewed_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL)");
      c.prepare("INSERT OR REPLACE INTO lease VALUES (1, 'old', ?, ?, ?, NULL, 'serve', ?, ?)").run(info.host, info.pid, info.since, Date.now(), ${TTL});
      process.stdout.write("mode " + c.pragma("journal_mode", { simple: true }) + "\\n");
      c.exec("BEGIN EXCLUSIVE");
      c.prepare("UPDATE lease SET renewed_ms = ? WHERE id = 1").run(Date.now());
      process.stdout.write("locked\\n");
    `);
    await old.waitFor("locked");
    assert.match(old.out(), /mode delete/);
    await old.freeze();

    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    const { held, errors } = await acquireWithin(leases, "w", 4 * TTL + 3000);
    let readErr = "";
    try {
      await leases.read("w");
    } catch (err) {
      readErr = (err as Error).message;
    }
    assert.ok(
      held !== null,
      `the standby never got the lease from the frozen previous-version holder (lease ${TTL} ms, expired long ago): ${summary(errors)}; read(): ${readErr || "ok"}; holder ${old.alive() ? "still alive" : "gone"}; warnings: ${JSON.stringify(warnings)}`,
    );
    assert.equal((await old.exited).signal, "SIGKILL");
    await held.release();
  });

  it("'seen stopped with the lock for a lease length' starts again when the process ran in between: stopped again much later, it is not ended at once", { timeout: 20_000 }, async () => {
    const dataDir = join(t.dir, "seen");
    const file = join(dataDir, "leases", "w.lease");
    // A process without a row (a first acquirer or enqueuer inside its transaction, a released holder,
    // a reader closing the last connection) that takes and releases the lock on command.
    const c = nodeKid(`${prelude(dataDir)}
      await (await s.leases.enqueue("w", info)).withdraw();
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      onLine((cmd) => {
        if (cmd === "lock") { c.exec("BEGIN EXCLUSIVE"); c.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)"); }
        if (cmd === "unlock") c.exec("COMMIT");
        process.stdout.write("done " + cmd + "\\n");
      });
      process.stdout.write("ready\\n");
    `);
    await c.waitFor("ready");
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;

    c.send("lock");
    await c.waitFor("done lock");
    await c.freeze();
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i, "first sighting: not ended");
    // Thawed: it ends its transaction and runs on, unlocked, for longer than a lease.
    c.child.kill("SIGCONT");
    c.send("unlock");
    await c.waitFor("done unlock");
    await sleep(TTL + 300);
    // Stopped again inside a new transaction: stopped with the lock for a few ms, not a lease length.
    c.send("relock");
    c.send("lock");
    await c.waitFor("done relock\ndone lock");
    await c.freeze();
    const t0 = Date.now();
    let took: HeldLease | null = null;
    try {
      took = await leases.acquire("w", me());
    } catch (err) {
      assert.match((err as Error).message, /SQLITE_BUSY|locked/i);
    }
    await sleep(20); // warnings are emitted on the next tick
    const ended = !c.alive() || took !== null;
    await took?.release();
    assert.ok(!ended, `a process stopped with the lock for ${Date.now() - t0} ms (< ${TTL} ms) was ended: ${JSON.stringify(warnings)}`);
  });

  it("a stopped process holding a WRITE lock on a file of another file system with the same inode number is not taken for the lease file's lock holder (/proc/locks is matched by device and inode, not by inode alone)", { timeout: 20_000 }, async (ctx) => {
    const probe = spawnSync("unshare", ["-m", "true"]);
    if (process.getuid?.() !== 0 || probe.status !== 0) {
      ctx.skip("needs root and unshare -m (a private tmpfs whose inode numbers can be chosen)");
      return;
    }
    // The lease file on one tmpfs (/dev/shm), so that its inode number is small; an innocent process
    // locks a file with the same inode number on a fresh tmpfs of its own (a private mount namespace).
    const shm = mkdtempSync("/dev/shm/cairn-lease-frozen-");
    after(() => rmSync(shm, { recursive: true, force: true }));
    const dataDir = join(shm, "data");
    const file = join(dataDir, "leases", "w.lease");
    // A running process holding the lease file's lock (never ended: it runs), so that writes are busy.
    const running = nodeKid(`${prelude(dataDir)}
      await (await s.leases.enqueue("w", info)).withdraw();
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      c.exec("BEGIN EXCLUSIVE");
      c.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)");
      process.stdout.write("locked\\n");
    `);
    await running.waitFor("locked");
    const target = statSync(file).ino;
    const mnt = mkdtempSync(join(tmpdir(), "cairn-lease-frozen-mnt-"));
    after(() => rmSync(mnt, { recursive: true, force: true }));
    const innocentScript = `
      const { default: Db } = await import("better-sqlite3");
      const { writeFileSync, statSync } = await import("node:fs");
      let path = null;
      for (let i = 0; i < 100000 && path === null; i++) {
        const p = ${JSON.stringify(mnt)} + "/f" + i;
        writeFileSync(p, "");
        const ino = statSync(p).ino;
        if (ino === ${target}) path = p;
        else if (ino > ${target}) { process.stdout.write("missed " + ino + "\\n"); process.exit(1); }
      }
      const c = new Db(path); globalThis.keep = c;
      c.exec("BEGIN EXCLUSIVE");
      c.exec("CREATE TABLE t (x)");
      process.stdout.write("locked " + path + " dev " + statSync(path).dev + "\\n");
      setInterval(() => undefined, 1000);
    `;
    const innocent = kid("unshare", ["-m", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$@"', mnt, process.execPath, "--no-warnings", "--input-type=module", "-e", innocentScript]);
    await innocent.waitFor("locked");
    await innocent.freeze();
    assert.notEqual(statSync(file).dev, Number(/dev (\d+)/.exec(innocent.out())?.[1]), "another device");

    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    const holders = writeLockHolders(file);
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i);
    await sleep(TTL + 100);
    await assert.rejects(leases.acquire("w", me()), /SQLITE_BUSY|locked/i);
    assert.ok(running.alive());
    assert.ok(
      innocent.alive() && !holders.includes(innocent.pid),
      `pid ${innocent.pid} holds no lock on ${file} (its lock is on inode ${target} of another filesystem), yet writeLockHolders returned ${JSON.stringify(holders)} and it was ${innocent.alive() ? "left alone" : "SIGKILLed"}: ${JSON.stringify(warnings)}`,
    );
  });

  it("a waiter frozen inside its renewal is ended once it missed a renewal of its place, so the running holder keeps its lease (otherwise the holder's lease would expire first and a standby take it)", { timeout: 40_000 }, async () => {
    // A longer lease than the other tests': the holder's margin (a lease less two renewal intervals)
    // must outlast a busy timeout, the waiter's missed renewal and its SIGKILL on a loaded machine.
    const TTL = 3000;
    const dataDir = join(t.dir, "waiter");
    const file = join(dataDir, "leases", "w.lease");
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    const held = (await leases.acquire("w", me()))!;
    let lost = "";
    held.onLost((why) => (lost = why));
    after(() => held.release());
    // A standby in the queue (takeLease, as `cairn serve` does) and a waiter that renews its row and
    // then is frozen inside its next write.
    const standby = nodeKid(`${prelude(dataDir, TTL)}
      const { takeLease } = await import("./src/cli/owner.ts");
      process.stdout.write("waiting\\n");
      await takeLease({ storage: s, name: "w", role: "serve", force: false });
      process.stdout.write("took\\n");
    `);
    const waiter = nodeKid(`${prelude(dataDir, TTL)}
      await s.leases.enqueue("w", info);
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      onLine(() => {
        c.prepare("UPDATE waiting SET renewed_ms = ? WHERE pid = ?").run(Date.now(), process.pid);
        c.exec("BEGIN EXCLUSIVE");
        c.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)");
        process.stdout.write("locked\\n");
      });
      process.stdout.write("ready\\n");
    `);
    await standby.waitFor("waiting");
    await waiter.waitFor("ready");
    await sleep(300);
    // The waiter's renewal lands just before the holder's next one (the holder renews every TTL/3).
    const { default: Db } = await import("better-sqlite3");
    const ro = new Db(file, { readonly: true });
    after(() => ro.close());
    const renewed = () => ro.prepare<[], { renewed_ms: number }>("SELECT renewed_ms FROM lease").get()!.renewed_ms;
    const r0 = renewed();
    while (renewed() === r0) await sleep(2);
    await sleep(Math.floor(TTL / 3) - 40);
    waiter.send("go");
    await waiter.waitFor("locked");
    await waiter.freeze();
    const frozenAt = Date.now();
    let notLiveAfter: number | null = null;
    while (Date.now() < frozenAt + 4 * TTL) {
      if (notLiveAfter === null && lost === "" && (await leases.read("w"))?.live === false) notLiveAfter = Date.now() - frozenAt;
      await sleep(20);
    }
    assert.equal(waiter.alive(), false, "the frozen waiter was ended once its row expired");
    assert.ok(
      lost === "" && !standby.out().includes("took"),
      `the running holder lost its lease to the standby because a frozen waiter held the lock: ${lost}`,
    );
    assert.equal(notLiveAfter, null, `the running holder's lease was reported not live ${notLiveAfter} ms after the waiter froze, while the frozen waiter's own (younger) row still protected it from unstick`);
  });

  it("a stopped process that holds only a READ lock (frozen inside a read transaction), its waiting row expired, is not ended and blocks nobody", { timeout: 20_000 }, async () => {
    const dataDir = join(t.dir, "reader");
    const file = join(dataDir, "leases", "w.lease");
    const reader = nodeKid(`${prelude(dataDir)}
      await s.leases.enqueue("w", info);
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      c.exec("BEGIN");
      c.prepare("SELECT count(*) FROM lease").get();
      process.stdout.write("reading\\n");
    `);
    await reader.waitFor("reading");
    await reader.freeze();
    assert.ok(locksOf(reader.pid).length > 0, "it holds locks");
    assert.ok(!writeLockHolders(file).includes(reader.pid), "none of them a WRITE lock");
    await sleep(TTL + 100);
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    warnings.length = 0;
    const held = await leases.acquire("w", me());
    assert.notEqual(held, null, "its expired ticket dropped out; the write was not blocked");
    assert.ok(reader.alive());
    assert.deepEqual(warnings, []);
    await held!.release();
  });

  it("two standbys (takeLease) behind a holder frozen inside its write: exactly one takes the lease, the holder is SIGKILLed, no standby crashes (no unhandled rejection)", { timeout: 20_000 }, async () => {
    const dataDir = join(t.dir, "race");
    const file = join(dataDir, "leases", "w.lease");
    const holder = nodeKid(`${prelude(dataDir)}
      await s.leases.acquire("w", info);
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      c.exec("BEGIN EXCLUSIVE");
      c.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)");
      process.stdout.write("locked\\n");
    `);
    await holder.waitFor("locked");
    await holder.freeze();
    const standbyScript = `${prelude(dataDir)}
      const { takeLease } = await import("./src/cli/owner.ts");
      process.on("warning", (w) => process.stderr.write("warning " + w.name + "\\n"));
      process.stdout.write("waiting\\n");
      const h = await takeLease({ storage: s, name: "w", role: "serve", force: false });
      process.stdout.write("took " + process.pid + "\\n");
    `;
    const a = nodeKid(standbyScript);
    const b = nodeKid(standbyScript);
    await Promise.all([a.waitFor("waiting"), b.waitFor("waiting")]);
    const end = Date.now() + 10_000;
    while (!a.out().includes("took") && !b.out().includes("took") && Date.now() < end) await sleep(20);
    await sleep(2 * TTL);
    assert.equal((await holder.exited).signal, "SIGKILL");
    const took = [a, b].filter((k) => k.out().includes("took"));
    assert.equal(took.length, 1, `standbys: ${a.out()} | ${b.out()}`);
    assert.ok(a.alive() && b.alive(), `a standby exited: ${a.err().slice(-1000)} ${b.err().slice(-1000)}`);
    const view = await createSqliteStorage({ dataDir, leaseMs: TTL }).leases!.read("w");
    assert.equal(view?.owner.pid, took[0]!.pid);
    assert.equal(view?.live, true);
  });

  it("update(epoch) while a stopped process holds the lock resolves (no throw, the event loop waits one busy timeout) and the epoch is written by a renewal once the lock is free", { timeout: 20_000 }, async () => {
    const dataDir = join(t.dir, "epoch");
    const file = join(dataDir, "leases", "w.lease");
    const leases = createSqliteStorage({ dataDir, leaseMs: TTL }).leases!;
    const held = (await leases.acquire("w", me()))!;
    after(() => held.release());
    const blocker = nodeKid(`${prelude(dataDir)}
      const c = new Db(${JSON.stringify(file)}); globalThis.keep = c;
      c.exec("BEGIN EXCLUSIVE");
      c.exec("CREATE TABLE IF NOT EXISTS held_by_child (x)");
      process.stdout.write("locked\\n");
    `);
    await blocker.waitFor("locked");
    await blocker.freeze();
    const t0 = performance.now();
    await held.update(7);
    assert.ok(performance.now() - t0 < 1000, `update took ${performance.now() - t0} ms`);
    blocker.child.kill("SIGKILL");
    await blocker.exited;
    const end = Date.now() + 3000;
    while ((await leases.read("w"))?.owner.epoch !== 7 && Date.now() < end) await sleep(20);
    assert.equal((await leases.read("w"))?.owner.epoch, 7);
  });
});
