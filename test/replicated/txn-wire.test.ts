/**
 * The commit path's own etcd client (txn-wire.ts): its protobuf encoding and decoding checked against
 * the etcd3 client's (protobufjs on etcd's rpc.proto) as properties, and its behaviour on a real
 * cluster: the same answers as the etcd3 client, a refused connection, a frozen member (SIGSTOP)
 * answered by a deadline and left behind, a killed member, etcd's own refusals, and close; lease
 * keep-alives and member status likewise. Then the adapter: commits, ownership lease renewals and
 * member polls go on it by default, and through the etcd3 client with commitClient "etcd3".
 */
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import { Etcd3, type ICompare, type IRequestOp } from "etcd3";
import { classifyEtcdError } from "../../storage-adapters/replicated/etcd-errors.js";
import { createReplicatedStorage, type ReplicatedStats } from "../../storage-adapters/replicated/index.js";
import { absent, count, del, delRange, get, modIs, prefixEnd, present, put, putWithLease, range, valueIs } from "../../storage-adapters/replicated/ops.js";
import { TxnWire, decodeKeepAliveTtl, decodeStatusLeader, decodeTxnResponse, encodeTxnRequest, type TxnRequest } from "../../storage-adapters/replicated/txn-wire.js";
import { devCluster, ev, tempDir, untilQuorum } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

// The etcd3 client's own codec, as the oracle: its copy of proto-loader on its rpc.proto.
const fromEtcd3 = createRequire(createRequire(import.meta.url).resolve("etcd3"));
const loader = fromEtcd3("@grpc/proto-loader") as typeof import("@grpc/proto-loader");
const pkg = loader.loadSync(fromEtcd3.resolve("etcd3/proto/rpc.proto"), { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
interface MethodDef {
  requestSerialize(v: unknown): Buffer;
  requestDeserialize(b: Buffer): unknown;
  responseSerialize(v: unknown): Buffer;
  responseDeserialize(b: Buffer): unknown;
}
const txnDef = (pkg["etcdserverpb.KV"] as unknown as { Txn: MethodDef }).Txn;
const keepAliveDef = (pkg["etcdserverpb.Lease"] as unknown as { LeaseKeepAlive: MethodDef }).LeaseKeepAlive;
const statusDef = (pkg["etcdserverpb.Maintenance"] as unknown as { Status: MethodDef }).Status;

/** Buffers as hex, so deepEqual compares bytes and not Buffer identity. */
const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v, (_k, x: unknown) => (x && typeof x === "object" && (x as { type?: string }).type === "Buffer" ? Buffer.from((x as { data: number[] }).data).toString("hex") : x)));

const key = fc.uint8Array({ minLength: 1, maxLength: 40 }).map((a) => Buffer.from(a));
const bytes = fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a));
const rev = fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2 ** 31 }), fc.maxSafeInteger().filter((n) => n >= 0));
/** etcd's lease ids: random int64s, mostly above 2^53 (etcd3 hands them out as decimal strings). */
const leaseId = fc.oneof(rev.map(String), fc.bigInt({ min: 2n ** 53n, max: 2n ** 63n - 1n }).map(String));
const compareArb: fc.Arbitrary<ICompare> = fc.oneof(
  fc.tuple(key, bytes).map(([k, v]) => ({ key: k, target: "Value" as const, result: "Equal" as const, value: v })),
  fc.tuple(key, rev, fc.constantFrom("Equal", "Greater", "Less", "NotEqual" as const)).map(([k, r, result]) => ({ key: k, target: "Create" as const, result, create_revision: r })),
  fc.tuple(key, rev).map(([k, r]) => ({ key: k, target: "Mod" as const, result: "Equal" as const, mod_revision: String(r) })),
  fc.tuple(key, rev).map(([k, r]) => ({ key: k, target: "Version" as const, result: "Less" as const, version: r })),
  fc.tuple(key, leaseId, key).map(([k, r, end]) => ({ key: k, target: "Lease" as const, result: "NotEqual" as const, lease: r, range_end: end })),
);
const opArb: fc.Arbitrary<IRequestOp> = fc.oneof(
  fc.tuple(key, bytes).map(([k, v]) => ({ request_put: { key: k, value: v } })),
  fc.tuple(key, bytes, leaseId).map(([k, v, l]) => ({ request_put: { key: k, value: v, lease: l } })),
  fc.tuple(key, key, fc.integer({ min: 0, max: 10_000 }), fc.boolean(), fc.boolean()).map(([k, end, limit, keysOnly, countOnly]) => ({
    request_range: { key: k, range_end: end, limit, keys_only: keysOnly, count_only: countOnly },
  })),
  key.map((k) => ({ request_range: { key: k } })),
  fc.tuple(key, fc.option(key, { nil: undefined })).map(([k, end]) => ({ request_delete_range: end === undefined ? { key: k } : { key: k, range_end: end } })),
);
const txnArb: fc.Arbitrary<TxnRequest> = fc.record({ compare: fc.array(compareArb, { maxLength: 6 }), success: fc.array(opArb, { maxLength: 6 }), failure: fc.array(opArb, { maxLength: 4 }) });

