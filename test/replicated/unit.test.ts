/**
 * Unit tests of the replicated adapter that need no cluster: options (validation and environment),
 * the member check, and the one etcd error mapping function.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { EtcdAuthenticationFailedError, EtcdLeaseInvalidError, EtcdPermissionDeniedError, GRPCDeadlineExceededError, GRPCUnavailableError } from "etcd3";
import type { Context } from "../../storage-adapters/replicated/context.js";
import { classifyEtcdError, mapEtcdError } from "../../storage-adapters/replicated/etcd-errors.js";
import { allHandedOver, checkMembers, claim, dropGone, leasesToHandOver } from "../../storage-adapters/replicated/open.js";
import { resolveOptions } from "../../storage-adapters/replicated/options.js";
import { orphanSegments } from "../../storage-adapters/replicated/snapshots.js";
import { fencedBy, fencedByEvent, fencer } from "../../storage-adapters/replicated/ops.js";
import { ReplicatedLease, parseLeaseRef, parseOwner } from "../../storage-adapters/replicated/liveness.js";
import { keysOf } from "../../storage-adapters/replicated/layout.js";
import { Backoff, FIRST_PAUSE_MS, MAX_PAUSE_MS } from "../../storage-adapters/replicated/retry.js";
import { performance } from "node:perf_hooks";
import { hostname } from "node:os";
import { captureLogger } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

describe("replicated options", () => {
  it("takes endpoints and credentials from the environment, with defaults", () => {
    const o = resolveOptions({ dataDir: "/d" }, { CAIRN_ETCD_ENDPOINTS: "http://a:2379, http://b:2379", CAIRN_ETCD_USER: "u", CAIRN_ETCD_PASSWORD: "p" });
    assert.deepEqual(o.endpoints, ["http://a:2379", "http://b:2379"]);
    assert.equal(o.username, "u");
    assert.equal(o.onOutage, "wait");
    assert.equal(o.backlogLimit, 1000);
    assert.equal(o.allowSmallCluster, false);
    assert.equal(o.groupDelayMs, 2, "group commit waits 2 ms by default");
  });

  it("refuses bad options with a ConfigError naming the option, never echoing a password", () => {
    const check = (options: object, env: Record<string, string>, pattern: RegExp) =>
      assert.throws(
        () => resolveOptions(options as Parameters<typeof resolveOptions>[0], env),
        (err: unknown) => {
          assert.equal((err as { code?: string }).code, "config");
          assert.match((err as Error).message, pattern);
          assert.ok(!(err as Error).message.includes("hunter2"));
          return true;
        },
      );
    check({ dataDir: "/d" }, {}, /option "endpoints" is required \(or set CAIRN_ETCD_ENDPOINTS/);
    check({ dataDir: "/d", endpoints: ["a:2379"] }, {}, /option "endpoints.0"/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], onOutage: "drop" }, {}, /option "onOutage"/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], backlogLimit: 0 }, {}, /option "backlogLimit"/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], password: "hunter2" }, {}, /"username" and "password" go together/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], bogus: 1 }, {}, /replicated storage option/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], groupDelayMs: 101 }, {}, /option "groupDelayMs" must be at most 100 \(ms\)/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], groupDelayMs: -1 }, {}, /option "groupDelayMs"/);
    check({ dataDir: "/d", endpoints: ["http://a:1"], groupDelayMs: 1.5 }, {}, /option "groupDelayMs"/);
  });
});

function fakeContext(
  members: { name: string; isLearner: boolean }[],
  allowSmallCluster = false,
  zones: Record<string, string> = { m1: "eu-1a" },
): Context & { logger: ReturnType<typeof captureLogger> } {
  const logger = captureLogger();
  const client = { cluster: { memberList: async () => ({ members: members.map((m) => ({ ...m, ID: m.name, peerURLs: [], clientURLs: [`http://${m.name}:2379`] })) }) } };
  return {
    logger,
    log: logger,
    opts: resolveOptions({ endpoints: ["http://127.0.0.1:1"], dataDir: "/d", allowSmallCluster, zones }),
    client,
    // Calls go through the router (one client per member); the fake has one.
    call: <T>(op: (c: typeof client) => Promise<T>) => op(client),
    fail: (err: unknown) => err,
  } as unknown as Context & { logger: ReturnType<typeof captureLogger> };
}

describe("member check", () => {
  it("refuses fewer than three voting members, naming how many (learners do not count)", async () => {
    await assert.rejects(checkMembers(fakeContext([{ name: "m1", isLearner: false }, { name: "m2", isLearner: false }, { name: "m3", isLearner: true }])), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "config");
      assert.match((err as Error).message, /has 2 voting members \(and 1 learner, which do not count\)/);
      assert.match((err as Error).message, /allowSmallCluster/);
      return true;
    });
  });

  it("accepts a small cluster with allowSmallCluster, and maps members to zones", async () => {
    const members = await checkMembers(fakeContext([{ name: "m1", isLearner: false }], true));
    assert.deepEqual(members.map((m) => [m.name, m.zone]), [["m1", "eu-1a"]]);
  });

  it("warns when voting members share a zone", async () => {
    const ctx = fakeContext([{ name: "m1", isLearner: false }, { name: "m2", isLearner: false }, { name: "m3", isLearner: false }], false, { m1: "z1", m2: "z1", m3: "z2" });
    await checkMembers(ctx);
    assert.ok(ctx.logger.lines.some((l) => l.includes("share a zone")));
  });
});

describe("etcd error mapping", () => {
  const ctx = { op: "open", db: "beta", user: "alice", endpoints: ["http://e:2379"] };
  it("permission denied names the user, the database and the prefix to grant", () => {
    const e = mapEtcdError(new EtcdPermissionDeniedError("etcdserver: permission denied"), ctx);
    assert.equal(e.code, "config");
    assert.match(e.message, /etcd user "alice" may not open database "beta": its etcd role does not grant readwrite on the key prefix cairn\/db\/beta\//);
  });
  it("bad credentials, outages and size limits", () => {
    assert.equal(mapEtcdError(new EtcdAuthenticationFailedError("x"), ctx).code, "config");
    const down = mapEtcdError(new GRPCUnavailableError("14 UNAVAILABLE: No connection established"), ctx);
    assert.equal(down.code, "unavailable");
    assert.equal(down.retryable, true);
    assert.equal(classifyEtcdError(new GRPCDeadlineExceededError("deadline")), "outage");
    assert.equal(classifyEtcdError(Object.assign(new Error("open"), { isBrokenCircuitError: true })), "outage");
    const big = mapEtcdError(new Error("etcdserver: request is too large"), ctx);
    assert.equal(big.code, "rejected");
    assert.equal((big as { reason?: string }).reason, "too_large");
    assert.equal(mapEtcdError(new Error("something else"), ctx).code, "internal");
  });
});

// Last, so that it runs after every other `after` hook of this file.
describe("the adapter's retry pause", () => {
  it("starts at 100 ms, doubles, and stays at 500 ms; each step is a new value (the etcd3 client keeps the first for its watch reconnects)", () => {
    const steps: number[] = [];
    let b = new Backoff();
    for (let i = 0; i < 6; i++) {
      steps.push(b.duration);
      b = b.next();
    }
    assert.deepEqual(steps, [FIRST_PAUSE_MS, 200, 400, MAX_PAUSE_MS, MAX_PAUSE_MS, MAX_PAUSE_MS]);
    const first = new Backoff();
    first.next();
    assert.equal(first.duration, FIRST_PAUSE_MS);
  });
});

describe("who fenced an owner (the epoch key's revision, not its number)", () => {
  const kv = (value: string, mod: string) => ({ key: Buffer.from("k"), value: Buffer.from(value), mod_revision: mod, create_revision: "1", version: "1", lease: "0" });
  it("a read of the epoch key: the owner's claim, another claim, the key gone, the key written again with the owner's own number", () => {
    assert.equal(fencer({ epoch: 1, revision: "40" }, 1, "40"), null);
    assert.deepEqual(fencer({ epoch: 2, revision: "55" }, 1, "40"), { epoch: 2 });
    assert.deepEqual(fencer({ epoch: null, revision: null }, 1, "40"), { epoch: null });
    assert.deepEqual(fencer({ epoch: 1, revision: "55" }, 1, "40"), { epoch: null }, "a database created again at epoch 1 fences an old owner of epoch 1");
    assert.deepEqual(fencedBy([{ response_range: { kvs: [kv("1", "55")] } }] as never, 0, 1, "40"), { epoch: null });
    assert.equal(fencedBy([{ response_range: { kvs: [kv("1", "40")] } }] as never, 0, 1, "40"), null);
    assert.deepEqual(fencedBy([{ response_range: { kvs: [] } }] as never, 0, 1, "40"), { epoch: null });
  });

  it("a watch event: the claim itself or older (a moved watch's member catching up) fences nobody; any write after it fences", () => {
    assert.equal(fencedByEvent("put", kv("1", "40"), 1, "40"), null, "the owner's own claim, delivered late");
    assert.equal(fencedByEvent("put", kv("7", "12"), 1, "40"), null, "an older claim");
    assert.equal(fencedByEvent("delete", kv("", "39"), 1, "40"), null, "an older deletion");
    assert.deepEqual(fencedByEvent("put", kv("2", "41"), 1, "40"), { epoch: 2 });
    assert.deepEqual(fencedByEvent("put", kv("1", "41"), 1, "40"), { epoch: null }, "written again with the owner's number");
    assert.deepEqual(fencedByEvent("delete", kv("", "41"), 1, "40"), { epoch: null });
  });
});

describe("the owner's wait for earlier leases", () => {
  it("never waits for its own lease (a claim resent after an attempt that landed reads its own record)", async () => {
    // A context that answers nothing: waiting for any lease would poll it forever.
    const calls: string[] = [];
    const ctx = {
      log: captureLogger(),
      txn: () => {
        calls.push("txn");
        return Promise.reject(new Error("no cluster"));
      },
      call: () => {
        calls.push("call");
        return Promise.reject(new Error("no cluster"));
      },
    } as unknown as Context;
    const lease = new ReplicatedLease(ctx, "own", keysOf("own"), 2, "10", "7587", 3000, [{ lease: "7587", host: hostname(), pid: process.pid }], performance.now());
    const outcome = await Promise.race([lease.previousGone().then(() => "done"), new Promise((r) => setTimeout(() => r("still waiting after 5 s"), 5000).unref())]);
    assert.equal(outcome, "done");
    assert.ok(!calls.includes("call"), "no earlier lease was polled");
  });

  /**
   * A context whose cluster answers LeaseTimeToLive from `ttls` (in turn, the last one repeated),
   * refuses a put attached to a lease in `goneLeases` as etcd does, answers nothing when `silent`,
   * and records what it is asked.
   */
  const fakeCluster = (ttls: string[], goneLeases: string[] = [], silent = false) => {
    const asked: { revokes: string[]; puts: { key: string; lease: string; value: string }[]; ttlQueries: number } = { revokes: [], puts: [], ttlQueries: 0 };
    const client = {
      leaseClient: {
        leaseTimeToLive: () => {
          asked.ttlQueries++;
          return Promise.resolve({ TTL: ttls.length > 1 ? ttls.shift()! : ttls[0]! });
        },
        leaseRevoke: (req: { ID: string }) => {
          asked.revokes.push(String(req.ID));
          return Promise.resolve({});
        },
      },
    };
    const call = <T>(op: (c: typeof client) => Promise<T>): Promise<T> => op(client);
    const ctx = {
      log: captureLogger(),
      opts: { commitTimeoutMs: 5000 },
      router: { call },
      call,
      txn: (_compare: unknown, success: { request_put?: { key: Buffer; value: Buffer; lease: string } }[]) => {
        if (silent) return Promise.reject(new GRPCUnavailableError("no answer"));
        const putOp = success.find((op) => op.request_put !== undefined)?.request_put;
        if (putOp !== undefined && goneLeases.includes(putOp.lease)) return Promise.reject(new EtcdLeaseInvalidError("etcdserver: requested lease not found"));
        if (putOp !== undefined) asked.puts.push({ key: putOp.key.toString(), lease: putOp.lease, value: putOp.value.toString() });
        return Promise.resolve({ succeeded: true, responses: [] });
      },
    } as unknown as Context;
    return { ctx, asked };
  };
  const earlier = { lease: "41", host: "another-host", pid: 1 };
  const earlier2 = { lease: "42", host: "another-host", pid: 2 };

  it("a lease etcd reports with TTL 0 (under a second left: etcd rounds down) is still waited for; -1 is gone", async () => {
    const { ctx, asked } = fakeCluster(["0", "0", "-1"]);
    const lease = new ReplicatedLease(ctx, "zero", keysOf("zero"), 2, "10", "7587", 3000, [earlier], performance.now());
    await lease.previousGone();
    assert.equal(asked.ttlQueries, 3, "polled until etcd said -1");
  });

  it("a close before the earlier leases were seen gone hands each one over to an entry attached to that very lease (skipping one already gone), then revokes its own", async () => {
    const { ctx, asked } = fakeCluster(["5"], ["42"]);
    const lease = new ReplicatedLease(ctx, "hand", keysOf("hand"), 2, "10", "7587", 3000, [earlier2, earlier], performance.now());
    await lease.release();
    assert.deepEqual(asked.puts, [{ key: keysOf("hand").waitFor("41"), lease: "41", value: JSON.stringify(earlier) }], "lease 42 is gone: etcd refused its entry");
    assert.deepEqual(asked.revokes, ["7587"], "then its own lease is revoked");
  });

  it("a close whose hand-over goes unanswered leaves its own lease to run out, with the record naming the earlier owners", async () => {
    const { ctx, asked } = fakeCluster(["5"], [], true);
    const lease = new ReplicatedLease(ctx, "silent", keysOf("silent"), 2, "10", "7587", 3000, [earlier], performance.now());
    await lease.release();
    assert.deepEqual(asked.revokes, [], "not revoked");
  });

  it("a close after it saw every earlier lease gone hands nothing over and revokes its lease", async () => {
    const { ctx, asked } = fakeCluster(["-1"]);
    const lease = new ReplicatedLease(ctx, "gone", keysOf("gone"), 2, "10", "7587", 3000, [earlier], performance.now());
    await lease.previousGone();
    const putsBefore = asked.puts.length;
    await lease.release();
    assert.equal(asked.puts.length, putsBefore, "no hand-over");
    assert.deepEqual(asked.revokes, ["7587"]);
  });
});

