/**
 * The reference server answers reads from its stream file, which holds an append's frame before the
 * server has fsynced it and counted it in its metadata (the tail it answers once nothing is left to
 * return). A read during that window returns the record, and the next read from there answers
 * nothing with a tail *before* what it just returned:
 *  - with a slow disk (the real server in this process, its fsync held back), a reader sees the
 *    in-flight record, waits for the tail to catch up and goes on; nothing is reported as damaged;
 *  - a tail that stays behind what the server returned (it lost those bytes: here, the end of the
 *    stream file cut off while it was down) is refused by every reader that read them, never read
 *    past, and an owner that the server then answers with an offset before them is poisoned.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync, statSync, truncateSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { DurableStreamTestServer } from "@durable-streams/server";
import { hasCode } from "../../src/errors.js";
import { inbox, sessionCreated } from "../../src/storage/conformance/fixtures.js";
import { STREAM_PREFIX } from "../../storage-adapters/durable-streams/devserver.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { devServer } from "./helpers.js";

/** The reference server's file store, as far as holding back its fsync goes. */
interface FsyncPool {
  fsyncFile(path: string): Promise<void>;
}

/** A file-backed reference server in this process whose next fsync can be held until released. */
async function slowDiskServer(): Promise<{ url: string; hold(): { written: Promise<void>; release(): void } }> {
  const root = mkdtempSync(join(tmpdir(), "cairn-ds-slowdisk-"));
  const server = new DurableStreamTestServer({ dataDir: join(root, "data"), port: 0, host: "127.0.0.1" });
  const origin = await server.start();
  after(async () => {
    await server.stop();
    rmSync(root, { recursive: true, force: true });
  });
  const pool = (server.store as unknown as { fileHandlePool: FsyncPool }).fileHandlePool;
  const fsync = pool.fsyncFile.bind(pool);
  let held: { reached: () => void; gate: Promise<void> } | null = null;
  // The server writes an append's frame to the stream file, then fsyncs it, then counts it in its
  // metadata: holding the fsync holds the append exactly where a slow disk does.
  pool.fsyncFile = async (path: string) => {
    const h = held;
    held = null;
    if (h !== null) {
      h.reached();
      await h.gate;
    }
    return fsync(path);
  };
  return {
    url: `${origin}${STREAM_PREFIX}`,
    hold() {
      let reached!: () => void;
      let release!: () => void;
      const written = new Promise<void>((r) => (reached = r));
      const gate = new Promise<void>((r) => (release = r));
      held = { reached, gate };
      return { written, release };
    },
  };
}

async function rawRead(url: string, offset: string): Promise<{ messages: unknown[]; next: string }> {
  const res = await fetch(`${url}?offset=${offset}`);
  assert.equal(res.status, 200);
  return { messages: (await res.json()) as unknown[], next: res.headers.get("stream-next-offset") ?? "" };
}

