/**
 * Adversarial review of the commit path's own HTTP/2 client (txn-wire.ts). First against a
 * misbehaving HTTP/2 peer (truncated, doubled, compressed or reset answers, GOAWAY, HTTP errors,
 * silence, late answers): a broken answer is never taken for a resolved one. Then on a REAL etcd
 * cluster, through the whole adapter where it matters: commits under member faults (SIGSTOP,
 * SIGKILL, SIGTERM with GOAWAY, leader kill during a burst), answers lost after etcd applied the
 * transaction (a TCP proxy that holds etcd's answers, then one that resets every connection), a
 * refused endpoint, large and multi-byte values up to MAX_BATCH_BYTES, lease ids, fencing decided by
 * the wire's read-back, and process lifetime (a pending request keeps the process alive; an idle
 * wire, and a closed storage, leave nothing behind). After every fault: a fresh reader on another
 * dataDir sees every acknowledged commit exactly once, at its receipt's seqs, in call order; nothing
 * refused as "nothing was written" is in the log; nothing is in the log that no commit sent.
 * The bugs it found are fixed (2afafa0: lease ids above 2^53; router.ts: watch reconnect timers after
 * close); the tests that found them stay.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import http2 from "node:http2";
import net from "node:net";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import type { CommitReceipt, Database, Storage } from "../../src/storage/contract.js";
import { event, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { ResetError, StorageFailure, StorageRejected } from "../../src/storage/errors.js";
import { classifyEtcdError } from "../../storage-adapters/replicated/etcd-errors.js";
import { MAX_BATCH_BYTES, MAX_BATCH_EVENTS, createReplicatedStorage, type ReplicatedOptions, type ReplicatedStats } from "../../storage-adapters/replicated/index.js";
import { keysOf } from "../../storage-adapters/replicated/layout.js";
import { absent, get, put, putWithLease } from "../../storage-adapters/replicated/ops.js";
import { TxnWire } from "../../storage-adapters/replicated/txn-wire.js";
import { AT, bounded, devCluster, ev, tempDir, untilQuorum } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// Anything the wire lets escape (an 'error' event without a listener, a rejection nobody awaits).
const uncaught: unknown[] = [];
const unhandled: unknown[] = [];
process.on("uncaughtException", (e) => uncaught.push(e));
process.on("unhandledRejection", (e) => unhandled.push(e));

async function until(what: string, check: () => boolean | Promise<boolean>, ms = 60_000, every = 50): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`never happened within ${ms} ms: ${what}`);
    await sleep(every);
  }
}

/** An event carrying `data` (execution_output has no size limit of its own). */
const out = (id: string, data: string): NewEvent => event("execution_output", "s1", id, AT, { cell_id: 1, n: 0, stream: "stdout", data });

// --- a ledger of commits and its check against a fresh reader ----------------------------------

interface Attempt {
  readonly db: string;
  readonly ids: readonly string[];
  /** The handle's epoch (one handle per open). */
  readonly epoch: number;
  /** Call order on that handle. */
  readonly order: number;
  outcome: "pending" | "acked" | "failed";
  receipt?: CommitReceipt;
  error?: unknown;
}

class Ledger {
  readonly attempts: Attempt[] = [];
  private orders = 0;

  commit(db: Database, ids: readonly string[], events: readonly NewEvent[] = ids.map((id) => ev(id))): Promise<void> {
    const a: Attempt = { db: db.name, ids, epoch: (db as unknown as { epoch: number }).epoch, order: this.orders++, outcome: "pending" };
    this.attempts.push(a);
    return db.commit(events).then(
      (r) => {
        a.outcome = "acked";
        a.receipt = r;
      },
      (err: unknown) => {
        a.outcome = "failed";
        a.error = err;
      },
    );
  }

  acked(db?: string): number {
    return this.attempts.filter((a) => a.outcome === "acked" && (db === undefined || a.db === db)).length;
  }

  summary(): string {
    const failed = this.attempts.filter((a) => a.outcome === "failed");
    const kinds = new Map<string, number>();
    for (const a of failed) {
      const k = `${(a.error as Error)?.name}: ${String((a.error as Error)?.message).slice(0, 140)}`;
      kinds.set(k, (kinds.get(k) ?? 0) + 1);
    }
    return `${this.acked()} acked, ${failed.length} failed ${JSON.stringify([...kinds])}`;
  }
}

/** The whole log of `name` as a brand-new machine reads it (its own dataDir). */
async function freshLog(endpoints: readonly string[], dataDir: string, name: string): Promise<LogEvent[]> {
  const s = createReplicatedStorage({ endpoints, dataDir });
  try {
    const r = await s.reader(name);
    return await r.read();
  } finally {
    await s.close();
  }
}

/**
 * The invariants: seqs are 1..n; no identity twice; every acknowledged commit's events at its
 * receipt's seqs; acknowledged commits of one handle in call order, and of a later handle after an
 * earlier one's; a commit refused with anything but StorageFailure ("may or may not be durable") is
 * not in the log; a StorageFailure commit is in it whole or not at all; every event in the log was
 * sent by some commit. Returns how many StorageFailure commits turned out durable / not.
 */
function checkLog(name: string, log: readonly LogEvent[], ledger: Ledger): { unknownIn: number; unknownOut: number } {
  const where = new Map<string, number>();
  log.forEach((e, i) => {
    assert.equal(e.seq, i + 1, `${name}: seqs are contiguous from 1`);
    assert.ok(!where.has(e.identity), `${name}: identity ${e.identity} is in the log twice (seqs ${where.get(e.identity)} and ${e.seq})`);
    where.set(e.identity, e.seq);
  });
  const mine = ledger.attempts.filter((a) => a.db === name);
  const sent = new Set(mine.flatMap((a) => a.ids));
  for (const e of log) assert.ok(sent.has(e.identity), `${name}: ${e.identity} at seq ${e.seq} was never committed`);
  let unknownIn = 0;
  let unknownOut = 0;
  for (const a of mine) {
    assert.notEqual(a.outcome, "pending", `${name}: a commit of ${a.ids.join(",")} never settled`);
    if (a.outcome === "acked") {
      const r = a.receipt!;
      assert.equal(r.lastSeq - r.firstSeq + 1, a.ids.length, `${name}: the receipt of ${a.ids[0]} spans its events`);
      a.ids.forEach((id, k) => assert.equal(where.get(id), r.firstSeq + k, `${name}: acknowledged ${id} (receipt ${JSON.stringify(r)}) is at seq ${where.get(id)} in the log`));
      continue;
    }
    const present = a.ids.filter((id) => where.has(id));
    if (a.error instanceof StorageFailure) {
      assert.ok(present.length === 0 || present.length === a.ids.length, `${name}: a commit is in the log in part: ${present.join(",")}`);
      if (present.length > 0) unknownIn++;
      else unknownOut++;
    } else {
      assert.deepEqual(present, [], `${name}: a commit refused with ${(a.error as Error)?.name} ("${(a.error as Error)?.message}") is in the log`);
    }
  }
  // Per handle, acknowledged commits in call order; later handles after earlier ones.
  const acked = mine.filter((a) => a.outcome === "acked").sort((x, y) => x.epoch - y.epoch || x.order - y.order);
  for (let i = 1; i < acked.length; i++) {
    assert.ok(acked[i]!.receipt!.firstSeq > acked[i - 1]!.receipt!.lastSeq, `${name}: ${acked[i]!.ids[0]} (epoch ${acked[i]!.epoch}, call ${acked[i]!.order}) is before ${acked[i - 1]!.ids[0]} in the log`);
  }
  return { unknownIn, unknownOut };
}

