/**
 * The adapter's etcd client (client.ts: the etcd3 package on grpc-js, one client per member, configured
 * as the router uses it), on a real three-member cluster: both branches of a guarded transaction,
 * etcd's own refusals and a response over the receive limit classified as the contract's errors, a
 * refused connection, a frozen member (SIGSTOP) answered by the attempt deadline and a killed member,
 * both answered again once back, the require-leader metadata (a member without a leader refuses at
 * once), lease keep-alives and member status, lease ids above 2^53, a member stopped (SIGTERM, GOAWAY)
 * under 150 transactions in flight, and close. Then, without a cluster, a peer that floods PING or
 * SETTINGS frames and never reads: the client's memory stays flat and the call fails with a storage
 * error, not a hang.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import net from "node:net";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import { clientOptions, closeEtcdClient, keepAliveOnce, memberClient } from "../../storage-adapters/replicated/client.js";
import { classifyEtcdError } from "../../storage-adapters/replicated/etcd-errors.js";
import { absent, count, get, prefixEnd, put, putWithLease, range, valueIs } from "../../storage-adapters/replicated/ops.js";
import { createReplicatedStorage } from "../../storage-adapters/replicated/index.js";
import { devCluster, eventually, tempDir, untilQuorum } from "./helpers.js";
import { exitAfterTests } from "../support/exit.js";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A read on `client` answered within `ms` (tried every 200 ms, each attempt bounded by its client's deadline). */
async function answersWithin(client: Etcd3, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const ok = await client.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] }).then(
      (r) => r.succeeded,
      () => false,
    );
    if (ok) return true;
    await sleep(200);
  }
  return false;
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