describe("a claim refused because a lease it names is gone", () => {
  const ttlContext = (ttls: Record<string, string>): Context =>
    ({ call: (op: (client: unknown) => Promise<unknown>) => op({ leaseClient: { leaseTimeToLive: async ({ ID }: { ID: string }) => ({ TTL: ttls[ID] ?? "-1" }) } }) }) as unknown as Context;
  const ref = (lease: string) => ({ lease, host: "h", pid: 1 });

  it("names its own lease when that is gone (the caller grants a new one), and drops nothing", async () => {
    const gone = new Set<string>();
    assert.equal(await dropGone(ttlContext({ "7": "-1", "41": "-1" }), "7", [ref("41")], gone), "own");
    assert.deepEqual([...gone], []);
  });

  it("drops each earlier lease etcd reports gone (TTL -1), keeps those with time left (TTL 0 included)", async () => {
    const gone = new Set<string>();
    assert.equal(await dropGone(ttlContext({ "7": "3", "41": "-1", "42": "0", "43": "12" }), "7", [ref("41"), ref("42"), ref("43")], gone), "earlier");
    assert.deepEqual([...gone], ["41"]);
  });

  it("a claim puts entries only for leases without one, at most 120; past that (or with one missing) the hand-over after the claim runs", () => {
    const many = Array.from({ length: 130 }, (_, i) => ref(String(1000 + i)));
    const handed = leasesToHandOver(many, new Set(["1000", "1001"]));
    assert.equal(handed.length, 120, "etcd's 128 operations, 8 kept for the claim's own");
    assert.equal(handed[0]!.lease, "1002", "leases already named by an entry are not put again");
    assert.equal(allHandedOver(many, handed, ["1000", "1001"]), false, "8 leases left: handOverNow after the claim");
    assert.equal(allHandedOver(many, handed, ["1000", "1001", ...many.slice(122).map((r) => r.lease)]), true, "the rest read as entries by the claim");
    const few = [ref("41"), ref("42")];
    assert.equal(allHandedOver(few, leasesToHandOver(few, new Set()), []), true);
    assert.equal(allHandedOver(few, [ref("41")], []), false);
  });

  it("says none when no lease is reported gone yet (the member asked lags the one that refused)", async () => {
    const gone = new Set<string>();
    assert.equal(await dropGone(ttlContext({ "7": "3", "41": "2" }), "7", [ref("41")], gone), "none");
    assert.deepEqual([...gone], []);
  });

  /**
   * A cluster that answers the claim's reads (no owner record, no hand-over entries) and runs each
   * claim transaction through `claimTxn`; TTL queries answer from `ttls` (as ttlContext).
   */
  const claimContext = (ttls: Record<string, string>, claimTxn: (ops: readonly { request_put?: { key: Buffer } }[]) => object) => {
    const seenClaims: string[][] = [];
    const ctx = {
      opts: { livenessMs: 10_000 },
      call: (op: (client: unknown) => Promise<unknown>) => op({ leaseClient: { leaseTimeToLive: async ({ ID }: { ID: string }) => ({ TTL: ttls[ID] ?? "-1" }) } }),
      txn: async (compares: readonly unknown[], ops: readonly { request_put?: { key: Buffer } }[]) => {
        const empty = { header: { revision: "9" }, succeeded: true, responses: ops.map(() => ({ response_range: { kvs: [] } })) };
        if (compares.length === 0) return empty; // the peek at the owner record and the entries
        seenClaims.push(ops.flatMap((o) => (o.request_put === undefined ? [] : [o.request_put.key.toString("utf8")])));
        return claimTxn(ops);
      },
    } as unknown as Context;
    return { ctx, seenClaims };
  };
  const first = { epoch: 3, epochRevision: "5", head: 10, revision: "9", uid: null };
  const claimWith = (ctx: Context, gone: Set<string>, earlier: string[]) =>
    claim(ctx, keysOf("db"), "db", false, "7", first, null, new Map(earlier.map((l) => [l, ref(l)])), new Set(["7"]), gone);
  const notFound = () => {
    throw new Error("etcdserver: requested lease not found");
  };

  it("gives up with StorageUnavailable after 16 refusals no member explains, pausing (the adapter's retry pause) before each new claim, having claimed nothing", async () => {
    const { ctx, seenClaims } = claimContext({ "7": "8", "41": "8" }, notFound);
    const started = performance.now();
    await assert.rejects(claimWith(ctx, new Set(), ["41"]), (err: unknown) => {
      assert.equal((err as { code?: string }).code, "unavailable");
      assert.match((err as Error).message, /etcd refused its claim 17 times because a lease it names had run out .* nothing was claimed\. Retry\./);
      return true;
    });
    assert.equal(seenClaims.length, 17, "16 claims again after the first refusal, then the open gives up");
    assert.ok(performance.now() - started >= 16 * FIRST_PAUSE_MS - 80, "a pause before each claim again (a lagging member gets time to catch up)");
    assert.ok(seenClaims.every((keys) => keys.includes(keysOf("db").waitFor("41"))), "the live earlier lease is handed over in every claim");
  });

  it("lets its own lease's refusal through to the caller (which grants a new lease) at once", async () => {
    const { ctx, seenClaims } = claimContext({ "7": "-1", "41": "8" }, notFound);
    await assert.rejects(claimWith(ctx, new Set(), ["41"]), /requested lease not found/);
    assert.equal(seenClaims.length, 1);
  });

  it("drops an earlier lease reported gone and claims again without its entry, and waits only for the live one", async () => {
    let n = 0;
    const { ctx, seenClaims } = claimContext({ "7": "8", "41": "-1", "42": "8" }, (ops) => {
      if (++n === 1) notFound();
      return { header: { revision: "12" }, succeeded: true, responses: ops.map(() => ({ response_range: { kvs: [] } })) };
    });
    const gone = new Set<string>();
    const out = await claimWith(ctx, gone, ["41", "42"]);
    const keys = keysOf("db");
    assert.deepEqual(seenClaims.map((k) => k.filter((key) => key.startsWith(keys.waitFor("")))), [[keys.waitFor("41"), keys.waitFor("42")], [keys.waitFor("42")]]);
    assert.deepEqual([...gone], ["41"]);
    assert.ok(!("restart" in out));
    assert.equal(out.epoch, 4);
    assert.deepEqual(out.waitFor.map((r) => r.lease), ["42"]);
    assert.equal(out.handedOver, true, "the claim itself put the only live earlier lease's entry");
  });
});