/**
 * Commits to `name` until `stop()`, `concurrency` commits at a time (1..3 events each, so groups
 * form), reopening the database when a handle is poisoned or fenced, as its owner would.
 */
async function worker(storage: Storage, name: string, ledger: Ledger, stop: () => boolean, concurrency: number, problems: unknown[]): Promise<void> {
  let db: Database | null = null;
  let n = 0;
  while (!stop()) {
    if (db === null) {
      try {
        db = await storage.open(name);
      } catch (err) {
        problems.push(err);
        await sleep(200);
        continue;
      }
    }
    const handle: Database = db;
    const batch = Array.from({ length: concurrency }, () => {
      const size = 1 + (n % 3);
      const ids = Array.from({ length: size }, () => `${name}-${n++}`);
      return ledger.commit(handle, ids);
    });
    await Promise.all(batch);
    const last = ledger.attempts.filter((a) => a.db === name).slice(-concurrency);
    if (last.some((a) => a.error instanceof StorageFailure || a.error instanceof ResetError)) {
      await handle.close().catch(() => undefined);
      db = null;
    }
  }
  await db?.close().catch(() => undefined);
}

// --- a TCP proxy in front of one member, to lose answers etcd has already given ---------------------

/** HTTP/2 frame types that carry a response (held back by `hold`); the others (SETTINGS, PING, GOAWAY, WINDOW_UPDATE) always pass, so flow control keeps working. */
const RESPONSE_FRAMES = new Set([0x0 /* DATA */, 0x1 /* HEADERS */, 0x3 /* RST_STREAM */, 0x9 /* CONTINUATION */]);

interface Pair {
  readonly client: net.Socket;
  readonly upstream: net.Socket;
  /** Bytes from etcd not yet parsed into whole frames. */
  partial: Buffer;
  /** Whole response frames held back, in order. */
  readonly held: Buffer[];
}

/**
 * A TCP proxy in front of one etcd member that parses etcd's HTTP/2 frames toward the client: `hold`
 * keeps back the frames that carry answers while flow control and pings still pass (so a large
 * request is received, and applied, in full); `release` delivers them; `resetAll` resets every
 * connection.
 */
class TcpProxy {
  private readonly server: net.Server;
  private readonly pairs = new Set<Pair>();
  private holding = false;
  port = 0;

  constructor(target: URL) {
    this.server = net.createServer((client) => {
      const upstream = net.connect(Number(target.port), target.hostname);
      const pair: Pair = { client, upstream, partial: Buffer.alloc(0), held: [] };
      this.pairs.add(pair);
      const end = (): void => {
        this.pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      client.on("error", end).on("close", end);
      upstream.on("error", end).on("close", end);
      client.on("data", (b: Buffer) => upstream.write(b));
      upstream.on("data", (b: Buffer) => {
        pair.partial = Buffer.concat([pair.partial, b]);
        while (pair.partial.length >= 9) {
          const len = pair.partial.readUIntBE(0, 3);
          if (pair.partial.length < 9 + len) break;
          const f = pair.partial.subarray(0, 9 + len);
          pair.partial = pair.partial.subarray(9 + len);
          if ((this.holding || pair.held.length > 0) && RESPONSE_FRAMES.has(f[3]!)) pair.held.push(Buffer.from(f));
          else client.write(f);
        }
      });
    });
  }

  async start(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.server.address() as net.AddressInfo).port;
    return `http://127.0.0.1:${this.port}`;
  }

  /** Answers from etcd are kept back (requests still reach etcd in full, and apply). */
  hold(): void {
    this.holding = true;
  }

  /** Delivers the answers kept back, in order, and forwards again. */
  release(): void {
    this.holding = false;
    for (const p of this.pairs) for (const b of p.held.splice(0)) if (!p.client.destroyed) p.client.write(b);
  }

  /** Resets every connection (TCP RST toward the client). */
  resetAll(): number {
    const n = this.pairs.size;
    for (const p of [...this.pairs]) {
      p.client.resetAndDestroy();
      p.upstream.destroy();
    }
    return n;
  }