describe("the etcd client on a real cluster", () => {
  let dc: Awaited<ReturnType<typeof devCluster>>;
  let admin: Etcd3;
  const clients: Etcd3[] = [];
  /** A client of member `url` as the router makes it (require-leader, deadline `attemptMs`). */
  const member = (url: string, attemptMs = 2000, options = clientOptions({})): Etcd3 => {
    const c = memberClient(url, options, attemptMs);
    clients.push(c);
    return c;
  };

  before(async () => {
    dc = await devCluster();
    admin = new Etcd3({ hosts: dc.cluster.endpoints, grpcOptions: { "grpc.max_receive_message_length": 64 << 20 } });
  });
  after(async () => {
    for (let i = 0; i < 3; i++) dc?.cluster.signal(i, "SIGCONT");
    for (const c of clients) closeEtcdClient(c);
    admin?.close();
    await dc?.stop();
  });

  it("answers a guarded transaction in both branches; etcd's refusal of too many operations, and an answer over the receive limit, are too_large", async () => {
    const c = member(dc.cluster.endpoints[0]!);
    await admin.put("c/epoch").value("3");
    const ok = await c.kv.txn({ compare: [valueIs("c/epoch", "3"), absent("c/ident/a")], success: [put("c/log/1", "one"), put("c/ident/a", "1")], failure: [get("c/epoch")] });
    assert.equal(ok.succeeded, true);
    const refused = await c.kv.txn({ compare: [valueIs("c/epoch", "4")], success: [put("c/x", "never")], failure: [get("c/epoch"), get("c/log/1"), range("c/", prefixEnd("c/"), 2), count("c/")] });
    assert.equal(refused.succeeded, false);
    assert.equal(refused.responses[0]!.response_range.kvs[0]!.value.toString(), "3");
    assert.equal(refused.responses[1]!.response_range.kvs[0]!.value.toString(), "one");
    assert.equal(refused.responses[2]!.response_range.kvs.length, 2);
    assert.equal(refused.responses[3]!.response_range.count, "3", "c/epoch, c/ident/a, c/log/1");
    assert.equal(await admin.get("c/x").string(), null, "the failed guard wrote nothing");

    const many = Array.from({ length: 200 }, (_, i) => put(`c/many/${i}`, "x"));
    const tooMany = await c.kv.txn({ compare: [], success: many, failure: [] }).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(tooMany), "too_large", String(tooMany));
    assert.equal((await c.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] })).succeeded, true, "the connection still serves the next call");

    const base = clientOptions({});
    const small = member(dc.cluster.endpoints[1]!, 2000, { ...base, grpcOptions: { ...base.grpcOptions, "grpc.max_receive_message_length": 64 } });
    await admin.put("c/big").value("b".repeat(500));
    const big = await small.kv.txn({ compare: [], success: [get("c/big")], failure: [] }).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(big), "too_large", String(big));
  });

  it("a refused connection is an outage (the router may go elsewhere)", async () => {
    const c = member(`http://127.0.0.1:${await freePort()}`, 5000);
    const err = await c.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] }).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "outage", String(err));
  });

  it("a frozen member (SIGSTOP) costs one attempt deadline, an outage; after SIGCONT the same client is answered again", async () => {
    const c = member(dc.cluster.endpoints[2]!, 300);
    assert.ok(await answersWithin(c, 10_000));
    await dc.cluster.freeze(2);
    try {
      const err = await c.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] }).catch((e: unknown) => e);
      assert.equal(classifyEtcdError(err), "outage", String(err));
      assert.match(String(err), /DEADLINE_EXCEEDED|Deadline/i);
    } finally {
      dc.cluster.signal(2, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(c, 20_000), "the client is answered after the member came back");
  });

  it("a killed member is an outage; after its restart the same client is answered again", async () => {
    const c = member(dc.cluster.endpoints[2]!);
    assert.ok(await answersWithin(c, 10_000));
    await dc.cluster.kill(2);
    const err = await c.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] }).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "outage", String(err));
    await dc.cluster.restart(2);
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(c, 30_000), "the client is answered after the restart");
  });

  it("require-leader: a member whose peers are frozen refuses a call at once with 'no leader' (an outage), while its status (asked without the metadata) says it has none", async () => {
    const status = memberClient(dc.cluster.endpoints[0]!, clientOptions({}, false), 1000);
    clients.push(status);
    const c = member(dc.cluster.endpoints[0]!, 30_000);
    assert.ok(await answersWithin(c, 10_000));
    await dc.cluster.freeze(1);
    await dc.cluster.freeze(2);
    try {
      // etcd's leader steps down without a quorum (check quorum); a follower never elects one.
      let leader = "unknown";
      for (let t0 = Date.now(); leader !== "0"; await sleep(100)) {
        if (Date.now() - t0 > 30_000) assert.fail(`member 0 still reports a leader (${leader}) 30 s after its peers were frozen`);
        leader = await status.maintenance.status().then((s) => s.leader, () => "unknown");
      }
      const err = await c.kv.txn({ compare: [], success: [get("c/epoch")], failure: [] }).catch((e: unknown) => e);
      assert.equal(classifyEtcdError(err), "outage", String(err));
      assert.match(String(err), /no leader/, "refused by the require-leader check, not left to the 30 s deadline");
    } finally {
      dc.cluster.signal(1, "SIGCONT");
      dc.cluster.signal(2, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
  });

  it("renews a lease with one keep-alive (the TTL as etcd then reports it), reads each member's leader, and a revoked or unknown (64-bit) lease renews to 0", async () => {
    const c = member(dc.cluster.endpoints[0]!);
    for (const url of dc.cluster.endpoints) {
      const s = memberClient(url, clientOptions({}, false), 2000);
      clients.push(s);
      const leader = (await s.maintenance.status()).leader;
      assert.notEqual(leader, "0");
      assert.equal(leader, (await admin.maintenance.status()).leader, `the leader ${url} knows`);
    }
    const granted = await admin.leaseClient.leaseGrant({ TTL: 30 });
    const ttl = await keepAliveOnce(c, granted.ID, 2000);
    assert.ok(ttl > 25 && ttl <= 30, `a renewal answers the lease's TTL: ${ttl}`);
    assert.ok(Number((await admin.leaseClient.leaseTimeToLive({ ID: granted.ID })).TTL) > 25, "etcd's remaining TTL after the renewal");
    await admin.leaseClient.leaseRevoke({ ID: granted.ID });
    assert.equal(await keepAliveOnce(c, granted.ID, 2000), 0, "a revoked lease renews to 0 (gone)");
    assert.equal(await keepAliveOnce(c, "9223372036854775000", 2000), 0, "an unknown (64-bit) lease id renews to 0");
  });

  it("a frozen member answers neither keep-alives nor status: outages by their deadlines", async () => {
    const c = member(dc.cluster.endpoints[1]!);
    const s = memberClient(dc.cluster.endpoints[1]!, clientOptions({}, false), 300);
    clients.push(s);
    const granted = await admin.leaseClient.leaseGrant({ TTL: 30 });
    assert.ok((await keepAliveOnce(c, granted.ID, 2000)) > 0);
    await dc.cluster.freeze(1);
    try {
      for (const call of [() => s.maintenance.status(), () => keepAliveOnce(c, granted.ID, 300)]) {
        const err = await call().then(
          () => assert.fail("a frozen member answered"),
          (e: unknown) => e,
        );
        assert.equal(classifyEtcdError(err), "outage", String(err));
      }
    } finally {
      dc.cluster.signal(1, "SIGCONT");
    }
    await untilQuorum(dc.cluster);
    assert.ok(await answersWithin(c, 20_000), "answered again after SIGCONT");
    assert.ok((await keepAliveOnce(c, granted.ID, 2000)) > 0);
    await admin.leaseClient.leaseRevoke({ ID: granted.ID });
  });

  it("a put attached to a lease id above 2^53 is sent and read back exactly (etcd's lease ids are that large)", async () => {
    const { ID } = await admin.leaseClient.leaseGrant({ TTL: 60, ID: "7587862311893524239" });
    assert.equal(ID, "7587862311893524239");
    const c = member(dc.cluster.endpoints[0]!);
    assert.equal((await c.kv.txn({ compare: [], success: [putWithLease("c/leased", "v", ID)], failure: [] })).succeeded, true);
    const kv = (await c.kv.txn({ compare: [], success: [get("c/leased")], failure: [] })).responses[0]!.response_range.kvs[0];
    assert.equal(kv?.lease, ID, "the lease id as etcd holds it");
    await admin.leaseClient.leaseRevoke({ ID });
  });

  it("a member stopped with SIGTERM (GOAWAY) while 150 transactions are in flight on its client: each is answered or an outage, never a wrong answer; the client works after the restart", async () => {
    const st = await dc.cluster.status();
    const leader = st.members.findIndex((m) => m.isLeader);
    const target = [0, 1, 2].find((i) => i !== leader)!; // a follower: its requests are forwarded, so they stay in flight longer
    const c = member(dc.cluster.endpoints[target]!, 5000);
    const value = "v".repeat(8 * 1024);
    assert.ok(await answersWithin(c, 10_000));
    let done = 0;
    const results = Array.from({ length: 150 }, (_, i) =>
      c.kv
        .txn({ compare: [absent(`goaway/k${i}`)], success: [put(`goaway/k${i}`, `${i}:${value}`)], failure: [get(`goaway/k${i}`)] })
        .then((r) => ({ i, ok: true as const, r }), (err: unknown) => ({ i, ok: false as const, err }))
        .finally(() => done++),
    );
    await eventually(() => done >= 10, "the first answers", 10_000, 1);
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
    assert.ok(answered >= 10);
    assert.ok(await answersWithin(c, 30_000), "the client is answered again after the restart");
  });

  it("after close, calls are refused as closed and nothing is sent", async () => {
    const c = memberClient(dc.cluster.endpoints[0]!, clientOptions({}), 2000);
    assert.ok(await answersWithin(c, 10_000));
    closeEtcdClient(c);
    const err = await c.kv.txn({ compare: [], success: [put("c/after-close", "x")], failure: [] }).catch((e: unknown) => e);
    assert.equal(classifyEtcdError(err), "closed", String(err));
    assert.equal(await admin.get("c/after-close").string(), null);
  });

  it("the adapter's ownership lease (3 s) holds over two lease lengths, renewed on the same client stack; the owner lease's keep-alive stream lives as long as the lease", async () => {
    const dirs = tempDir("client-renew");
    const storage = createReplicatedStorage({ endpoints: dc.cluster.endpoints, dataDir: dirs.dir, livenessMs: 3000, healthIntervalMs: 200, leaseMs: 3000 });
    try {
      const db = await storage.open("renew");
      const held = await storage.leases!.acquire("owner-stream", { host: "h", pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" });
      assert.ok(held, "the owner lease is free");
      // The etcd3 Lease behind it (a private field: what is observed is the library's own loop).
      const lease = (held as unknown as { lease: import("etcd3").Lease }).lease;
      let failed = 0;
      let renewed = 0;
      lease.on("keepaliveFailed", () => failed++);
      lease.on("keepaliveSucceeded", () => renewed++);
      await sleep(6500);
      assert.equal(db.lease!.held(), true, "the ownership lease is held after two lease lengths");
      assert.equal(db.stats().quorumHeld, true);
      assert.equal(db.stats().membersReachable, 3, "the health monitor polls every member");
      assert.deepEqual(await db.commit([{ identity: "renew-1", kind: "timer_fired", session: "s1", at: "2025-01-02T03:04:05.678Z", body: { timer_id: "t", due_at: "2025-01-02T03:04:05.678Z", late_ms: 0 } }]), { firstSeq: 1, lastSeq: 1 });
      assert.equal(failed, 0, "owner lease keep-alives failed (the stream was cut)");
      assert.ok(renewed >= 3, `the owner lease's loop renewed every third of the lease: ${renewed} in 6.5 s`);
      await held.release();
      await db.close();
    } finally {
      await storage.close();
      dirs.remove();
    }
  });
});

// --- a peer that floods control frames and never reads ----------------------------------------------

const CLIENT_SCRIPT = `
const { createReplicatedStorage } = await import(${JSON.stringify(new URL("../../storage-adapters/replicated/index.ts", import.meta.url).pathname)});
const [url, dataDir, seconds] = process.argv.slice(1);
const storage = createReplicatedStorage({ endpoints: [url], dataDir, attemptTimeoutMs: 500, commitTimeoutMs: 2000 });
const mb = (n) => Math.round(n / 1048576);
const sample = () => { const m = process.memoryUsage(); return { rss: m.rss, external: m.external + m.arrayBuffers }; };
global.gc?.();
const base = sample();
let peak = { ...base };
const timer = setInterval(() => { const m = sample(); peak = { rss: Math.max(peak.rss, m.rss), external: Math.max(peak.external, m.external) }; }, 50);
const end = Date.now() + Number(seconds) * 1000;
const outcomes = [];
while (Date.now() < end) {
  const t0 = Date.now();
  outcomes.push(await storage.list().then(() => "answered", (e) => (e.code ?? e.name) + " after " + (Date.now() - t0) + " ms"));
}
clearInterval(timer);
await storage.close();
console.log(JSON.stringify({ baseRssMiB: mb(base.rss), peakRssMiB: mb(peak.rss), baseExternalMiB: mb(base.external), peakExternalMiB: mb(peak.external), outcomes }));
process.exit(0);
`;

/** HTTP/2 frame: 9-byte header and payload. */
function frame(type: number, flags: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(0, 5);
  return Buffer.concat([h, payload]);
}
const PING = frame(0x6, 0, Buffer.alloc(8, 7));
/** A SETTINGS frame (INITIAL_WINDOW_SIZE = 65535: changes nothing, needs an ACK all the same). */
const SETTINGS = frame(0x4, 0, Buffer.from([0x00, 0x04, 0x00, 0x00, 0xff, 0xff]));

/**
 * A peer that reads the client's preface, answers with its own SETTINGS, then writes `unit` frames
 * as fast as the socket takes them (respecting back-pressure on its side) and never reads again.
 * Counts the frames written.
 */
async function floodServer(unit: Buffer): Promise<{ url: string; frames: () => number; connections: () => number; close: () => Promise<void> }> {
  const batch = Buffer.concat(Array.from({ length: 512 }, () => unit));
  let frames = 0;
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((sock) => {
    connections++;
    sockets.add(sock);
    sock.on("error", () => undefined);
    sock.on("close", () => sockets.delete(sock));
    sock.once("data", () => {
      sock.pause(); // never reads again
      sock.write(frame(0x4, 0, Buffer.alloc(0)));
      const pump = (): void => {
        while (!sock.destroyed) {
          frames += 512;
          if (!sock.write(batch)) {
            sock.once("drain", pump);
            return;
          }
        }
      };
      pump();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    frames: () => frames,
    connections: () => connections,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** Runs the client child against `url` for `seconds`; its report, or a failure when it does not end (a hang). */
function runClient(url: string, dataDir: string, seconds: number): Promise<{ baseRssMiB: number; peakRssMiB: number; baseExternalMiB: number; peakExternalMiB: number; outcomes: string[] }> {
  const c = spawn(process.execPath, ["--expose-gc", "--import", "tsx", "--input-type=module", "-e", CLIENT_SCRIPT, url, dataDir, String(seconds)], {
    cwd: new URL("../..", import.meta.url).pathname,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines: string[] = [];
  createInterface({ input: c.stdout! }).on("line", (l) => lines.push(l));
  return new Promise((resolve, reject) => {
    const guard = setTimeout(() => {
      c.kill("SIGKILL");
      reject(new Error(`the client hung: still running ${seconds + 60} s after it started`));
    }, (seconds + 60) * 1000);
    c.on("close", (code) => {
      clearTimeout(guard);
      const last = lines.at(-1);
      if (code !== 0 || last === undefined) reject(new Error(`the client ended with ${code}: ${lines.join("\n")}`));
      else resolve(JSON.parse(last) as never);
    });
  });
}

describe("a peer that floods PING or SETTINGS frames and never reads", () => {
  const dirs = tempDir("flood");
  after(() => dirs.remove());

  for (const [what, unit] of [["PING", PING], ["SETTINGS", SETTINGS]] as const) {
    it(`${what} flood: the client's memory stays flat, and each call fails as StorageUnavailable (no hang)`, async () => {
      const server = await floodServer(unit);
      try {
        const r = await runClient(server.url, `${dirs.dir}/${what}`, 8);
        process.stderr.write(`[${what} flood] ${server.frames()} frames written to ${server.connections()} connections; client ${JSON.stringify({ ...r, outcomes: [...new Set(r.outcomes)] })}\n`);
        assert.ok(server.frames() >= 100_000, `the peer flooded (${server.frames()} frames written)`);
        // node's HTTP/2 (nghttp2) ends a session whose unsent replies pile up ("Flooding was detected"):
        // each flooded connection is dropped and the next attempt connects again.
        assert.ok(server.connections() >= 2, `the flooded connection was dropped (${server.connections()} connections)`);
        assert.ok(r.outcomes.length >= 2, `calls were made and ended: ${r.outcomes.join("; ")}`);
        for (const o of r.outcomes) assert.match(o, /^unavailable after/, "each call fails as StorageUnavailable");
        assert.ok(r.peakRssMiB - r.baseRssMiB < 64, `rss grew by ${r.peakRssMiB - r.baseRssMiB} MiB`);
        assert.ok(r.peakExternalMiB - r.baseExternalMiB < 32, `external memory grew by ${r.peakExternalMiB - r.baseExternalMiB} MiB`);
      } finally {
        await server.close();
      }
    });
  }
});

exitAfterTests("test/replicated/client.test.ts");
