/**
 * Snapshots and compaction on a real three-member etcd cluster: after a snapshot the cluster keeps
 * the tail only (its key count stays bounded across many snapshots), and duplicate refusal stays
 * exact on the machine that kept up and on a machine that rebuilds its copy from the snapshot.
 */
import assert from "node:assert/strict";
import { gzipSync } from "node:zlib";
import { after, before, test, type TestContext } from "node:test";
import { Etcd3 } from "etcd3";
import type { NewEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { createReplicatedStorage, localCopyPath } from "../../storage-adapters/replicated/index.js";
import { keysOf } from "../../storage-adapters/replicated/layout.js";
import { hasError } from "../../src/storage/conformance/fixtures.js";
import { damageTable, devCluster, ev, tempDir } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
let client: Etcd3 | null = null;
before(async () => {
  dc = await devCluster();
  client = new Etcd3({ hosts: [...dc.cluster.endpoints] });
});
after(async () => {
  client?.close();
  await dc?.stop();
});

/** Number of keys under `prefix`. */
async function keys(prefix: string): Promise<number> {
  return Number(await client!.getAll().prefix(prefix).count());
}

/**
 * Storages on the cluster, one data dir per machine name under a temporary directory; all closed,
 * and the directory removed, after the test.
 */
function machines(t: TestContext, prefix: string): (machine: string) => Storage {
  const { dir, remove } = tempDir(prefix);
  const storages: Storage[] = [];
  t.after(async () => {
    for (const s of storages) await s.close();
    remove();
  });
  return (machine) => {
    const s = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir: `${dir}/${machine}`, commitTimeoutMs: 5000 });
    storages.push(s);
    return s;
  };
}

function batch(prefix: string, n: number): NewEvent[] {
  return Array.from({ length: n }, (_, i) => ev(`${prefix}-${i}`));
}

test("after a snapshot etcd keeps the tail only, and the key count stays bounded across snapshots", async (t) => {
  const db = await machines(t, "compaction")("a").open("bounded");
  const k = keysOf("bounded");
  const counts: number[] = [];
  let committed = 0;
  for (let cycle = 0; cycle < 5; cycle++) {
    for (let b = 0; b < 20; b++) {
      await db.commit(batch(`c${cycle}-b${b}`, 5));
      committed += 5;
    }
    assert.equal(await keys(k.logPrefix), 20, "before compaction every batch of the cycle is in etcd");
    assert.equal(await keys(k.identPrefix), 0, "commits write no identity keys");
    const head = await db.head();
    await db.writeSnapshot(head, `snapshot ${cycle} at ${head}`);
    assert.equal(await keys(k.logPrefix), 0, "every batch up to the snapshot was deleted");
    assert.equal(await keys(k.snapDataPrefix), 1, "only the latest snapshot's chunk remains");
    assert.equal(await keys(k.idArchPrefix), cycle + 1, "one identity segment per compaction");
    counts.push(await keys(k.prefix));
  }
  assert.equal(committed, 500);
  // The database's fixed keys (epoch, head, mseq, the owner's liveness, snap, one snapshot chunk) plus
  // one identity segment per snapshot: 100 more events per cycle add exactly one key.
  assert.ok(counts[0]! <= 8, `after the first snapshot only a handful of keys remain (${counts[0]})`);
  assert.deepEqual(counts.map((c) => c - counts[0]!), [0, 1, 2, 3, 4], "the number of keys does not grow with the log");
  for (let b = 0; b < 3; b++) await db.commit(batch(`tail-${b}`, 4));
  assert.equal(await keys(k.logPrefix), 3, "the tail's batches are in etcd");
  assert.equal(await keys(k.identPrefix), 0, "the tail's identities have no keys either");
  await db.close();
});

test("a local copy found damaged while the open catches it up, after compaction: rebuilt from the snapshot, duplicate refusal still exact", async (t) => {
  const { dir, remove } = tempDir("compaction-damaged");
  const storages: Storage[] = [];
  t.after(async () => {
    for (const s of storages) await s.close().catch(() => undefined);
    remove();
  });
  const machine = (): Storage => {
    const s = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir: `${dir}/a`, commitTimeoutMs: 5000 });
    storages.push(s);
    return s;
  };
  const a = machine();
  const db = await a.open("damaged");
  for (let b = 0; b < 10; b++) await db.commit(batch(`old-${b}`, 10));
  await db.writeSnapshot(100, "projection at 100");
  await db.commit(batch("tail", 3));
  await db.close();
  await a.close();
  // The events table's root page overwritten (the WAL was checkpointed into the file by the last close).
  const path = localCopyPath(`${dir}/a`, "damaged");
  damageTable(path, "events");
  const again = await machine().open("damaged");
  assert.equal(await again.head(), 103);
  await assert.rejects(again.commit([ev("old-3-7")]), hasError("rejected", "duplicate_identity"), "a compacted identity is refused by the rebuilt copy");
  await assert.rejects(again.commit([ev("tail-2")]), hasError("rejected", "duplicate_identity"));
  assert.deepEqual(await again.commit([ev("brand-new")]), { firstSeq: 104, lastSeq: 104 });
  assert.deepEqual((await again.read(100)).map((e) => e.identity), ["tail-0", "tail-1", "tail-2", "brand-new"]);
  await again.close();
});