describe("txn-wire encoding", () => {
  it("encodes every TxnRequest as protobufjs reads it back, equal to the etcd3 client's own encoding (property)", () => {
    fc.assert(
      fc.property(txnArb, (req) => {
        const ours = encodeTxnRequest(req);
        assert.equal(ours[0], 0, "uncompressed");
        assert.equal(ours.readUInt32BE(1), ours.length - 5, "the prefix announces the message length");
        const theirs = txnDef.requestSerialize(req);
        assert.deepEqual(plain(txnDef.requestDeserialize(ours.subarray(5))), plain(txnDef.requestDeserialize(theirs)));
      }),
      { numRuns: 400 },
    );
  });

  it("encodes the adapter's own builders as the etcd3 client does (the same message; protobufjs also writes zero values it was given, proto3 reads both alike)", () => {
    const req: TxnRequest = {
      compare: [valueIs("c/x/epoch", "7"), absent("c/x/ident/a"), present("c/x/head"), modIs("c/x/lease", "0")],
      success: [put("c/x/log/1", "{}"), put("c/x/empty", ""), putWithLease("c/x/live", "v", "694d77aa9e8b2e0c".length.toString()), del("c/x/old"), delRange("c/x/a", prefixEnd("c/x/a"))],
      failure: [get("c/x/epoch"), range("c/x/log/", prefixEnd("c/x/log/"), 10), count("c/x/mail/")],
    };
    const ours = txnDef.requestDeserialize(encodeTxnRequest(req).subarray(5));
    assert.deepEqual(plain(ours), plain(txnDef.requestDeserialize(txnDef.requestSerialize(req))));
    // Spot checks on what the guard depends on.
    const c = (ours as { compare: { target: string; result: string; create_revision?: string; target_union?: string }[] }).compare;
    assert.equal(c[1]!.target, "Create");
    assert.equal(c[1]!.target_union, "create_revision", "absent() sends its zero create_revision (a oneof)");
  });

  it("refuses what the commit path never sends (a nested txn, a sorted range, an op with no request) instead of sending something else", () => {
    assert.throws(() => encodeTxnRequest({ compare: [], success: [{ request_txn: { compare: [], success: [], failure: [] } }], failure: [] }), /nested txn/);
    assert.throws(() => encodeTxnRequest({ compare: [], success: [{ request_range: { key: Buffer.from("k"), sort_order: "Descend" } }], failure: [] }), /sort order/);
    assert.throws(() => encodeTxnRequest({ compare: [], success: [{}], failure: [] }), /exactly one request/);
    assert.throws(() => encodeTxnRequest({ compare: [{ key: Buffer.from("k"), target: "Create", result: "Equal", create_revision: -1 }], success: [], failure: [] }), /non-negative/);
    assert.throws(() => encodeTxnRequest({ compare: [], success: [{ request_put: { key: Buffer.from("k"), lease: "18446744073709551616" } }], failure: [] }), /64 bits/);
  });

  it("decodes every TxnResponse as the etcd3 client does (property; 64-bit member ids exact)", () => {
    const u64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(String);
    const header = fc.record({ cluster_id: u64, member_id: u64, revision: rev.map(String), raft_term: rev.map(String) });
    const kv = fc.record({ key, create_revision: rev.map(String), mod_revision: rev.map(String), version: rev.map(String), value: bytes, lease: leaseId });
    const op = fc.oneof(
      fc.record({ header, kvs: fc.array(kv, { maxLength: 4 }), more: fc.boolean(), count: rev.map(String) }).map((r) => ({ response_range: r })),
      header.map((h) => ({ response_put: { header: h } })),
      fc.record({ header, deleted: rev.map(String) }).map((d) => ({ response_delete_range: { ...d, prev_kvs: [] } })),
    );
    const res = fc.record({ header, succeeded: fc.boolean(), responses: fc.array(op, { maxLength: 6 }) });
    fc.assert(
      fc.property(res, (r) => {
        const wire = txnDef.responseSerialize(r);
        const theirs = txnDef.responseDeserialize(wire) as { header: unknown; succeeded: boolean; responses: Record<string, unknown>[] };
        const ours = decodeTxnResponse(wire);
        assert.equal(ours.succeeded, theirs.succeeded);
        assert.deepEqual(plain(ours.header), plain(theirs.header));
        assert.equal(ours.responses.length, theirs.responses.length);
        ours.responses.forEach((o, i) => {
          const t = theirs.responses[i]!;
          const which = t["response"] as string;
          const mine = o as unknown as Record<string, unknown>;
          assert.deepEqual(Object.keys(mine), [which]);
          const expected = { ...(t[which] as Record<string, unknown>) };
          if (which === "response_put") delete expected["prev_kv"];
          assert.deepEqual(plain(mine[which]), plain(expected));
        });
      }),
      { numRuns: 300 },
    );
  });

  it("decodes LeaseKeepAliveResponse's TTL and StatusResponse's leader as the etcd3 client does (property; negative TTLs and 64-bit leaders exact)", () => {
    const u64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(String);
    const header = fc.record({ cluster_id: u64, member_id: u64, revision: rev.map(String), raft_term: rev.map(String) });
    const ttl = fc.oneof(fc.integer({ min: -1, max: 10_000 }), fc.bigInt({ min: -(2n ** 40n), max: 2n ** 40n }).map(Number));
    fc.assert(
      fc.property(fc.record({ header, ID: leaseId, TTL: ttl.map(String) }), (r) => {
        const theirs = keepAliveDef.responseDeserialize(keepAliveDef.responseSerialize(r)) as { TTL: string };
        assert.equal(decodeKeepAliveTtl(keepAliveDef.responseSerialize(r)), Number(theirs.TTL));
      }),
      { numRuns: 300 },
    );
    const status = fc.record({ header, version: fc.string({ maxLength: 12 }), dbSize: rev.map(String), leader: u64, raftIndex: rev.map(String), raftTerm: rev.map(String), errors: fc.array(fc.string({ maxLength: 20 }), { maxLength: 3 }) });
    fc.assert(
      fc.property(status, (r) => {
        const theirs = statusDef.responseDeserialize(statusDef.responseSerialize(r)) as { leader: string };
        assert.equal(decodeStatusLeader(statusDef.responseSerialize(r)).leader, theirs.leader);
      }),
      { numRuns: 300 },
    );
    // Fields missing from the answer (proto3 leaves zeros out) read as zero: no lease TTL, no leader.
    assert.equal(decodeKeepAliveTtl(Buffer.alloc(0)), 0);
    assert.equal(decodeStatusLeader(Buffer.alloc(0)).leader, "0");
  });

  it("refuses a truncated or corrupt response with a message, not a wrong answer", () => {
    const good = txnDef.responseSerialize({ header: { revision: "5" }, succeeded: true, responses: [{ response_range: { kvs: [{ key: Buffer.from("k"), value: Buffer.from("v") }] } }] });
    for (let cut = 1; cut < good.length; cut++) {
      try {
        const r = decodeTxnResponse(good.subarray(0, cut));
        // A cut at a field boundary is a shorter valid message: it must never invent what was not sent.
        assert.ok(r.responses.length <= 1);
      } catch (err) {
        assert.match((err as Error).message, /past the end|wire type|longer than 10 bytes/);
      }
    }
  });
});

