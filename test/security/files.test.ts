/**
 * The files surface: what Cairn reads back from storage it does not alone control (etcd, which anyone
 * holding the database's etcd role can write) must not make it take unbounded memory or loop forever.
 *
 * - An identity segment (`idarch/...`, gzip) is decompressed with an output limit: a gzip bomb is
 *   refused with a StorageFailure naming the key, before the memory is taken. On a real etcd cluster:
 *   a fresh machine rebuilding its copy from a snapshot whose segment was replaced by a bomb refuses to
 *   open; a copy that already holds such a segment refuses it when it first consults it.
 * - A batch record whose header claims a range running backwards (the reader would step onto the same
 *   record forever) or more events than its text can hold is refused as malformed.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { Etcd3 } from "etcd3";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { LocalCopy } from "../../storage-adapters/replicated/local-copy.js";
import { decodeBatch, GENESIS_HASH, keysOf, MAX_SEGMENT_BYTES, SEGMENT_IDS, segmentIdentities } from "../../storage-adapters/replicated/layout.js";
import { hasCode } from "../../src/errors.js";
import { devCluster, ev, tempDir } from "../replicated/helpers.js";
import { exitAfterTests } from "../support/exit.js";

/**
 * A gzip bomb: `members` gzip members of 8 MiB of zeros each, concatenated (gunzip reads every
 * member): about 8 KiB of input per 8 MiB of output.
 */
function bomb(members: number): Buffer {
  const one = gzipSync(Buffer.alloc(8 << 20));
  return Buffer.concat(Array.from({ length: members }, () => one));
}

/** Members enough to pass the limit by a little: the test never needs gigabytes to show the refusal. */
const OVER = Math.ceil(MAX_SEGMENT_BYTES / (8 << 20)) + 1;

const refused = (key: string, why: RegExp) => (err: unknown) => {
  assert.ok(hasCode(err, "uncertain"), `a StorageFailure, got ${String(err)}`);
  assert.equal((err as Error).name, "StorageFailure");
  assert.ok((err as Error).message.includes(key), (err as Error).message);
  assert.match((err as Error).message, why);
  return true;
};

describe("identity segments: decompressed with a limit", () => {
  it("refuses a gzip bomb, something not gzip, and a part with too many identities; reads a real part", () => {
    const b = bomb(OVER);
    assert.ok(b.length < 200_000, `${b.length} bytes of input`);
    assert.throws(() => segmentIdentities("cairn/db/x/idarch/bomb", b), refused("cairn/db/x/idarch/bomb", /expands past \d+ bytes/));
    assert.throws(() => segmentIdentities("k/not-gzip", Buffer.from("plainly not gzip")), refused("k/not-gzip", /not a gzip stream/));
    const many = gzipSync(Array.from({ length: SEGMENT_IDS + 1 }, (_, i) => `i${i}`).join("\n"));
    assert.throws(() => segmentIdentities("k/many", many), refused("k/many", new RegExp(`holds ${SEGMENT_IDS + 1} identities`)));
    assert.deepEqual(segmentIdentities("k/ok", gzipSync("s1:a\ns1:b")), ["s1:a", "s1:b"]);
    assert.deepEqual(segmentIdentities("k/empty", gzipSync("")), []);
  });

  it("a local copy that holds a bomb refuses it when duplicate refusal first consults it", () => {
    const t = tempDir("sec-copy");
    const copy = new LocalCopy(join(t.dir, "bomb.replica.sqlite"));
    try {
      copy.rebase(10, GENESIS_HASH, [{ key: "cairn/db/bomb/idarch/0000000000000001/0000000000000010/000000", gz: bomb(OVER) }]);
      assert.throws(() => copy.existing(["s1:anything"]), refused("idarch/0000000000000001/0000000000000010/000000", /expands past/));
    } finally {
      copy.close();
      t.remove();
    }
  });
});

describe("batch records: counts bounded by what the record holds", () => {
  const header = (first: number, last: number) => JSON.stringify({ v: 1, first, last, epoch: 1, token: "t", hash: "0".repeat(64) });
  it("refuses a range running backwards and a count its text cannot hold", () => {
    assert.throws(() => decodeBatch("cairn/db/x/log/0000000000000005", `${header(5, 4)}\n[{}]`), /malformed.*last is before first/s);
    assert.throws(() => decodeBatch("cairn/db/x/log/0000000000000001", `${header(1, 1_000_000_000)}\n[{}]`), /malformed: header says 1000000000 events in 4 characters/);
    assert.equal(decodeBatch("cairn/db/x/log/0000000000000001", `${header(1, 2)}\n[{},{}]`).header.last, 2);
  });
});

describe("on a real etcd cluster", () => {
  let dc: Awaited<ReturnType<typeof devCluster>> | null = null;
  let client: Etcd3 | null = null;
  const t = tempDir("sec-files");
  before(async () => {
    dc = await devCluster();
    client = new Etcd3({ hosts: [...dc.cluster.endpoints] });
  });
  after(async () => {
    client?.close();
    await dc?.stop();
    t.remove();
  });

  it("a machine rebuilding its copy from a snapshot whose identity segment was replaced by a gzip bomb refuses to open, naming the key", async () => {
    const a = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir: join(t.dir, "a"), commitTimeoutMs: 5000 });
    try {
      const db = await a.open("bombed");
      for (let i = 0; i < 4; i++) await db.commit([ev(`e${i}-0`), ev(`e${i}-1`)]);
      await db.writeSnapshot(8, "projection at 8");
      await db.commit([ev("tail")]);
      await db.close();
    } finally {
      await a.close();
    }
    const prefix = keysOf("bombed").idArchPrefix;
    const segments = await client!.getAll().prefix(prefix).keys();
    assert.equal(segments.length, 1, "the snapshot wrote one identity segment");
    const key = segments[0]!;
    await client!.put(key).value(bomb(OVER));

    const b = createReplicatedStorage({ endpoints: dc!.cluster.endpoints, dataDir: join(t.dir, "b"), commitTimeoutMs: 5000 });
    try {
      await assert.rejects(b.open("bombed"), refused(key, /expands past \d+ bytes/));
    } finally {
      await b.close();
    }
  });
});

exitAfterTests("test/security/files.test.ts");