describe("owner records and hand-over entries read from etcd", () => {
  it("keeps only well-formed leases (a decimal id, a host, a pid): anything else is neither waited for nor handed over", () => {
    const good = { lease: "41", host: "h", pid: 2 };
    const rec = parseOwner(JSON.stringify({ epoch: 3, lease: "7", host: "h", pid: 1, ttlMs: 3000, pending: [good, { lease: 42, host: "h", pid: 2 }, { host: "h", pid: 2 }, null, "43", { lease: "x", host: "h", pid: 2 }] }));
    assert.deepEqual(rec?.pending, [good]);
    assert.equal(parseOwner(JSON.stringify({ epoch: 3, lease: "7", host: "h", pid: 1, ttlMs: 3000, pending: "41" }))?.pending.length, 0);
    assert.equal(parseOwner("not json"), null);
    assert.deepEqual(parseLeaseRef(JSON.stringify(good)), good);
    for (const bad of ["{}", "null", "[]", "41", JSON.stringify({ lease: "", host: "h", pid: 1 }), JSON.stringify({ lease: "41", host: "h" })]) assert.equal(parseLeaseRef(bad), null, bad);
  });
});

describe("orphan identity segments", () => {
  const seg = (from: number, to: number, part = 0) => `${String(from).padStart(16, "0")}/${String(to).padStart(16, "0")}/${String(part).padStart(6, "0")}`;
  const legacy = (from: number, part = 0) => `${String(from).padStart(16, "0")}/${String(part).padStart(6, "0")}`;

  it("deletes a lost race's segments that start at or before the cut, every part of them; keeps the chain, and what starts after the cut", () => {
    const chain = [seg(1, 50), seg(51, 100), seg(51, 100, 1)];
    const lost = [seg(1, 70), seg(1, 70, 1), seg(51, 120)];
    const pending = [seg(101, 130)];
    assert.deepEqual(orphanSegments([...chain, ...lost, ...pending], 100).sort(), [...lost].sort());
  });

  it("keeps every segment on some chain to the cut: another chain over the same seqs holds the same identities", () => {
    assert.deepEqual(orphanSegments([seg(1, 50), seg(51, 100), seg(1, 100), seg(51, 80)], 100), [seg(51, 80)]);
  });

  it("deletes nothing when the segments do not chain from 1 to the cut: a missing link, segments in the earlier form, a malformed key", () => {
    assert.deepEqual(orphanSegments([seg(1, 50), seg(1, 70), seg(101, 120)], 120), [], "51..100 missing");
    assert.deepEqual(orphanSegments([legacy(1), seg(51, 100), seg(1, 70)], 100), [], "the chain starts with a segment in the earlier form");
    assert.deepEqual(orphanSegments([seg(1, 100), seg(1, 70), seg(80, 60)], 100), [], "a segment that ends before it starts");
    assert.deepEqual(orphanSegments([], 100), []);
  });

  it("keeps segments in the earlier form when the chain is whole without them", () => {
    assert.deepEqual(orphanSegments([legacy(1), seg(1, 50), seg(51, 100), seg(1, 60)], 100), [seg(1, 60)]);
  });
});

exitAfterTests("test/replicated/unit.test.ts");