test("duplicate refusal stays exact after compaction: on the machine that kept up and on an empty data dir", async (t) => {
  const make = machines(t, "compaction-exact");
  const a = make("a");
  const db = await a.open("exact");
  for (let b = 0; b < 10; b++) await db.commit(batch(`old-${b}`, 10));
  await db.writeSnapshot(100, "projection at 100");
  await db.commit(batch("tail", 3));
  await assert.rejects(db.commit([ev("old-3-7")]), hasError("rejected", "duplicate_identity"), "the machine that kept up refuses a compacted identity");

  // Another machine with an empty data dir: its copy is rebuilt from the snapshot and the tail.
  const b = make("b");
  const fresh = await b.open("exact");
  assert.equal(await fresh.head(), 103);
  assert.deepEqual(await fresh.latestSnapshot(), { seq: 100, data: "projection at 100", verified: true }, "the snapshot, its digest checked");
  await assert.rejects(
    fresh.commit([ev("brand-new-1"), ev("old-0-0")]),
    (err: unknown) => {
      hasError("rejected", "duplicate_identity")(err);
      assert.deepEqual([...(err as { identities: string[] }).identities], ["old-0-0"], "the compacted identity is named");
      return true;
    },
    "an identity from before the snapshot is refused although its batch is gone from etcd",
  );
  await assert.rejects(fresh.commit([ev("tail-1")]), hasError("rejected", "duplicate_identity"), "an identity from the tail is refused");
  assert.deepEqual(await fresh.commit([ev("brand-new-1")]), { firstSeq: 104, lastSeq: 104 }, "a new identity commits; nothing of the refused batches was written");
  assert.deepEqual((await fresh.read(100)).map((e) => e.identity), ["tail-0", "tail-1", "tail-2", "brand-new-1"]);
  await assert.rejects(fresh.read(0), hasError("rejected", "compacted"), "events before the snapshot are not on this machine");
  const reader = await b.reader("exact");
  await assert.rejects(reader.read(0), hasError("rejected", "compacted"));
  assert.equal((await reader.read(100)).length, 4);
  await reader.close();
  await fresh.close();

  // The rebuilt copy verifies and continues at the next open (it starts at its base).
  const b2 = make("b");
  const again = await b2.open("exact");
  await assert.rejects(again.commit([ev("old-9-9")]), hasError("rejected", "duplicate_identity"));
  assert.deepEqual(await again.commit([ev("brand-new-2")]), { firstSeq: 105, lastSeq: 105 });
  await again.close();

  // The machine that kept up still holds the full history, and catches up on the rest.
  const a2 = make("a");
  const full = await a2.open("exact");
  const log = await full.read(0);
  assert.equal(log.length, 105, "the local copy that kept up holds every event");
  assert.equal(log[0]!.identity, "old-0-0");
  await full.close();
});

test("identity keys left by an earlier version (which wrote one per event) are deleted by compaction up to the cut, and never refuse a commit", async (t) => {
  const make = machines(t, "compaction-legacy");
  const db = await make("a").open("legacy");
  const k = keysOf("legacy");
  for (let b = 0; b < 4; b++) await db.commit(batch(`l${b}`, 5));
  // What an earlier version left: one key per event, its value the event's seq.
  const log = await db.read();
  for (const e of log) await client!.put(k.ident(e.identity)).value(String(e.seq));
  // A stray key for an identity that is not in the log: the log decides, not the keys.
  await client!.put(k.ident("never-committed")).value("999999");
  assert.deepEqual(await db.commit([ev("never-committed")]), { firstSeq: 21, lastSeq: 21 }, "an identity key without its event does not refuse a commit");
  await assert.rejects(db.commit([ev("l2-3")]), hasError("rejected", "duplicate_identity"), "an identity in the log is refused");

  await db.writeSnapshot(10, "projection at 10");
  assert.equal(await keys(k.identPrefix), 10 + 1, "the keys of seqs 1..10 were deleted; those of 11..20 and the stray one stay");
  await db.writeSnapshot(21, "projection at 21");
  assert.equal(await keys(k.identPrefix), 1, "after the next snapshot only the stray key (its value past the cut) is left");
  await db.close();

  // An earlier version keyed segments idarch/<from>/<part>: the first one is moved to that form.
  const segments = await client!.getAll().prefix(k.idArchPrefix).buffers();
  assert.equal(Object.keys(segments).length, 2, "one segment per snapshot that moved the cut");
  const [firstKey, firstGz] = Object.entries(segments).sort(([a], [b]) => a.localeCompare(b))[0]!;
  assert.ok(firstKey.endsWith(`/${"1".padStart(16, "0")}/${"10".padStart(16, "0")}/000000`), `${firstKey} names its range 1..10`);
  await client!.delete().key(firstKey);
  await client!.put(`${k.idArchPrefix}${"1".padStart(16, "0")}/000000`).value(firstGz);

  // A machine with an empty data dir refuses every identity of the log, from the segments (either
  // form) and the tail.
  const fresh = await make("b").open("legacy");
  for (const e of log) await assert.rejects(fresh.commit([ev(e.identity)]), hasError("rejected", "duplicate_identity"), `${e.identity} refused`);
  await assert.rejects(fresh.commit([ev("never-committed")]), hasError("rejected", "duplicate_identity"));
  await fresh.close();
});

