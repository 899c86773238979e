/**
 * A local copy file belongs to one database: the owner refuses duplicate identities from its copy
 * alone (layout.ts), so a copy stamped with another database's id (another etcd cluster's) or another
 * name (two names differing only in case share one file on a case-insensitive file system) is
 * refused at open and left untouched: its own owner may be running. Two real three-member clusters.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { closeSync, mkdirSync, openSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import Sqlite from "better-sqlite3";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage, localCopyPath } from "../../storage-adapters/replicated/index.js";
import { LocalCopy } from "../../storage-adapters/replicated/local-copy.js";
import { keysOf } from "../../storage-adapters/replicated/layout.js";
import { Etcd3 } from "etcd3";
import { hasError } from "../../src/storage/conformance/fixtures.js";
import { captureLogger, damageTable, devCluster, ev, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

describe("the local copy's owner", () => {
  let one: Awaited<ReturnType<typeof devCluster>>;
  let two: Awaited<ReturnType<typeof devCluster>>;
  const dirs = tempDir("copy-owner");
  const storages: Storage[] = [];
  const make = (cluster: typeof one, dataDir: string): Storage => {
    const s = createReplicatedStorage({ endpoints: cluster.cluster.endpoints, dataDir, commitTimeoutMs: 5000 });
    storages.push(s);
    return s;
  };
  const meta = (path: string): Record<string, string> => {
    const file = new Sqlite(path, { readonly: true });
    try {
      return Object.fromEntries((file.prepare("SELECT key, value FROM meta").all() as { key: string; value: string }[]).map((r) => [r.key, r.value]));
    } finally {
      file.close();
    }
  };

  before(async () => {
    one = await devCluster();
    two = await devCluster();
  });
  after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    await one?.stop();
    await two?.stop();
    dirs.remove();
  });

  it("a data dir shared by two clusters: the second opener of a name is refused before it claims anything, and the first owner's copy and duplicate refusal are untouched", async () => {
    const dataDir = `${dirs.dir}/shared`;
    const a = await make(one, dataDir).open("shared");
    for (let i = 1; i <= 5; i++) await a.commit([ev(`e${i}`)]);
    const path = localCopyPath(dataDir, "shared");
    const stamped = meta(path);
    assert.equal(stamped.db_name, "shared");
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    try {
      assert.equal(await etcd.get(keysOf("shared").uid).string(), stamped.db_uid, "the copy is stamped with the database's id");
    } finally {
      etcd.close();
    }
    // The same name on the second cluster has an owner of its own, elsewhere.
    const b = await make(two, `${dirs.dir}/own`).open("shared");
    assert.deepEqual(await b.commit([ev("e1")]), { firstSeq: 1, lastSeq: 1 }, "another cluster's database is another log");

    await assert.rejects(make(two, dataDir).open("shared"), (err: unknown) => {
      hasError("config")(err);
      assert.match((err as Error).message, new RegExp(`its local copy ${path.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")} belongs to another database named "shared" \\(id ${stamped.db_uid}; this one is [0-9a-f-]{36}\\), and a running process has it open`));
      assert.match((err as Error).message, /Give each etcd cluster its own dataDir/);
      return true;
    });
    // The first owner carries on: its copy was not discarded, so it still refuses its own identities.
    await assert.rejects(a.commit([ev("e3")]), hasError("rejected", "duplicate_identity"), "e3 is refused by the first owner");
    assert.deepEqual(await a.commit([ev("e6")]), { firstSeq: 6, lastSeq: 6 });
    assert.deepEqual(
      (await a.read()).map((e) => e.identity),
      ["e1", "e2", "e3", "e4", "e5", "e6"],
    );
    await a.close();
    assert.deepEqual(meta(path), stamped, "the stamp is the first cluster's still");

    // The refused opener claimed nothing on the second cluster: its owner is not fenced.
    assert.deepEqual(await b.commit([ev("e2")]), { firstSeq: 2, lastSeq: 2 }, "the second cluster's owner was not fenced by the refused open");
    await b.close();

    // Nobody has the shared copy open now: the second cluster's opener takes it over (it diverged:
    // emptied, stamped again, rebuilt from its own cluster), and then the first cluster's opener is
    // the one refused while that owner runs.
    const c = await make(two, dataDir).open("shared");
    assert.deepEqual(
      (await c.read()).map((e) => e.identity),
      ["e1", "e2"],
      "rebuilt from the second cluster",
    );
    assert.notEqual(meta(path).db_uid, stamped.db_uid);
    await assert.rejects(make(one, dataDir).open("shared"), /and a running process has it open/);
    await c.close();
    // And back: the first cluster's opener takes it over again, and refuses its identities as before.
    const a2 = await make(one, dataDir).open("shared");
    await assert.rejects(a2.commit([ev("e3")]), hasError("rejected", "duplicate_identity"));
    assert.deepEqual(meta(path), stamped);
    await a2.close();
  });

  it("a copy stamped for another name (as two names differing only in case would share one file) is refused while in use and taken over when not; an unstamped copy is stamped; a discarded copy keeps its stamp", async () => {
    const dataDir = `${dirs.dir}/names`;
    const storage = make(one, dataDir);
    const db = await storage.open("Run1");
    await db.commit([ev("r1")]);
    await db.close();
    const path = localCopyPath(dataDir, "Run1");
    const stamped = meta(path);

    // What "run1" would find on a case-insensitive file system: the file stamped for "Run1".
    const file = new Sqlite(path);
    file.prepare("UPDATE meta SET value = 'run1' WHERE key = 'db_name'").run();
    file.close();
    // While "run1"'s owner has it open, "Run1" is refused; once nobody has it open, it is taken over.
    const runOne = new LocalCopy(path);
    runOne.holdInUse();
    await assert.rejects(storage.open("Run1"), (err: unknown) => {
      hasError("config")(err);
      assert.match((err as Error).message, /belongs to database "run1" \(id [0-9a-f-]{36}\), and a running process has it open/);
      return true;
    });
    runOne.close();
    const takenOver = await storage.open("Run1");
    assert.deepEqual((await takenOver.read()).map((e) => e.identity), ["r1"], "rebuilt from the cluster");
    await assert.rejects(takenOver.commit([ev("r1")]), hasError("rejected", "duplicate_identity"));
    await takenOver.close();
    assert.deepEqual(meta(path), stamped);

    // A copy written before copies were stamped: stamped at its next open, and used as it is.
    const legacy = new Sqlite(path);
    legacy.prepare("DELETE FROM meta WHERE key IN ('db_uid', 'db_name')").run();
    legacy.close();
    const again = await storage.open("Run1");
    assert.deepEqual(meta(path), stamped);
    await assert.rejects(again.commit([ev("r1")]), hasError("rejected", "duplicate_identity"));
    await again.close();

    // A diverged copy is discarded and rebuilt, and keeps its stamp.
    const tampered = new Sqlite(path);
    tampered.prepare("UPDATE events SET json = ? WHERE seq = 1").run(JSON.stringify(ev("r1", "s1", "-tampered")));
    tampered.close();
    const rebuilt = await storage.open("Run1");
    assert.deepEqual((await rebuilt.read()).map((e) => e.identity), ["r1"]);
    await rebuilt.close();
    assert.deepEqual(meta(path), stamped);

    // A database created before ids existed gets one at its next open, and its unstamped copy that id.
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    try {
      await etcd.delete().key(keysOf("Run1").uid);
      const old = new Sqlite(path);
      old.prepare("DELETE FROM meta WHERE key IN ('db_uid', 'db_name')").run();
      old.close();
      const reopened = await storage.open("Run1");
      const uid = await etcd.get(keysOf("Run1").uid).string();
      assert.match(uid ?? "", /^[0-9a-f-]{36}$/);
      assert.notEqual(uid, stamped.db_uid);
      assert.deepEqual(meta(path), { ...stamped, db_uid: uid });
      await reopened.close();
    } finally {
      etcd.close();
    }
  });

  it("a database deleted and created again under its name: the old copy, open nowhere, is discarded and the new log starts empty", async () => {
    const dataDir = `${dirs.dir}/again`;
    const storage = make(one, dataDir);
    const db = await storage.open("again");
    await db.commit([ev("old-1"), ev("old-2")]);
    await db.close();
    const before = meta(localCopyPath(dataDir, "again"));
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    try {
      await etcd.delete().prefix(keysOf("again").prefix);
    } finally {
      etcd.close();
    }
    const fresh = await storage.open("again");
    assert.deepEqual(await fresh.read(), [], "the old incarnation's events are not in the new log");
    assert.deepEqual(await fresh.commit([ev("old-1")]), { firstSeq: 1, lastSeq: 1 }, "the new database has its own identities");
    await fresh.close();
    assert.notEqual(meta(localCopyPath(dataDir, "again")).db_uid, before.db_uid);
  });

  it("a database deleted and created again between an open's check of its copy and its claim (same epoch, new id): the claim is refused by its id, the copy checked again and rebuilt, and it ends stamped with the new id", async () => {
    const dataDir = `${dirs.dir}/window`;
    const old = await make(one, dataDir).open("window");
    await old.commit([ev("old-1"), ev("old-2")]);
    await old.close();
    const oldUid = meta(localCopyPath(dataDir, "window")).db_uid;
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    let reached = 0;
    let recreatedUid: string | null = null;
    const leases = async (): Promise<string[]> => (await etcd.leaseClient.leaseLeases()).leases.map((l) => String(l.ID)).sort();
    const before = await leases();
    const storage = createReplicatedStorage({
      endpoints: one.cluster.endpoints,
      dataDir,
      commitTimeoutMs: 5000,
      // A lease the open granted and then did not use would outlive this test unless revoked.
      livenessMs: 120_000,
      faults: async (point) => {
        if (point !== "open:before-claim") return;
        reached++;
        if (reached > 1) return;
        // Inside the window: the old database is deleted, and another process on another data dir
        // creates one under the same name, commits and closes it. It is at epoch 1, as the old one was.
        await etcd.delete().prefix(keysOf("window").prefix);
        const other = await make(one, `${dirs.dir}/window-other`).open("window");
        await other.commit([ev("new-1")]);
        await other.close();
        recreatedUid = await etcd.get(keysOf("window").uid).string();
        assert.equal(await etcd.get(keysOf("window").epoch).string(), "1", "the new database is at the epoch the open read");
      },
    });
    storages.push(storage);
    try {
      const db = await storage.open("window");
      assert.equal(reached, 2, "the copy was checked again before the claim");
      assert.notEqual(recreatedUid, oldUid);
      assert.equal(meta(localCopyPath(dataDir, "window")).db_uid, recreatedUid, "the copy is stamped with the id of the database it serves");
      assert.deepEqual((await db.read()).map((e) => e.identity), ["new-1"], "rebuilt from the new database");
      await assert.rejects(db.commit([ev("new-1")]), hasError("rejected", "duplicate_identity"));
      assert.deepEqual(await db.commit([ev("old-1")]), { firstSeq: 2, lastSeq: 2 }, "the old database's identities are not the new one's");
      await db.close();
      // The lease granted for the refused claim was revoked, like the one of the claim that won (at close).
      // (A lease of an earlier test, left to run out because its revoke went unanswered, may end meanwhile.)
      const added = async (): Promise<string[]> => (await leases()).filter((l) => !before.includes(l));
      const deadline = Date.now() + 10_000;
      while ((await added()).length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(await added(), [], "no lease of this open is left");
    } finally {
      etcd.close();
    }
  });

  it("a database deleted and created again at every check: the open gives up after five re-checks with StorageUnavailable saying to retry, and claims nothing", async () => {
    const dataDir = `${dirs.dir}/flapping`;
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    let reached = 0;
    const storage = createReplicatedStorage({
      endpoints: one.cluster.endpoints,
      dataDir,
      commitTimeoutMs: 5000,
      faults: async (point) => {
        if (point !== "open:before-claim") return;
        reached++;
        await etcd.delete().prefix(keysOf("flapping").prefix);
        const other = await make(one, `${dirs.dir}/flapping-other-${reached}`).open("flapping");
        await other.close();
      },
    });
    storages.push(storage);
    try {
      await make(one, `${dirs.dir}/flapping-first`).open("flapping").then((db) => db.close());
      await assert.rejects(storage.open("flapping"), (err: unknown) => {
        hasError("unavailable")(err);
        assert.match((err as Error).message, /cannot open database "flapping": it was deleted or created again 5 times while this open checked its local copy; retry/);
        return true;
      });
      assert.equal(reached, 6, "the first check and five re-checks");
      assert.equal(await etcd.get(keysOf("flapping").epoch).string(), "1", "the refused open claimed nothing");
    } finally {
      etcd.close();
    }
  });

  it("a SQLite error while the local copy catches up (another process holds the copy's write lock) is StorageUnavailable naming the copy, not an etcd error", async () => {
    const owner = await make(one, `${dirs.dir}/busy-owner`).open("busy");
    await owner.commit([ev("b1"), ev("b2")]);
    await owner.close();
    const dataDir = `${dirs.dir}/busy`;
    const path = localCopyPath(dataDir, "busy");
    let holder: InstanceType<typeof Sqlite> | null = null;
    const storage = createReplicatedStorage({
      endpoints: one.cluster.endpoints,
      dataDir,
      commitTimeoutMs: 5000,
      faults: (point) => {
        if (point !== "open:before-claim" || holder !== null) return;
        // The copy is checked and stamped; now another connection takes its write lock and keeps it.
        holder = new Sqlite(path);
        holder.exec("BEGIN EXCLUSIVE");
      },
    });
    storages.push(storage);
    try {
      await assert.rejects(storage.open("busy"), (err: unknown) => {
        hasError("unavailable")(err);
        assert.match((err as Error).message, /cannot open database "busy": its local copy .* could not be opened or written \(database is locked\)/);
        assert.doesNotMatch((err as Error).message, /etcd/);
        return true;
      });
    } finally {
      (holder as InstanceType<typeof Sqlite> | null)?.close();
    }
    // Once the lock is gone the same open succeeds, and nothing was lost.
    const db = await storage.open("busy");
    assert.deepEqual((await db.read()).map((e) => e.identity), ["b1", "b2"]);
    await db.close();
  });

  it("an id left without its database (a deletion that stopped halfway): the database created over it gets a new id, and its copy that id", async () => {
    const dataDir = `${dirs.dir}/stray-uid`;
    const etcd = new Etcd3({ hosts: one.cluster.endpoints });
    try {
      await etcd.put(keysOf("stray").uid).value("00000000-0000-4000-8000-00000000dead");
      const db = await make(one, dataDir).open("stray");
      const uid = await etcd.get(keysOf("stray").uid).string();
      assert.notEqual(uid, "00000000-0000-4000-8000-00000000dead");
      assert.equal(meta(localCopyPath(dataDir, "stray")).db_uid, uid, "the copy carries the id of the database it serves");
      await db.close();
    } finally {
      etcd.close();
    }
  });

  it("a local copy that cannot be opened (the data dir is a file) is reported as such, not as an etcd error, for an existing database and a new one; the open fences nobody", async () => {
    const owner = await make(one, `${dirs.dir}/unopenable-owner`).open("unopenable");
    await owner.commit([ev("u1")]);
    const file = `${dirs.dir}/not-a-dir`;
    closeSync(openSync(file, "w"));
    for (const name of ["unopenable", "unopenable-new"]) {
      await assert.rejects(make(one, `${file}/data`).open(name), (err: unknown) => {
        hasError("unavailable")(err);
        assert.match((err as Error).message, new RegExp(`cannot open database "${name}": its local copy .* could not be opened or written \\(.*ENOTDIR.*\\)\\. Check that the data directory exists`));
        assert.doesNotMatch((err as Error).message, /etcd/);
        return true;
      });
    }
    assert.deepEqual(await owner.commit([ev("u2")]), { firstSeq: 2, lastSeq: 2 }, "the existing database's owner was not fenced");
    await owner.close();
  });

  it("a database created by another opener after this open found none: this open checks its copy before claiming, so when the copy is refused the creator is not fenced", async () => {
    const dataDir = `${dirs.dir}/created-meanwhile`;
    // The copy file for "meanwhile" in this data dir is held open by its owner on the second cluster.
    const holder = await make(two, dataDir).open("meanwhile");
    await holder.commit([ev("two-1")]);
    let creator: Awaited<ReturnType<Storage["open"]>> | null = null;
    let reached = 0;
    const storage = createReplicatedStorage({
      endpoints: one.cluster.endpoints,
      dataDir,
      commitTimeoutMs: 5000,
      faults: async (point) => {
        if (point !== "open:before-claim" || reached++ > 0) return;
        // The open found no "meanwhile" on the first cluster; another process creates it now, and runs.
        creator = await make(one, `${dirs.dir}/meanwhile-creator`).open("meanwhile");
        await creator.commit([ev("one-1")]);
      },
    });
    storages.push(storage);
    await assert.rejects(storage.open("meanwhile"), /belongs to another database named "meanwhile" .*and a running process has it open/);
    assert.equal(reached, 1, "refused when the copy was checked again, before a second claim could start");
    assert.ok(creator !== null);
    const running: Awaited<ReturnType<Storage["open"]>> = creator;
    assert.deepEqual(await running.commit([ev("one-2")]), { firstSeq: 2, lastSeq: 2 }, "the creator was not fenced by the refused open");
    assert.deepEqual(await holder.commit([ev("two-2")]), { firstSeq: 2, lastSeq: 2 }, "nor was the copy's holder");
    await running.close();
    await holder.close();
  });

  it("a copy held by another process: refused while that process is frozen (SIGSTOP), taken over once it is killed (SIGKILL)", async () => {
    const dataDir = `${dirs.dir}/frozen`;
    const path = localCopyPath(dataDir, "frozen");
    mkdirSync(dataDir, { recursive: true });
    // Another database's owner, on another cluster, in another process.
    const child = spawn(process.execPath, ["--import", "tsx", fileURLToPath(new URL("./hold-copy-child.ts", import.meta.url)), path, "00000000-0000-4000-8000-000000000000", "frozen"], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.on("data", (d: Buffer) => d.toString().includes("held") && resolve());
        child.once("exit", (code) => reject(new Error(`the holder exited (${code}) before it held the copy`)));
      });
      child.kill("SIGSTOP");
      const storage = make(one, dataDir);
      await assert.rejects(storage.open("frozen"), /and a running process has it open/, "a frozen holder still holds the copy");
      assert.equal(meta(path).db_uid, "00000000-0000-4000-8000-000000000000", "the frozen holder's copy was left alone");
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
      const db = await storage.open("frozen");
      assert.deepEqual(await db.commit([ev("f1")]), { firstSeq: 1, lastSeq: 1 });
      await db.close();
      assert.notEqual(meta(path).db_uid, "00000000-0000-4000-8000-000000000000", "taken over once its holder was gone");
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("a copy whose stamp SQLite finds damaged (SQLITE_CORRUPT) is started afresh and rebuilt from the cluster; duplicate refusal stays exact", async () => {
    const dataDir = `${dirs.dir}/damaged`;
    const path = localCopyPath(dataDir, "damaged");
    const logger = captureLogger();
    const storage = createReplicatedStorage({ endpoints: one.cluster.endpoints, dataDir, commitTimeoutMs: 5000, logger });
    storages.push(storage);
    const db = await storage.open("damaged");
    await db.commit([ev("d1"), ev("d2")]);
    await db.commit([ev("d3")]);
    await db.close();
    // The pages of the meta table and of its key's index overwritten with garbage. The file still
    // opens (its schema on page 1 is intact), so only stamping, the first read of meta, meets the damage.
    damageTable(path, "meta", true);
    const probe = new LocalCopy(path);
    try {
      assert.throws(() => probe.stamp("x", "damaged"), (err: { code?: string }) => /^SQLITE_(CORRUPT|NOTADB)/.test(String(err.code)), "the damage is met by stamping");
    } finally {
      probe.close();
    }

    const again = await storage.open("damaged");
    assert.ok(
      logger.lines.some((l) => l.includes("local copy's stamp unreadable")),
      `the damaged stamp was reported: ${logger.lines.join("\n")}`,
    );
    assert.deepEqual(
      (await again.read()).map((e) => e.identity),
      ["d1", "d2", "d3"].map((id) => ev(id).identity),
      "the copy was rebuilt from the cluster",
    );
    await assert.rejects(again.commit([ev("d2")]), hasError("rejected", "duplicate_identity"), "an identity from before the damage is still refused");
    assert.deepEqual(await again.commit([ev("d4")]), { firstSeq: 4, lastSeq: 4 });
    await again.close();
    assert.equal(meta(path).db_name, "damaged", "the new copy is stamped");
  });

  it("stamping is one write transaction: an opener with another id gets the stamp in force back, not its own", () => {
    const path = `${dirs.dir}/race.replica.sqlite`;
    const a = new LocalCopy(path);
    const b = new LocalCopy(path);
    try {
      assert.deepEqual(a.stamp("uid-a", "race"), { uid: "uid-a", name: "race" });
      assert.deepEqual(b.stamp("uid-b", "race"), { uid: "uid-a", name: "race" }, "the second opener sees the first's stamp, not its own");
    } finally {
      a.close();
      b.close();
    }
  });
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/copy-owner.test.ts");