describe("durable-streams: a read that ran ahead of the server's tail", { timeout: 120_000 }, () => {
  it("a reader that read an append still in flight waits for the tail to catch up, and goes on", async () => {
    const server = await slowDiskServer();
    const storage = createDurableStreamsStorage({ url: server.url });
    try {
      const db = await storage.open("ahead");
      await db.commit([sessionCreated("s1")]);
      const reader = await storage.reader("ahead");
      assert.equal(await reader.head(), 1);
      // The reader is behind the tail (the server returns frames past its tail only to a read from before it).
      await db.commit([inbox("s1", "one")]);

      const disk = server.hold();
      const committing = db.commit([inbox("s1", "in-flight")]);
      await disk.written;
      // The server's own answers while the append is in flight: the record is returned, and the
      // tail after it is the one before it.
      const all = await rawRead(`${server.url}/ahead/log`, "-1");
      const last = all.messages.at(-1) as { t?: string; ev?: string };
      assert.equal(last.t, "commit");
      assert.match(last.ev ?? "", /in-flight/, "a read returns the append before it is acknowledged");
      const tail = await rawRead(`${server.url}/ahead/log`, all.next);
      assert.deepEqual(tail.messages, []);
      assert.ok(tail.next < all.next, `the tail answered after it (${tail.next}) lies before the offset read from (${all.next})`);

      const head = reader.head();
      const events = reader.read(1);
      await new Promise((r) => setTimeout(r, 200));
      disk.release();
      assert.deepEqual(await committing, { firstSeq: 3, lastSeq: 3 });
      assert.equal(await head, 3, "the reader counted the record and did not take the tail for damage");
      assert.deepEqual((await events).map((e) => e.identity), [inbox("s1", "one").identity, inbox("s1", "in-flight").identity]);
      // And it goes on from there.
      await db.commit([inbox("s1", "next")]);
      assert.equal(await reader.head(), 4);
      await reader.close();
    } finally {
      await storage.close();
    }
  });

  it("a tail that stays behind what the server returned (bytes it lost) is refused, never read past", async () => {
    const server = await devServer("rewound");
    const storage = createDurableStreamsStorage({ url: server.url, requestTimeoutMs: 3000 });
    const fresh = createDurableStreamsStorage({ url: server.url, requestTimeoutMs: 3000 });
    try {
      const db = await storage.open("rewound");
      await db.commit([sessionCreated("s1")]);
      await db.commit([inbox("s1", "one")]);
      const reader = await storage.reader("rewound");
      assert.equal(await reader.head(), 2);
      const { size, file } = logSegment(server.dir, "rewound/log");
      const cut = (await rawRead(`${server.url}/rewound/log`, "-1")).messages.length;
      await db.commit([inbox("s1", "lost", { pad: "x".repeat(2000) })]);
      assert.equal(await reader.head(), 3);
      // The server loses the last append it acknowledged and returned (what a disk that lied about
      // its fsync leaves after a power loss): its stream file ends where it ended before it.
      await server.kill();
      truncateSync(file, size);
      await server.restart();
      assert.equal((await rawRead(`${server.url}/rewound/log`, "-1")).messages.length, cut, "the server came back without the record");
      // A reader that never saw the record cannot know it was there: the log it reads is the server's.
      const other = await fresh.reader("rewound");
      assert.equal(await other.head(), 2);
      await other.close();
      await assert.rejects(
        reader.head(),
        (err: unknown) => hasCode(err, "uncertain") && /lost or rewound data it had returned/.test((err as Error).message),
        "a reader that read the lost record refuses the stream",
      );
      await assert.rejects(reader.read(0), (err: unknown) => hasCode(err, "uncertain"), "and keeps refusing it");
      // The owner, whose log ran up to that record: the server accepts its next commit (it still knows
      // the producer's seq) at an offset before the end of what it had returned. Refused, loudly.
      await assert.rejects(
        db.commit([inbox("s1", "after")]),
        (err: unknown) => hasCode(err, "uncertain") && /lost or rewound data it had returned/.test((err as Error).message),
        "the owner does not go on on a rewound stream",
      );
      assert.equal(db.stats().poisoned, true);
      // The server appended that commit after the gap the lost one left: now every reader refuses the log.
      const late = await fresh.reader("rewound");
      await assert.rejects(late.head(), (err: unknown) => hasCode(err, "uncertain") && /producer seq 5\) right after commit \(epoch 1, producer seq 3\)/.test((err as Error).message));
      await late.close();
    } finally {
      await storage.close();
      await fresh.close();
    }
  });
});

/** The reference server's segment file of stream `path` under STREAM_PREFIX, and its size now. */
function logSegment(dir: string, path: string): { file: string; size: number } {
  const encoded = Buffer.from(`${STREAM_PREFIX}/${path}`, "utf8").toString("base64").replace(/\+/g, "-").replace(/\//g, "_").replace(/=/g, "");
  const streams = join(dir, "streams");
  const files = readdirSync(streams).filter((f) => f.startsWith(`${encoded}~`) && f.endsWith(".log"));
  assert.equal(files.length, 1);
  const file = join(streams, files[0]!);
  return { file, size: statSync(file).size };
}