/** True once `w` answers a read within `ms` (tried every 200 ms, each attempt bounded by 1 s). */
async function answersWithin(w: TxnWire, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const ok = await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 1000).then(
      (r) => r.succeeded,
      () => false,
    );
    if (ok) return true;
    await new Promise((r) => setTimeout(r, 200));
  }
  return false;
}

describe("txn-wire on a real cluster", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  let etcd: Etcd3;
  const wires: TxnWire[] = [];
  const wire = (url: string, max = 1 << 20): TxnWire => {
    const w = new TxnWire(url, undefined, max);
    wires.push(w);
    return w;
  };

  before(async () => {
    dc = await devCluster();
    etcd = new Etcd3({ hosts: dc.cluster.endpoints });
  });
  after(async () => {
    for (const w of wires) w.close();
    etcd?.close();
    await dc?.stop();
  });

  it("answers a guarded transaction as the etcd3 client does, in both branches", async () => {
    const w = wire(dc.cluster.endpoints[0]!);
    await etcd.put("w/epoch").value("3");
    const ok = await w.txn({ compare: [valueIs("w/epoch", "3"), absent("w/ident/a")], success: [put("w/log/1", "one"), put("w/ident/a", "1")], failure: [get("w/epoch")] }, 2000);
    assert.equal(ok.succeeded, true);
    assert.equal(ok.responses.length, 2);
    const failure = [get("w/epoch"), get("w/log/1"), range("w/", prefixEnd("w/"), 2), count("w/")];
    const guarded = { compare: [valueIs("w/epoch", "4")], success: [put("w/x", "never")], failure };
    const ours = await w.txn(guarded, 2000);
    const theirs = await etcd.kv.txn(guarded);
    assert.equal(ours.succeeded, false);
    assert.equal(ours.header.revision, theirs.header.revision);
    assert.deepEqual(
      plain(ours.responses.map((r) => r.response_range)),
      plain(theirs.responses.map((r) => ({ header: r.response_range.header, kvs: r.response_range.kvs, more: r.response_range.more, count: r.response_range.count }))),
    );
    assert.equal(ours.responses[1]!.response_range.kvs[0]!.value.toString(), "one");
    assert.equal((await etcd.get("w/x").string()), null, "the failed guard wrote nothing");
  });

  it("reports etcd's own refusals with the etcd3 client's classes: too many operations is too_large", async () => {
    const w = wire(dc.cluster.endpoints[1]!);
    const many = Array.from({ length: 200 }, (_, i) => put(`w/many/${i}`, "x"));
    const err = await w.txn({ compare: [], success: many, failure: [] }, 2000).then(
      () => assert.fail("etcd took 200 operations in one txn"),
      (e: unknown) => e,
    );
    assert.equal(classifyEtcdError(err), "too_large", String(err));
    assert.match((err as Error).message, /too many operations in txn request/);
    // The connection is still good.
    assert.equal((await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 2000)).succeeded, true);
  });

  it("refuses a response larger than its limit as too_large", async () => {
    const w = wire(dc.cluster.endpoints[1]!, 64);
    await etcd.put("w/big").value("b".repeat(500));
    const err = await w.txn({ compare: [], success: [get("w/big")], failure: [] }, 2000).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "too_large", String(err));
  });

  it("a refused connection is an outage (may retry elsewhere), at once", async () => {
    const port = await new Promise<number>((resolve) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    const w = wire(`http://127.0.0.1:${port}`);
    const t0 = Date.now();
    const err = await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 5000).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "outage", String(err));
    assert.ok(Date.now() - t0 < 4000, "refused at once, not at the deadline");
  });

  it("a frozen member (SIGSTOP) costs one deadline, an outage; after SIGCONT the next call connects again and is answered", async () => {
    const w = wire(dc.cluster.endpoints[2]!);
    assert.equal((await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 2000)).succeeded, true);
    await dc.cluster.freeze(2);
    try {
      const t0 = Date.now();
      const err = await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 300).catch((e: unknown) => e);
      const took = Date.now() - t0;
      assert.equal(classifyEtcdError(err), "outage", String(err));
      assert.match(String(err), /DEADLINE_EXCEEDED/);
      assert.ok(took >= 290 && took < 3000, `answered by the deadline: ${took} ms`);
      // Its PING goes unanswered too: the connection is dropped within a second (not reused).
      await new Promise((r) => setTimeout(r, 1500));
    } finally {
      dc.cluster.signal(2, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(w, 10_000), "the wire reconnected after the member came back");
    assert.ok(w.connects >= 2, `a new connection after the silent one was dropped (${w.connects} opened)`);
  });

  it("a killed member is an outage; after its restart the same wire is answered again", async () => {
    const w = wire(dc.cluster.endpoints[2]!);
    assert.equal((await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 2000)).succeeded, true);
    await dc.cluster.kill(2);
    const err = await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 2000).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "outage", String(err));
    await dc.cluster.restart(2);
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(w, 20_000), "the wire reconnected after the restart");
  });

  it("renews a lease (Lease/LeaseKeepAlive, one request on the stream) and reads a member's leader (Maintenance/Status) as the etcd3 client does", async () => {
    const w = wire(dc.cluster.endpoints[0]!);
    for (const url of dc.cluster.endpoints) {
      const one = new Etcd3({ hosts: url });
      try {
        assert.equal((await wire(url).status(2000)).leader, (await one.maintenance.status()).leader, `the leader ${url} knows`);
      } finally {
        one.close();
      }
    }
    const granted = await etcd.leaseClient.leaseGrant({ TTL: 30 });
    const ttl = await w.keepAlive(granted.ID, 2000);
    assert.ok(ttl > 25 && ttl <= 30, `a renewal answers the lease's TTL: ${ttl}`);
    // The renewal is real: the lease's remaining time is back near its TTL, as etcd reports it.
    const left = await etcd.leaseClient.leaseTimeToLive({ ID: granted.ID });
    assert.ok(Number(left.TTL) > 25, `etcd's remaining TTL after the renewal: ${left.TTL}`);
    await etcd.leaseClient.leaseRevoke({ ID: granted.ID });
    assert.equal(await w.keepAlive(granted.ID, 2000), 0, "a revoked lease renews to 0 (gone)");
    assert.equal(await w.keepAlive("9223372036854775000", 2000), 0, "an unknown (64-bit) lease id renews to 0");
    assert.equal(w.sent, 0, "keep-alives and status calls are not counted as transactions");
    assert.equal(w.calls, 3, "three keep-alives on this wire");
  });

  it("a frozen member answers neither keep-alives nor status: outages by the deadline, with the etcd3 client's classes", async () => {
    const w = wire(dc.cluster.endpoints[1]!);
    const granted = await etcd.leaseClient.leaseGrant({ TTL: 30 });
    assert.ok((await w.keepAlive(granted.ID, 2000)) > 0);
    await dc.cluster.freeze(1);
    try {
      for (const call of [() => w.status(300), () => w.keepAlive(granted.ID, 300)]) {
        const t0 = Date.now();
        const err = await call().then(
          () => assert.fail("a frozen member answered"),
          (e: unknown) => e,
        );
        assert.equal(classifyEtcdError(err), "outage", String(err));
        assert.ok(Date.now() - t0 < 3000, `answered by the deadline: ${Date.now() - t0} ms`);
      }
    } finally {
      dc.cluster.signal(1, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(w, 10_000), "the wire answers again after SIGCONT");
    assert.ok((await w.keepAlive(granted.ID, 2000)) > 0);
    await etcd.leaseClient.leaseRevoke({ ID: granted.ID });
  });

  it("a request it cannot encode is a rejected promise, never a synchronous throw, and nothing is sent", async () => {
    const w = wire(dc.cluster.endpoints[0]!);
    const p = w.txn({ compare: [], success: [{ request_txn: { compare: [], success: [], failure: [] } }], failure: [] }, 2000);
    await assert.rejects(p, /nested txn/);
    assert.equal(w.sent, 0);
  });

  it("after close, calls are refused as closed and nothing is sent", async () => {
    const w = wire(dc.cluster.endpoints[0]!);
    await w.txn({ compare: [], success: [get("w/epoch")], failure: [] }, 2000);
    w.close();
    const err = await w.txn({ compare: [], success: [put("w/after-close", "x")], failure: [] }, 2000).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "closed", String(err));
    assert.equal(await etcd.get("w/after-close").string(), null);
  });

  it("commits of the adapter go on it by default, and through the etcd3 client with commitClient etcd3; both logs read the same", async () => {
    const dirs = tempDir("wire-adapter");
    const own = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/a` });
    const lib = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/b`, commitClient: "etcd3" });
    try {
      for (const [storage, name] of [[own, "via-http2"], [lib, "via-etcd3"]] as const) {
        const db = await storage.open(name);
        for (let i = 0; i < 5; i++) await db.commit([ev(`${name}-${i}a`), ev(`${name}-${i}b`)]);
        await assert.rejects(db.commit([ev(`${name}-0a`)]), /identity in the log/);
        const s = db.stats() as ReplicatedStats;
        assert.ok(s.commitTxns >= 5);
        if (name === "via-http2") assert.ok(s.commitTxnsHttp2 >= 5, `http2 attempts: ${s.commitTxnsHttp2}`);
        else assert.equal(s.commitTxnsHttp2, 0);
        await db.close();
      }
      const fresh = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/c` });
      try {
        for (const name of ["via-http2", "via-etcd3"]) {
          const log = await (await fresh.reader(name)).read();
          assert.deepEqual(
            log.map((e) => e.identity),
            Array.from({ length: 5 }, (_, i) => [`${name}-${i}a`, `${name}-${i}b`]).flat(),
          );
        }
      } finally {
        await fresh.close();
      }
    } finally {
      await own.close();
      await lib.close();
      dirs.remove();
    }
  });

  it("the adapter renews its ownership lease and polls the members on it by default (through etcd3 with commitClient etcd3), and the lease holds", async () => {
    const dirs = tempDir("wire-renew");
    const own = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/a`, livenessMs: 3000, healthIntervalMs: 200 });
    const lib = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: `${dirs.dir}/b`, livenessMs: 3000, healthIntervalMs: 200, commitClient: "etcd3" });
    try {
      const a = await own.open("renew-http2");
      const b = await lib.open("renew-etcd3");
      // Two lease lengths: a lease that was not renewed would be lost by now.
      await new Promise((r) => setTimeout(r, 6500));
      const sa = a.stats() as ReplicatedStats;
      const sb = b.stats() as ReplicatedStats;
      assert.ok(sa.leaseRenewalsHttp2 >= 6, `renewals on txn-wire: ${sa.leaseRenewalsHttp2}`);
      assert.ok(sa.healthPollsHttp2 >= 10, `member polls on txn-wire: ${sa.healthPollsHttp2}`);
      assert.equal(sa.quorumHeld, true);
      assert.equal(sa.membersReachable, 3);
      assert.equal(sb.leaseRenewalsHttp2, 0);
      assert.equal(sb.healthPollsHttp2, 0);
      assert.equal(sb.membersReachable, 3);
      // Both still own their database: a commit is accepted.
      await a.commit([ev("renew-a")]);
      await b.commit([ev("renew-b")]);
      await a.close();
      await b.close();
      // A closed handle renews no more (its lease was released); the storage keeps polling members.
      const atClose = a.stats() as ReplicatedStats;
      await new Promise((r) => setTimeout(r, 1500));
      const later = a.stats() as ReplicatedStats;
      assert.equal(later.leaseRenewalsHttp2, atClose.leaseRenewalsHttp2, "renewals went on after close()");
      assert.ok(later.healthPollsHttp2 > atClose.healthPollsHttp2, "the storage's member polls stopped with the handle");
    } finally {
      await own.close();
      await lib.close();
      dirs.remove();
    }
  });

  it("the owner lease's keep-alive stream (the etcd3 client's own loop, lease.ts) lives as long as the lease: no per-attempt deadline cuts it", async () => {
    // Until December 5 every leaseKeepAlive stream got the one-shot keep-alive's 1 s deadline, so
    // this loop's stream was cut every second and reopened 100 ms later (a new connection each time
    // once nothing else used the member's client), and etcd3 reported a failed keep-alive each time.
    const dirs = tempDir("wire-owner-lease");
    const storage = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: dirs.dir, leaseMs: 3000 });
    try {
      const held = await storage.leases!.acquire("owner-stream", { host: "h", pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" });
      assert.ok(held, "the lease is free");
      // The etcd3 Lease behind it (a private field: what is observed is the library's own loop).
      const lease = (held as unknown as { lease: import("etcd3").Lease }).lease;
      let failed = 0;
      let renewed = 0;
      lease.on("keepaliveFailed", () => failed++);
      lease.on("keepaliveSucceeded", () => renewed++);
      await new Promise((r) => setTimeout(r, 4500));
      assert.equal(failed, 0, "keep-alives failed (the stream was cut)");
      assert.ok(renewed >= 3, `the loop renewed every third of the lease: ${renewed} in 4.5 s`);
      await held.release();
    } finally {
      await storage.close();
      dirs.remove();
    }
  });

  it("refuses an unknown commitClient with a message naming the option", () => {
    assert.throws(() => createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: "/tmp/x", commitClient: "grpc" as never }), /commitClient/);
  });
});

exitAfterTests("test/replicated/txn-wire.test.ts");