  async stop(): Promise<void> {
    this.resetAll();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

async function freePort(): Promise<number> {
  return new Promise<number>((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

// --- a misbehaving HTTP/2 peer: the wire must never turn a broken answer into a resolved one ----------

type Mode = (stream: http2.ServerHttp2Stream) => void;

/** A gRPC frame around `msg`, with the length the prefix announces (default: its own). */
const frame = (msg: Buffer, announced = msg.length, flag = 0): Buffer => {
  const b = Buffer.alloc(5 + msg.length);
  b[0] = flag;
  b.writeUInt32BE(announced, 1);
  msg.copy(b, 5);
  return b;
};
/** A TxnResponse {succeeded: true} (field 2, varint 1). */
const SUCCEEDED = Buffer.from([0x10, 0x01]);
const GRPC = { ":status": 200, "content-type": "application/grpc" };

describe("review: txn-wire against a misbehaving HTTP/2 peer", () => {
  let server: http2.Http2Server;
  let url = "";
  let mode: Mode = () => undefined;
  const sessions = new Set<http2.ServerHttp2Session>();
  /** The raw sockets under the server's sessions, by the client's port (a session's socket may not be destroyed directly). */
  const sockets = new Map<number, net.Socket>();
  const rawSocket = (st: http2.ServerHttp2Stream): net.Socket => sockets.get(st.session!.socket.remotePort!)!;
  const w = (): TxnWire => new TxnWire(url, undefined, 4096);
  const req = { compare: [], success: [get("k")], failure: [] };
  /** The wire's answer: resolved (with succeeded) or the class of its error. */
  const outcome = (p: Promise<{ succeeded: boolean }>): Promise<string> =>
    p.then(
      (r) => `answered ${r.succeeded}`,
      (e: unknown) => `${classifyEtcdError(e)}: ${String(e)}`,
    );

  before(async () => {
    server = http2.createServer();
    server.on("connection", (sock: net.Socket) => {
      const port = sock.remotePort!;
      sockets.set(port, sock);
      sock.on("close", () => sockets.delete(port));
    });
    server.on("session", (s) => {
      sessions.add(s);
      s.on("close", () => sessions.delete(s));
      s.on("error", () => undefined);
    });
    server.on("stream", (stream) => {
      stream.on("error", () => undefined);
      // The request is read whole first, as etcd does.
      stream.resume();
      stream.on("end", () => mode(stream));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  });
  after(async () => {
    for (const s of sessions) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });

  it("a well-formed answer is read; the same connection serves the next call", async () => {
    mode = (st) => {
      st.respond(GRPC, { waitForTrailers: true });
      st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
      st.end(frame(SUCCEEDED));
    };
    const wire = w();
    try {
      assert.equal(await outcome(wire.txn(req, 2000)), "answered true");
      assert.equal(await outcome(wire.txn(req, 2000)), "answered true");
      assert.equal(sessions.size, 1, "one connection for both calls");
    } finally {
      wire.close();
    }
  });

  const broken: [string, Mode, RegExp][] = [
    [
      "a body shorter than its prefix announces, with status 0",
      (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(SUCCEEDED, 10));
      },
      /^outage: .*INTERNAL/,
    ],
    [
      "status 0 with no message at all",
      (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end();
      },
      /^outage: .*INTERNAL/,
    ],
    [
      "two messages in a unary answer",
      (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(Buffer.concat([frame(SUCCEEDED), frame(Buffer.from([0x10, 0x00]))]));
      },
      /^outage: .*INTERNAL/,
    ],
    [
      "a compressed message (never asked for)",
      (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(SUCCEEDED, undefined, 1));
      },
      /^outage: .*INTERNAL/,
    ],
    [
      "the whole answer but no trailers (the stream reset after the body)",
      (st) => {
        st.respond(GRPC);
        st.write(frame(SUCCEEDED), () => st.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
      },
      /^outage: .*UNAVAILABLE/,
    ],
    [
      "a reset before any answer",
      (st) => st.close(http2.constants.NGHTTP2_REFUSED_STREAM),
      /^outage: .*UNAVAILABLE/,
    ],
    [
      "the connection cut in the middle of the body",
      (st) => {
        st.respond(GRPC);
        st.write(frame(Buffer.alloc(200, 0x10)).subarray(0, 60), () => rawSocket(st).destroy());
      },
      /^outage: .*UNAVAILABLE/,
    ],
    [
      "the connection reset (TCP RST) in the middle of the body",
      (st) => {
        st.respond(GRPC);
        st.write(frame(Buffer.alloc(200, 0x10)).subarray(0, 60), () => rawSocket(st).resetAndDestroy());
      },
      /^outage: .*UNAVAILABLE/,
    ],
    [
      "GOAWAY naming no stream as processed",
      (st) => st.session?.goaway(http2.constants.NGHTTP2_NO_ERROR, 0),
      /^outage: /,
    ],
    [
      "GOAWAY with an error code",
      (st) => st.session?.goaway(http2.constants.NGHTTP2_INTERNAL_ERROR, 0),
      /^outage: /,
    ],
    [
      "HTTP 503 without a gRPC status (a proxy)",
      (st) => {
        st.respond({ ":status": 503 });
        st.end();
      },
      /^outage: .*UNAVAILABLE.*HTTP 503/,
    ],
    [
      "no answer within the deadline",
      () => undefined,
      /^outage: .*DEADLINE_EXCEEDED/,
    ],
    [
      "etcd's no-leader refusal, trailers-only, percent-encoded",
      (st) => {
        st.respond({ ...GRPC, "grpc-status": "14", "grpc-message": "etcdserver%3A no leader" }, { endStream: true });
      },
      /^outage: .*etcdserver: no leader/,
    ],
    [
      "permission denied, trailers-only",
      (st) => {
        st.respond({ ...GRPC, "grpc-status": "7", "grpc-message": "etcdserver: permission denied" }, { endStream: true });
      },
      /^denied: /,
    ],
    [
      "an answer larger than the limit",
      (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(Buffer.alloc(10_000, 0)));
      },
      /^too_large: /,
    ],
  ];
  for (const [what, m, expected] of broken) {
    it(`${what}: never a resolved answer, and the wire answers the next call`, async () => {
      const wire = w();
      try {
        mode = m;
        assert.match(await outcome(wire.txn(req, 400)), expected);
        mode = (st) => {
          st.respond(GRPC, { waitForTrailers: true });
          st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
          st.end(frame(SUCCEEDED));
        };
        assert.equal(await outcome(wire.txn(req, 2000)), "answered true", "the next call after the failure");
      } finally {
        wire.close();
      }
    });
  }

  it("an answer arriving after the deadline is ignored (one settlement), and the connection was dropped", async () => {
    const wire = w();
    try {
      let held: http2.ServerHttp2Stream | null = null;
      mode = (st) => {
        held = st;
      };
      assert.match(await outcome(wire.txn(req, 200)), /^outage: .*DEADLINE_EXCEEDED/);
      const st = held as http2.ServerHttp2Stream | null;
      assert.ok(st !== null, "the request reached the server");
      await until("the server saw the silent connection closed", () => st.session === undefined || st.session.closed || st.session.destroyed, 5000);
      if (!st.destroyed) {
        st.respond(GRPC);
        st.end(frame(SUCCEEDED));
      }
    } finally {
      wire.close();
    }
  });

  it("a deadline on one stream costs only that stream while the connection still answers a PING: the other stream on it is answered, on the same connection", async () => {
    const wire = w();
    try {
      let n = 0;
      mode = (st) => {
        // The first request is never answered; the second is answered after 400 ms.
        if (n++ === 1) {
          setTimeout(() => {
            if (st.destroyed) return;
            st.respond(GRPC, { waitForTrailers: true });
            st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
            st.end(frame(SUCCEEDED));
          }, 400);
        }
      };
      const silent = outcome(wire.txn(req, 200));
      await until("the first request reached the server", () => n === 1, 2000, 5);
      const healthy = outcome(wire.txn(req, 2000));
      assert.match(await silent, /^outage: .*DEADLINE_EXCEEDED/);
      // The peer answers PINGs (node's server does): a slow request, not a silent member.
      assert.equal(await healthy, "answered true", "the sibling is answered on the connection that was kept");
      mode = (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(SUCCEEDED));
      };
      assert.equal(await outcome(wire.txn(req, 2000)), "answered true");
      assert.equal(wire.connects, 1, "one connection throughout");
    } finally {
      wire.close();
    }
  });

  it("a peer that answers before reading a large body (trailers-only status) settles the call with that status at once, not at the deadline", async () => {
    const wire = w();
    try {
      mode = (st) => {
        // Refuse without reading: the 5 MB body cannot all be sent (flow control), the answer ends the stream.
        st.respond({ ...GRPC, "grpc-status": "8", "grpc-message": "etcdserver: request is too large" }, { endStream: true });
      };
      const big = { compare: [], success: [{ request_put: { key: Buffer.from("k"), value: Buffer.alloc(5_000_000, 120) } }], failure: [] };
      const t0 = Date.now();
      const o = await outcome(wire.txn(big, 5000));
      assert.match(o, /^too_large: .*request is too large/);
      assert.ok(Date.now() - t0 < 2500, `settled by the answer, not the 5 s deadline (${Date.now() - t0} ms)`);
      mode = (st) => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(SUCCEEDED));
      };
      assert.equal(await outcome(wire.txn(req, 2000)), "answered true", "and the connection still serves the next call");
    } finally {
      wire.close();
    }
  });

  it("GOAWAY that lets the stream in flight finish: it is answered on the old connection, while a new call goes on a new one", async () => {
    const wire = w();
    try {
      let n = 0;
      const seen = new Set<http2.Http2Session>();
      const answer = (st: http2.ServerHttp2Stream): void => {
        st.respond(GRPC, { waitForTrailers: true });
        st.on("wantTrailers", () => st.sendTrailers({ "grpc-status": "0" }));
        st.end(frame(SUCCEEDED));
      };
      mode = (st) => {
        seen.add(st.session!);
        if (n++ === 0) {
          st.session!.goaway(http2.constants.NGHTTP2_NO_ERROR, st.id!);
          setTimeout(() => answer(st), 150);
        } else answer(st);
      };
      const first = outcome(wire.txn(req, 2000));
      await until("the first request reached the server", () => n === 1, 2000, 5);
      await sleep(30);
      assert.equal(await outcome(wire.txn(req, 2000)), "answered true", "a call after GOAWAY");
      assert.equal(await first, "answered true", "the stream GOAWAY let finish");
      assert.equal(seen.size, 2, "the call after GOAWAY went on a new connection");
    } finally {
      wire.close();
    }
  });
});


// --------------------------------------------------------------------------------------------------

describe("review: txn-wire under faults on a real cluster", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  let admin: Etcd3;
  const dirs = tempDir("wire-review");
  const storages: Storage[] = [];
  const wires: TxnWire[] = [];
  let seq = 0;
  const make = (extra: Partial<ReplicatedOptions> = {}): Storage => {
    const s = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/m${seq++}`, healthIntervalMs: 250, ...extra });
    storages.push(s);
    return s;
  };
  const fresh = (): string => `${dirs.dir}/fresh${seq++}`;
  const leader = async (): Promise<number> => {
    let i = -1;
    await until("a leader", async () => {
      i = (await dc.cluster.status()).members.findIndex((m) => m.isLeader);
      return i >= 0;
    });
    return i;
  };

  before(async () => {
    dc = await devCluster();
    admin = new Etcd3({ hosts: dc.cluster.endpoints, grpcOptions: { "grpc.max_receive_message_length": 64 << 20 } });
  });
  after(async () => {
    for (let i = 0; i < 3; i++) dc?.cluster.signal(i, "SIGCONT");
    for (const w of wires) w.close();
    for (const s of storages) await s.close().catch(() => undefined);
    admin?.close();
    await dc?.stop();
    dirs.remove();
  });

  it("member faults while commits are in flight (leader SIGSTOP, follower SIGKILL, leader SIGTERM): every acknowledged commit is in a fresh reader's log once, at its receipt, in order", async () => {
    const storage = make({ attemptTimeoutMs: 500, commitTimeoutMs: 2000 });
    const ledger = new Ledger();
    const problems: unknown[] = [];
    let stop = false;
    const names = ["fa", "fb", "fc"];
    const workers = names.map((n) => worker(storage, n, ledger, () => stop, 4, problems));
    const progress = async (more: number, what: string): Promise<void> => {
      const target = ledger.acked() + more;
      await until(`${more} more acknowledged commits ${what} (${ledger.summary()})`, () => ledger.acked() >= target, 45_000);
    };
    try {
      await progress(30, "before any fault");
      const l1 = await leader();
      dc.cluster.signal(l1, "SIGSTOP");
      await sleep(2500);
      dc.cluster.signal(l1, "SIGCONT");
      await untilQuorum(dc.cluster);
      await progress(30, "after the leader was frozen");
      const l2 = await leader();
      const follower = [0, 1, 2].find((i) => i !== l2)!;
      await dc.cluster.kill(follower);
      await sleep(1000);
      await dc.cluster.restart(follower);
      await untilQuorum(dc.cluster);
      await progress(30, "after a follower was killed");
      const l3 = await leader();
      await dc.cluster.kill(l3, "SIGTERM"); // graceful: leadership transfer and GOAWAY on its connections
      await sleep(500);
      await dc.cluster.restart(l3);
      await untilQuorum(dc.cluster);
      await progress(30, "after the leader was stopped gracefully");
    } finally {
      stop = true;
      await Promise.all(workers);
    }
    const probe = await storage.open("fa");
    const stats = probe.stats() as ReplicatedStats;
    await probe.close();
    await storage.close();
    assert.ok(stats.commitTxnsHttp2 > 0, "the commits went on txn-wire");
    let unknown = { unknownIn: 0, unknownOut: 0 };
    for (const n of names) {
      const r = checkLog(n, await freshLog(dc.cluster.endpoints, fresh(), n), ledger);
      unknown = { unknownIn: unknown.unknownIn + r.unknownIn, unknownOut: unknown.unknownOut + r.unknownOut };
    }
    // Only StorageFailure (outcome unknown) is an acceptable failure: member faults must never refuse a commit otherwise.
    const other = ledger.attempts.filter((a) => a.outcome === "failed" && !(a.error instanceof StorageFailure));
    assert.deepEqual(other.map((a) => String(a.error)), [], ledger.summary());
    assert.deepEqual(problems.map(String), [], "every reopen succeeded");
    process.stderr.write(`[member faults] ${ledger.summary()}; unknown outcomes durable ${unknown.unknownIn}, not ${unknown.unknownOut}; txns ${stats.commitTxns} (http2 ${stats.commitTxnsHttp2})\n`);
  });

  it("the leader is SIGKILLed during a burst of grouped commits on two databases: nothing acknowledged is lost or doubled", async () => {
    const storage = make({ attemptTimeoutMs: 500, commitTimeoutMs: 2000 });
    const ledger = new Ledger();
    const dbs = [await storage.open("burst-a"), await storage.open("burst-b")];
    for (const db of dbs) await ledger.commit(db, [`${db.name}-warm`]);
    const l = await leader();
    const pending: Promise<void>[] = [];
    for (let i = 0; i < 80; i++) for (const db of dbs) pending.push(ledger.commit(db, [`${db.name}-x${i}`, `${db.name}-y${i}`]));
    await sleep(15);
    await dc.cluster.kill(l);
    for (let i = 0; i < 40; i++) for (const db of dbs) pending.push(ledger.commit(db, [`${db.name}-z${i}`]));
    const settled = Promise.all(pending);
    await sleep(1500);
    await dc.cluster.restart(l);
    await bounded(settled, `commits after the leader kill (${ledger.summary()})`, 60_000);
    await untilQuorum(dc.cluster);
    for (const db of dbs) {
      checkLog(db.name, await freshLog(dc.cluster.endpoints, fresh(), db.name), ledger);
      await db.close();
    }
    const other = ledger.attempts.filter((a) => a.outcome === "failed" && !(a.error instanceof StorageFailure));
    assert.deepEqual(other.map((a) => String(a.error)), [], ledger.summary());
    process.stderr.write(`[leader kill] ${ledger.summary()}\n`);
  });

  it("GOAWAY: a member stopped with SIGTERM while 150 transactions are in flight on one wire: each is answered or an outage, never a wrong answer; the wire works after the restart", async () => {
    const l = await leader();
    const target = [0, 1, 2].find((i) => i !== l)!; // a follower: its requests are forwarded to the leader, so they stay in flight longer
    const w = new TxnWire(dc.cluster.endpoints[target]!, undefined, 64 << 20);
    wires.push(w);
    const value = "v".repeat(8 * 1024);
    assert.equal((await w.txn({ compare: [], success: [get("goaway/warm")], failure: [] }, 2000)).succeeded, true);
    let done = 0;
    const results = Array.from({ length: 150 }, (_, i) =>
      w
        .txn({ compare: [absent(`goaway/k${i}`)], success: [put(`goaway/k${i}`, `${i}:${value}`)], failure: [get(`goaway/k${i}`)] }, 5000)
        .then((r) => ({ i, ok: true as const, r }), (err: unknown) => ({ i, ok: false as const, err }))
        .finally(() => done++),
    );
    // Stopped once some are answered, so that others are surely in flight.
    await until("the first answers", () => done >= 10, 10_000, 1);
    const killed = dc.cluster.kill(target, "SIGTERM");
    const settled = await Promise.all(results);
    await killed;
    await dc.cluster.restart(target);
    await untilQuorum(dc.cluster);
    let answered = 0;
    for (const s of settled) {
      if (s.ok) {
        answered++;
        assert.equal(s.r.succeeded, true, `txn ${s.i} was answered but its guard failed: sent twice?`);
        assert.equal(await admin.get(`goaway/k${s.i}`).string(), `${s.i}:${value}`, `answered txn ${s.i} is in etcd`);
      } else {
        assert.equal(classifyEtcdError(s.err), "outage", `txn ${s.i}: ${String(s.err)}`);
      }
    }
    // The same wire reconnects after the member's restart.
    await until("the wire is answered again after the restart", () =>
      w.txn({ compare: [], success: [get("goaway/warm")], failure: [] }, 1000).then((r) => r.succeeded, () => false),
    );
    const why = new Map<string, number>();
    for (const s of settled) if (!s.ok) why.set(String(s.err).slice(0, 160), (why.get(String(s.err).slice(0, 160)) ?? 0) + 1);
    process.stderr.write(`[goaway] ${answered}/150 answered; outages: ${JSON.stringify([...why])}\n`);
  });

  it("answers lost after etcd applied the commit (a proxy holds every answer past the attempt deadline), including a 300 KiB record read back: each commit acknowledged once, none doubled", async () => {
    const proxies = dc.cluster.endpoints.map((u) => new TcpProxy(new URL(u)));
    const endpoints = await Promise.all(proxies.map((p) => p.start()));
    const storage = createReplicatedStorage({ endpoints, dataDir: `${dirs.dir}/proxied`, attemptTimeoutMs: 1000, commitTimeoutMs: 2500, healthIntervalMs: 250 });
    storages.push(storage);
    const ledger = new Ledger();
    // Large enough for many DATA frames; small enough that a resend (the whole payload again) and its
    // read-back fit one attempt deadline on a loaded machine.
    const big = "é€😀\u0001\"\\ " + "b".repeat(300 * 1024);
    try {
      const small = await storage.open("lost-small");
      const large = await storage.open("lost-large");
      await ledger.commit(small, ["warm-s"]);
      await ledger.commit(large, ["warm-l"]);
      const before = (small.stats() as ReplicatedStats).commitTxnsHttp2;
      for (const p of proxies) p.hold();
      const pending = [
        ledger.commit(small, ["s1", "s2"]),
        ledger.commit(small, ["s3"]),
        ledger.commit(large, ["big1"], [out("big1", big)]),
      ];
      await sleep(2300);
      // etcd applied them while no answer reached the adapter.
      assert.equal(await admin.get(keysOf("lost-large").head).string(), "2", "the large commit applied while its answer was held");
      // The two small commits go in one group or the second waits for the first's outcome.
      assert.match((await admin.get(keysOf("lost-small").head).string())!, /^[34]$/, "the first small commit applied while its answer was held");
      assert.equal(ledger.attempts.filter((a) => a.outcome !== "pending").length, 2, "nothing was acknowledged while the answers were held");
      for (const p of proxies) p.release();
      await bounded(Promise.all(pending), `commits after the answers came back (${ledger.summary()})`, 30_000);
      const attempts = (small.stats() as ReplicatedStats).commitTxnsHttp2 - before;
      assert.ok(attempts > 3, `the lost answers were resent (${attempts} attempts for 3 commits)`);
      // Then every connection is reset (RST) while a burst is in flight.
      const burst: Promise<void>[] = [];
      for (let i = 0; i < 30; i++) burst.push(ledger.commit(small, [`r${i}`]), ledger.commit(large, [`R${i}`], [out(`R${i}`, "x".repeat(20_000))]));
      await sleep(5);
      const reset = proxies.reduce((n, p) => n + p.resetAll(), 0);
      await bounded(Promise.all(burst), `commits after the resets (${ledger.summary()})`, 30_000);
      assert.ok(reset > 0, "connections were reset");
      await small.close();
      await large.close();
    } finally {
      await storage.close();
      for (const p of proxies) await p.stop();
    }
    const failed = ledger.attempts.filter((a) => a.outcome === "failed");
    assert.deepEqual(failed.map((a) => String(a.error)), [], `lost answers are resolved by reading back, never reported as failures: ${ledger.summary()}`);
    for (const name of ["lost-small", "lost-large"]) {
      const log = await freshLog(dc.cluster.endpoints, fresh(), name);
      checkLog(name, log, ledger);
      if (name === "lost-large") {
        const e = log.find((x) => x.identity === "big1")!;
        assert.equal((e.body as { data: string }).data, big, "the 300 KiB record is read back byte for byte");
      }
    }
  });

  it("one endpoint of four refuses connections: commits go around it, and nothing throws out of the wire", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const storage = createReplicatedStorage({ endpoints: [dead, ...dc.cluster.endpoints], dataDir: `${dirs.dir}/refused`, attemptTimeoutMs: 500, healthIntervalMs: 250 });
    storages.push(storage);
    const ledger = new Ledger();
    const db = await storage.open("refused");
    for (let round = 0; round < 8; round++) {
      await Promise.all(Array.from({ length: 5 }, (_, i) => ledger.commit(db, [`ref-${round}-${i}`])));
      await sleep(400); // lets the dead member's penalty run out, so it is tried again
    }
    assert.equal(ledger.acked(), 40, ledger.summary());
    const s = db.stats() as ReplicatedStats;
    await db.close();
    await storage.close();
    checkLog("refused", await freshLog(dc.cluster.endpoints, fresh(), "refused"), ledger);
    process.stderr.write(`[refused] txns ${s.commitTxns} (http2 ${s.commitTxnsHttp2})\n`);
  });

  it("large and multi-byte commits: exactly MAX_BATCH_BYTES, MAX_BATCH_EVENTS events with 512-character non-ASCII identities, one byte over is refused and not written", async () => {
    const storage = make();
    const db = await storage.open("large");
    const ledger = new Ledger();
    // One event whose JSON array is exactly MAX_BATCH_BYTES, with 2-, 3- and 4-byte characters and escapes.
    const sized = (id: string, target: number): NewEvent => {
      const mixed = "é€😀\u0000\u001f\"\\\n\t".repeat(2000);
      const base = Buffer.byteLength(JSON.stringify([out(id, mixed)]));
      return out(id, mixed + "a".repeat(target - base));
    };
    const exact = sized("exact-ü-😀", MAX_BATCH_BYTES);
    assert.equal(Buffer.byteLength(JSON.stringify([exact])), MAX_BATCH_BYTES);
    await ledger.commit(db, [exact.identity], [exact]);
    const over = sized("over-1", MAX_BATCH_BYTES + 1);
    await ledger.commit(db, [over.identity], [over]);
    // MAX_BATCH_EVENTS events with the longest identities, non-ASCII, totalling near the byte limit.
    const idOf = (i: number): string => `${String(i).padStart(3, "0")}-🔑` + "ключ-鍵/".repeat(80).slice(0, 512 - 6);
    const perEvent = Math.floor(MAX_BATCH_BYTES / MAX_BATCH_EVENTS) - 1400;
    const many = Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => out(idOf(i), "ж".repeat(perEvent / 2)));
    assert.ok(Buffer.byteLength(JSON.stringify(many)) <= MAX_BATCH_BYTES);
    await ledger.commit(db, many.map((e) => e.identity), many);
    // Several large commits at once (each goes alone: two would pass the byte limit).
    await Promise.all(Array.from({ length: 4 }, (_, i) => ledger.commit(db, [`par-${i}`], [out(`par-${i}`, "p".repeat(700 * 1024))])));
    const overAttempt = ledger.attempts.find((a) => a.ids[0] === "over-1")!;
    assert.ok(overAttempt.error instanceof StorageRejected && overAttempt.error.reason === "too_large", String(overAttempt.error));
    const failedOther = ledger.attempts.filter((a) => a.outcome === "failed" && a !== overAttempt);
    assert.deepEqual(failedOther.map((a) => String(a.error)), [], ledger.summary());
    await db.close();
    const log = await freshLog(dc.cluster.endpoints, fresh(), "large");
    checkLog("large", log, ledger);
    const byId = new Map(log.map((e) => [e.identity, e]));
    assert.deepEqual(byId.get(exact.identity)!.body, exact.body, "the exact-limit event reads back equal");
    many.forEach((e) => assert.deepEqual(byId.get(e.identity)?.body, e.body, "each of the many events reads back equal"));
    // No identity keys: the identities (UTF-8, multi-byte) live in the batch records, and the read-back above is exact.
    assert.equal(Number(await admin.getAll().prefix(keysOf("large").identPrefix).count()), 0);
    assert.ok(byId.has(idOf(7)));
  });

  it("the largest transaction the adapter can build (128-character name, MAX_BATCH_EVENTS 512-character 3-byte identities, exactly MAX_BATCH_BYTES) fits etcd's request limit and reads back", async () => {
    const name = "W" + "x".repeat(127);
    const storage = make();
    const db = await storage.open(name);
    const ledger = new Ledger();
    const idOf = (i: number): string => String(i).padStart(4, "0") + "鍵".repeat(508);
    const base = Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => out(idOf(i), ""));
    const room = MAX_BATCH_BYTES - Buffer.byteLength(JSON.stringify(base));
    assert.ok(room > 0, `room ${room}`);
    const each = Math.floor(room / MAX_BATCH_EVENTS);
    const events = base.map((e, i) => out(e.identity, "d".repeat(each + (i === 0 ? room - each * MAX_BATCH_EVENTS : 0))));
    assert.equal(Buffer.byteLength(JSON.stringify(events)), MAX_BATCH_BYTES);
    await ledger.commit(db, events.map((e) => e.identity), events);
    assert.deepEqual(ledger.attempts.map((a) => (a.outcome === "acked" ? "acked" : String(a.error))), ["acked"]);
    await db.close();
    const log = await freshLog(dc.cluster.endpoints, fresh(), name);
    checkLog(name, log, ledger);
    assert.deepEqual(log.map((e) => e.body), events.map((e) => e.body));
  });

  it("the wire's decoding of large, binary and many-key responses equals the etcd3 client's (a 3 MiB answer in many DATA frames)", async () => {
    const w = new TxnWire(dc.cluster.endpoints[0]!, undefined, 64 << 20);
    wires.push(w);
    const bin = (s: string): Buffer => Buffer.concat([Buffer.from([0x00, 0xff, 0xfe]), Buffer.from(s, "utf8"), Buffer.from([0x80, 0x00])]);
    const prefix = Buffer.from([0x01, 0xff, 0x00, 0x7f]);
    const big = Buffer.alloc(1024 * 1024 + 17, 0);
    for (let i = 0; i < big.length; i++) big[i] = (i * 131) & 0xff;
    for (let i = 0; i < 3; i++) await admin.put(Buffer.concat([prefix, Buffer.from([i])])).value(Buffer.concat([big, Buffer.from([i])]));
    for (let i = 0; i < 300; i++) await admin.put(Buffer.concat([prefix, Buffer.from([0xf0]), bin(`k${i}`)])).value(bin(`v${i}`));
    const end = Buffer.from(prefix);
    end[end.length - 1]! += 1;
    const ops = [{ request_range: { key: prefix, range_end: end } }, { request_range: { key: prefix, range_end: end, limit: 7 } }, { request_range: { key: prefix, range_end: end, count_only: true } }];
    const ours = await w.txn({ compare: [], success: ops, failure: [] }, 10_000);
    const theirs = await admin.kv.txn({ compare: [], success: ops, failure: [] });
    assert.equal(ours.responses.length, 3);
    for (let i = 0; i < 3; i++) {
      const a = ours.responses[i]!.response_range;
      const b = theirs.responses[i]!.response_range;
      assert.equal(a.count, b.count);
      assert.equal(a.more, b.more);
      assert.equal(a.kvs.length, b.kvs.length);
      a.kvs.forEach((kv, j) => {
        assert.ok(kv.key.equals(b.kvs[j]!.key), `key ${j} of response ${i}`);
        assert.ok(kv.value.equals(b.kvs[j]!.value), `value ${j} of response ${i}`);
        assert.equal(kv.mod_revision, b.kvs[j]!.mod_revision);
        assert.equal(kv.create_revision, b.kvs[j]!.create_revision);
        assert.equal(kv.version, b.kvs[j]!.version);
      });
    }
    assert.equal(ours.responses[0]!.response_range.kvs.length, 303);
    assert.equal(ours.responses[1]!.response_range.more, true);
    // And a guarded binary write through the wire reads back through the client.
    const key = bin("written-by-wire");
    const res = await w.txn({ compare: [{ key, target: "Create", result: "Equal", create_revision: 0 }], success: [{ request_put: { key, value: big } }], failure: [] }, 10_000);
    assert.equal(res.succeeded, true);
    assert.ok((await admin.get(key).buffer())!.equals(big));
  });

  // Found by this review (decodeKeyValue read the int64 lease with a float varint, exact only to 2^53),
  // fixed in 2afafa0: a regression test now.
  it(
    "decodes the lease of a leased key exactly, as the etcd3 client does (etcd's lease ids are above 2^53)",
    async () => {
      // etcd's ids are (member id & 0xffff) << 48 | time | counter, above 2^53 for all but 32 of 65536 member ids;
      // an id of that size is asked for explicitly, so the test does not depend on the cluster's member ids.
      const { ID } = await admin.leaseClient.leaseGrant({ TTL: 60, ID: "7587862311893524237" });
      assert.equal(ID, "7587862311893524237");
      await admin.kv.put({ key: Buffer.from("leased/k"), value: Buffer.from("v"), lease: ID });
      const w = new TxnWire(dc.cluster.endpoints[0]!, undefined, 1 << 20);
      wires.push(w);
      const ours = (await w.txn({ compare: [], success: [get("leased/k")], failure: [] }, 2000)).responses[0]!.response_range.kvs[0]!;
      const theirs = (await admin.kv.txn({ compare: [], success: [get("leased/k")], failure: [] })).responses[0]!.response_range.kvs[0]!;
      assert.equal(theirs.lease, ID);
      assert.equal(ours.lease, theirs.lease, "the lease id as etcd holds it");
    },
  );

  // Found by this review (int64() refused any id above Number.MAX_SAFE_INTEGER with a TypeError thrown
  // synchronously from txn()), fixed in 2afafa0: a regression test now.
  it(
    "sends a put attached to a real etcd lease (ops.ts putWithLease with an id above 2^53), as the etcd3 client does",
    async () => {
      const { ID } = await admin.leaseClient.leaseGrant({ TTL: 60, ID: "7587862311893524239" });
      assert.equal(ID, "7587862311893524239");
      const w = new TxnWire(dc.cluster.endpoints[0]!, undefined, 1 << 20);
      wires.push(w);
      const res = await w.txn({ compare: [], success: [putWithLease("leased/w", "v", ID)], failure: [] }, 2000).then(
        (r) => `succeeded ${r.succeeded}`,
        (e: unknown) => String(e),
      );
      assert.equal(res, "succeeded true");
      const kv = (await admin.kv.txn({ compare: [], success: [get("leased/w")], failure: [] })).responses[0]!.response_range.kvs[0];
      assert.equal(kv?.lease, ID, "etcd holds the key under that lease");
    },
  );

  it("fencing over the wire: the epoch moved between commit() and the transaction; the wire's read-back says fenced (ResetError stop); then a real second opener fences the next commit", async () => {
    let moveEpoch: (() => Promise<void>) | null = null;
    const storage = make({
      faults: async (point) => {
        if (point === "commit:before" && moveEpoch !== null) {
          const f = moveEpoch;
          moveEpoch = null;
          await f();
        }
      },
    });
    // The hook moves the epoch in etcd (as another opener would) after commit() was called. The
    // handle's epoch watch may learn it first (then the commit is refused before sending); each round
    // uses a new database until the wire's own read-back decided at least twice.
    let wireDecided = 0;
    const handles: Database[] = [];
    for (let round = 0; round < 12 && wireDecided < 2; round++) {
      const name = `fence-${round}`;
      const db = await storage.open(name);
      handles.push(db);
      await db.commit([ev(`${name}-1`)]);
      const keys = keysOf(name);
      const epoch = (db as unknown as { epoch: number }).epoch;
      moveEpoch = async () => {
        await admin.put(keys.epoch).value(String(epoch + 1));
      };
      const before = (db.stats() as ReplicatedStats).commitTxnsHttp2;
      const err = await db.commit([ev(`${name}-2`)]).then(
        () => assert.fail("a commit after the epoch moved was acknowledged"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ResetError, String(err));
      assert.equal(err.action, "stop");
      assert.equal(err.reason, "fenced");
      assert.match(err.message, new RegExp(`epoch ${epoch + 1}`), "the epoch read back is named");
      assert.equal(await admin.get(keys.head).string(), "1", "nothing was written");
      if ((db.stats() as ReplicatedStats).commitTxnsHttp2 > before) wireDecided++;
    }
    assert.ok(wireDecided >= 1, "at least one fence was decided by the transaction sent on the wire (its failure branch), not by the watch");
    // A real second opener (another machine) fences the first handle's next commit.
    const other = make();
    const db2 = await other.open("fence-0");
    const first = make();
    const dbA = await first.open("fence2");
    await dbA.commit([ev("f2-1")]);
    const dbB = await make().open("fence2");
    const err2 = await dbA.commit([ev("f2-2")]).catch((e: unknown) => e);
    assert.ok(err2 instanceof ResetError && err2.action === "stop", String(err2));
    await dbB.commit([ev("f2-3")]);
    assert.deepEqual((await freshLog(dc.cluster.endpoints, fresh(), "fence2")).map((e) => e.identity), ["f2-1", "f2-3"]);
    await Promise.all([...handles.map((h) => h.close()), db2.close(), dbA.close(), dbB.close()]);
  });

  // --- process lifetime ------------------------------------------------------------------------

  const TSX_ARGS = ["--import", "tsx", "--input-type=module", "-e"];
  const WIRE = pathToFileURL(new URL("../../storage-adapters/replicated/txn-wire.ts", import.meta.url).pathname).href;
  const OPS = pathToFileURL(new URL("../../storage-adapters/replicated/ops.ts", import.meta.url).pathname).href;
  const ERRS = pathToFileURL(new URL("../../storage-adapters/replicated/etcd-errors.ts", import.meta.url).pathname).href;
  const REPL = pathToFileURL(new URL("../../storage-adapters/replicated/index.ts", import.meta.url).pathname).href;
  const EVENTS = pathToFileURL(new URL("../../src/state/events.ts", import.meta.url).pathname).href;

  /** Runs a child; resolves with its stdout lines and how it ended (or "running" after `ms`). */
  /** A child's control: its stdin, and `stopIn(ms)` to kill it that long from now if it is still running. */
  interface ChildControl {
    readonly stdin: NodeJS.WritableStream;
    stopIn(ms: number): void;
  }

  /** Runs a child; resolves with its stdout lines and how it ended ("running" when it was killed after `ms`). */
  function child(script: string, args: string[], ms: number, onLine?: (l: string, c: ChildControl) => void): Promise<{ lines: string[]; ended: string; ms: number }> {
    const t0 = Date.now();
    const c = spawn(process.execPath, [...TSX_ARGS, script, ...args], { cwd: new URL("../..", import.meta.url).pathname, stdio: ["pipe", "pipe", "inherit"] });
    const lines: string[] = [];
    return new Promise((resolve) => {
      let killed = false;
      const kill = (): void => {
        killed = true;
        c.kill("SIGKILL");
      };
      let timer = setTimeout(kill, ms);
      const control: ChildControl = {
        stdin: c.stdin!,
        stopIn: (later) => {
          clearTimeout(timer);
          timer = setTimeout(kill, later);
        },
      };
      createInterface({ input: c.stdout! }).on("line", (l) => {
        lines.push(l);
        onLine?.(l, control);
      });
      c.on("exit", (code, sig) => {
        clearTimeout(timer);
        // Lines still in the pipe arrive before 'close'.
        c.on("close", () => resolve({ lines, ended: killed ? "running" : `exit ${code ?? sig}`, ms: Date.now() - t0 }));
      });
    });
  }

  it("a process whose only work is one wire request: kept alive while it waits (a frozen member, to the deadline), and exits by itself once answered, without close()", async () => {
    const script = `
import { TxnWire } from ${JSON.stringify(WIRE)};
import { get } from ${JSON.stringify(OPS)};
import { classifyEtcdError } from ${JSON.stringify(ERRS)};
const [url, timeout] = process.argv.slice(1);
const w = new TxnWire(url, undefined, 1 << 20);
const t0 = Date.now();
const line = await w.txn({ compare: [], success: [get("lifetime")], failure: [] }, Number(timeout)).then(
  (r) => "answered " + r.succeeded,
  (e) => "failed " + classifyEtcdError(e),
);
console.log(line + " " + (Date.now() - t0));
`;
    const live = await child(script, [dc.cluster.endpoints[0]!, "3000"], 20_000);
    assert.equal(live.ended, "exit 0", `an answered wire lets the process exit by itself: ${JSON.stringify(live)}`);
    assert.match(live.lines.join("\n"), /^answered true/);
    await dc.cluster.freeze(2);
    try {
      const frozen = await child(script, [dc.cluster.endpoints[2]!, "2500"], 25_000);
      assert.equal(frozen.ended, "exit 0", JSON.stringify(frozen));
      assert.match(frozen.lines.join("\n"), /^failed outage (\d+)/, `the pending request kept the process alive until its deadline: ${JSON.stringify(frozen)}`);
      assert.ok(Number(/failed outage (\d+)/.exec(frozen.lines.join("\n"))![1]) >= 2400);
    } finally {
      dc.cluster.signal(2, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
  });

  /** What the adapter child below reported, for the test after it. */
  let lifetime: { lines: string[]; ended: string; ms: number; closedAt: number | null } | null = null;

  it("a process that opens, commits while the quorum is lost (the commit waits) and closes: alive until its receipt; after close() no connection and no timer of txn-wire is left", async () => {
    const script = `
import { createHook } from "node:async_hooks";
import { createInterface } from "node:readline";
// Every timer and TCP handle created from here on, with where it was created (to name what keeps the process alive).
const timers = new Map();
const tcp = new Map();
createHook({
  init(id, type, _trigger, res) {
    if (type === "Timeout") timers.set(id, { res, stack: new Error().stack });
    if (type === "TCPWRAP") tcp.set(res, new Error().stack);
  },
  destroy(id) { timers.delete(id); },
}).enable();
const owner = (stack) => (/txn-wire/.test(stack) ? "txn-wire" : /WatchManager/.test(stack) ? "etcd3 WatchManager reconnect" : /grpc-js/.test(stack) ? "grpc-js (etcd3)" : "other: " + String(stack).split("\\n").slice(2, 6).join(" < "));
const { createReplicatedStorage } = await import(${JSON.stringify(REPL)});
const { event } = await import(${JSON.stringify(EVENTS)});
const [endpoints, dataDir] = process.argv.slice(1);
process.on("unhandledRejection", (e) => console.log("unhandled " + String(e)));
const s = createReplicatedStorage({ endpoints: endpoints.split(","), dataDir, attemptTimeoutMs: 500, commitTimeoutMs: 1500 });
const db = await s.open("lifetime");
console.log("opened");
const rl = createInterface({ input: process.stdin });
rl.once("line", async () => {
  rl.close();
  process.stdin.destroy();
  const t0 = Date.now();
  const r = await db.commit([event("timer_fired", "s1", "life-1", "${AT}", { timer_id: "t", due_at: "${AT}", late_ms: 0 })]);
  console.log("receipt " + JSON.stringify(r) + " http2 " + db.stats().commitTxnsHttp2 + " after " + (Date.now() - t0));
  await s.close();
  console.log("closed");
  setTimeout(() => {
    const left = [...timers.values()].filter((t) => t.res.hasRef?.() === true && !t.res._destroyed).map((t) => owner(t.stack));
    const sockets = process._getActiveHandles().filter((h) => h.constructor.name === "Socket" && h.remotePort !== undefined).map((h) => owner(tcp.get(h._handle) ?? "unknown"));
    const others = process.getActiveResourcesInfo().filter((r) => r !== "Timeout" && r !== "PipeWrap" && r !== "TCPSocketWrap");
    console.log("after-close " + JSON.stringify({ resources: others, sockets, timers: left }));
  }, 2000).unref();
});
`;
    let childIn: NodeJS.WritableStream | null = null;
    let closedAt: number | null = null;
    const t0 = Date.now();
    const run = child(script, [dc.cluster.endpoints.join(","), `${dirs.dir}/life`], 40_000, (l, c) => {
      if (l === "opened") childIn = c.stdin;
      if (l === "closed") {
        closedAt = Date.now() - t0;
        c.stopIn(10_000); // what is still running 10 s after close() is killed (and reported by the next test)
      }
    });
    try {
      await until("the child opened", () => childIn !== null, 30_000);
      await dc.cluster.freeze(1);
      await dc.cluster.freeze(2);
      childIn!.write("go\n");
      const early = await Promise.race([run.then((x) => `ended: ${JSON.stringify(x)}`), sleep(3000).then(() => "waiting")]);
      assert.equal(early, "waiting", "the child must not exit (or acknowledge) while its commit waits for the quorum");
    } finally {
      dc.cluster.signal(1, "SIGCONT");
      dc.cluster.signal(2, "SIGCONT");
    }
    const r = await run;
    lifetime = { ...r, closedAt };
    process.stderr.write(`[lifetime] ${JSON.stringify(lifetime)}\n`);
    assert.match(r.lines.join("\n"), /receipt \{"firstSeq":1,"lastSeq":1\} http2 [1-9]/);
    assert.ok(r.lines.includes("closed"), JSON.stringify(r));
    assert.deepEqual(r.lines.filter((l) => l.startsWith("unhandled")), []);
    const report = r.lines.find((l) => l.startsWith("after-close "));
    if (report !== undefined) {
      const { resources, sockets, timers } = JSON.parse(report.slice("after-close ".length)) as { resources: string[]; sockets: string[]; timers: string[] };
      assert.deepEqual(resources, [], "nothing else is left open after close()");
      assert.deepEqual(sockets.filter((t) => t === "txn-wire" || t.startsWith("other")), [], "no connection of txn-wire is left open after close()");
      assert.deepEqual(timers.filter((t) => t === "txn-wire" || t.startsWith("other")), [], "no timer of txn-wire (or anything else of ours) keeps the process alive after close()");
    } else {
      assert.match(r.ended, /^exit 0/, "the child ended before its report, by itself");
    }
    await untilQuorum(dc.cluster);
    assert.deepEqual((await freshLog(dc.cluster.endpoints, fresh(), "lifetime")).map((e) => e.identity), ["life-1"]);
  });

  it(
    // Found by this review: etcd3's watch reconnect timers (its default backoff grows to 30 s, and
    // Etcd3.close() does not clear them) kept such a process alive for tens of seconds; the adapter
    // now caps the watch backoff at 1 s (router.ts, memberClientOptions). CI (stop 30) still saw a
    // child alive 10 s after close(): a watch whose recheck failed during the outage left its stream
    // attached beside the next one (watch.ts now drops it), and Etcd3.close() leaves attached
    // watchers reconnecting forever (router.ts closeEtcdClient now empties the watch manager).
    // Both are shown deterministically by test/replicated/client-close.test.ts.
    "a process that closed its storage after a quorum loss exits within 10 s of close()",
    () => {
      assert.ok(lifetime !== null, "the test before ran");
      assert.ok(lifetime.closedAt !== null, "the child closed its storage");
      assert.match(lifetime.ended, /^exit 0/, `the child was still running ${Math.round((lifetime.ms - lifetime.closedAt) / 1000)} s after close(): ${lifetime.lines.find((l) => l.startsWith("after-close ")) ?? ""}`);
      assert.ok(lifetime.ms - lifetime.closedAt < 10_000, `exited ${lifetime.ms - lifetime.closedAt} ms after close()`);
    },
  );

  it("nothing escaped: no uncaught exception, no unhandled rejection", () => {
    assert.deepEqual(uncaught.map(String), []);
    assert.deepEqual(unhandled.map(String), []);
  });
});

exitAfterTests("test/replicated/txn-wire-review.test.ts");