test("two snapshots written at once from one previous cut: whichever wins, every identity stays in a segment or the tail (a fresh machine refuses them all)", async (t) => {
  const make = machines(t, "compaction-race");
  for (const order of ["larger first", "smaller first"] as const) {
    const name = `race-${order.split(" ")[0]}`;
    const db = await make(`a-${name}`).open(name);
    for (let b = 0; b < 20; b++) await db.commit(batch(`${name}-${b}`, 5));
    const larger = () => db.writeSnapshot(100, "snapshot at 100");
    const smaller = () => db.writeSnapshot(50, "snapshot at 50");
    const results = await Promise.allSettled(order === "larger first" ? [larger(), smaller()] : [smaller(), larger()]);
    assert.ok(
      results.some((r) => r.status === "fulfilled"),
      `${order}: one of them is written (${results.map((r) => (r.status === "rejected" ? String(r.reason) : "ok")).join("; ")})`,
    );
    await db.close();
    const other = await make(`b-${name}`).open(name);
    for (let b = 0; b < 20; b++) {
      for (let i = 0; i < 5; i++) await assert.rejects(other.commit([ev(`${name}-${b}-${i}`)]), hasError("rejected", "duplicate_identity"), `${order}: ${name}-${b}-${i} refused`);
    }
    assert.deepEqual(await other.commit([ev(`${name}-new`)]), { firstSeq: 101, lastSeq: 101 });
    await other.close();
  }
});

test("identity segments of snapshots that lost the race for the pointer are deleted by the next compaction; the chain, later segments and the earlier form stay, and a fresh machine still refuses every identity", async (t) => {
  const make = machines(t, "compaction-orphans");
  const db = await make("a").open("orphans");
  for (let b = 0; b < 20; b++) await db.commit(batch(`o-${b}`, 5));
  await db.writeSnapshot(50, "snapshot at 50");
  await db.writeSnapshot(100, "snapshot at 100");
  for (let b = 20; b < 24; b++) await db.commit(batch(`o-${b}`, 5));
  const k = keysOf("orphans");
  const log = await db.read();
  const ids = (from: number, to: number) => gzipSync(log.slice(from - 1, to).map((e) => e.identity).join("\n"));
  const pad = (n: number) => String(n).padStart(16, "0");
  const segment = (from: number, to: number, part = 0) => `${k.idArchPrefix}${pad(from)}/${pad(to)}/${String(part).padStart(6, "0")}`;
  const chain = [segment(1, 50), segment(51, 100)];
  assert.deepEqual(Object.keys(await client!.getAll().prefix(k.idArchPrefix).buffers()).sort(), chain, "one segment per snapshot");
  // What losers would have left: a snapshot from cut 0 to 70 (two parts), one from cut 50 to 115,
  // and one that read the pointer after the next cut (111..118, kept). And a segment in the earlier form.
  const lost = [segment(1, 70), segment(1, 70, 1), segment(51, 115)];
  await client!.put(segment(1, 70)).value(ids(1, 35));
  await client!.put(segment(1, 70, 1)).value(ids(36, 70));
  await client!.put(segment(51, 115)).value(ids(51, 115));
  await client!.put(segment(111, 118)).value(ids(111, 118));
  const earlier = `${k.idArchPrefix}${pad(1)}/000000`;
  await client!.put(earlier).value(ids(1, 50));

  await db.writeSnapshot(110, "snapshot at 110");
  const left = Object.keys(await client!.getAll().prefix(k.idArchPrefix).buffers()).sort();
  for (const key of lost) assert.ok(!left.includes(key), `${key} (a loser's) was deleted`);
  assert.deepEqual(left, [...chain, segment(101, 110), segment(111, 118), earlier].sort(), "the chain, the segment past the cut and the earlier form stay");
  await db.close();

  const fresh = await make("b").open("orphans");
  for (const e of log) await assert.rejects(fresh.commit([ev(e.identity)]), hasError("rejected", "duplicate_identity"), `${e.identity} refused`);
  assert.deepEqual(await fresh.commit([ev("o-new")]), { firstSeq: 121, lastSeq: 121 });
  await fresh.close();
});

// Last, so that it runs after every other `after` hook of this file.
exitAfterTests("test/replicated/compaction.test.ts");
