/**
 * The owner lease on Durable Streams (storage-adapters/durable-streams/lease.ts), against the
 * reference server: the queue cases of test/storage/lease-queue.test.ts (the oldest live waiter takes
 * a freed lease; a withdrawn, SIGKILLed or SIGSTOPped waiter drops out; `force` ignores the queue);
 * many takers racing for a free lease (exactly one holds it, by the stream's order, and every process
 * agrees); a forced takeover and a server that stops answering end the holder's lease (`onLost`); a
 * frozen holder loses it to a waiter; and generations are rolled over, so the stream read stays short
 * however long a holder renews, with a newcomer finding the current generation.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { hostname } from "node:os";
import { describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { HeldLease, OwnerInfo, Storage } from "../../src/storage/contract.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { applyLease, emptyState, type LeaseRecord } from "../../storage-adapters/durable-streams/lease-fold.js";
import { REPO } from "../../chaos/support/cli.js";
import { devServer } from "./helpers.js";

const me = (role: string): OwnerInfo => ({ host: hostname(), pid: process.pid, since: new Date().toISOString(), epoch: null, role });

/** A child process that runs `code` (with `s`, a storage on `url`), prints "ready", and waits to be killed. */
async function child(url: string, code: string): Promise<{ pid: number; freeze: () => void; kill: () => Promise<void> }> {
  const script = `
    const { createDurableStreamsStorage } = await import("./storage-adapters/durable-streams/index.ts");
    const s = createDurableStreamsStorage({ url: ${JSON.stringify(url)}, leaseMs: 2000 });
    // Another host's name: its liveness is judged by its renewals alone, never by its pid.
    const me = { host: "elsewhere", pid: process.pid, since: new Date().toISOString(), epoch: null, role: "serve" };
    ${code}
    process.stdout.write("ready\\n");
    setInterval(() => undefined, 1000);
  `;
  const c = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  c.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  await new Promise<void>((resolve, reject) => {
    c.stdout.setEncoding("utf8").on("data", (d: string) => d.includes("ready") && resolve());
    c.once("exit", (code) => reject(new Error(`the child exited ${code}: ${err.slice(-2000)}`)));
  });
  return {
    pid: c.pid!,
    freeze: () => void c.kill("SIGSTOP"),
    kill: async () => {
      if (c.exitCode !== null || c.signalCode !== null) return;
      c.kill("SIGCONT");
      const exited = new Promise((r) => c.once("exit", r));
      c.kill("SIGKILL");
      await exited;
    },
  };
}

/** Calls `attempt` until it returns non-null (hang guard only). */
async function eventually<T>(what: string, attempt: () => Promise<T | null>, limitMs = 60_000): Promise<T> {
  const end = Date.now() + limitMs;
  for (;;) {
    const got = await attempt();
    if (got !== null) return got;
    if (Date.now() > end) throw new Error(`never: ${what}`);
    await sleep(100);
  }
}

describe("owner leases on durable-streams", { timeout: 300_000 }, () => {
  const storages: Storage[] = [];
  const storage = (url: string, extra: { leaseRollRecords?: number } = {}): Storage => {
    const s = createDurableStreamsStorage({ url, leaseMs: 2000, ...extra });
    storages.push(s);
    return s;
  };

  it("a freed lease goes to the oldest waiter; a later waiter and a newcomer without a ticket wait; force ignores the queue", async () => {
    const server = await devServer("lease-queue");
    const [a, b] = [storage(server.url).leases!, storage(server.url).leases!];
    const holder = await a.acquire("q1", me("serve"));
    assert.ok(holder, "the first taker holds the lease");
    assert.equal((await b.read("q1"))?.live, true, "another process sees it live");
    const older = await b.enqueue("q1", me("serve"));
    const younger = await a.enqueue("q1", me("serve"));
    assert.equal(await b.acquire("q1", me("serve"), { ticket: older }), null, "a live holder keeps it");
    await holder.release();
    assert.equal(await a.acquire("q1", me("serve")), null, "a newcomer (a restarted worker) does not overtake the queue");
    assert.equal(await a.acquire("q1", me("serve"), { ticket: younger }), null, "the younger waiter waits for the older");
    const taken = await b.acquire("q1", me("serve"), { ticket: older });
    assert.ok(taken, "the oldest waiter takes the freed lease");
    await taken.release();
    const next = await a.acquire("q1", me("serve"), { ticket: younger });
    assert.ok(next, "then the next waiter");
    await next.release();
    const free = await a.acquire("q1", me("serve"));
    assert.ok(free, "an empty queue lets anyone take a free lease");

    const waiter = await b.enqueue("q1", me("serve"));
    const lost: string[] = [];
    free.onLost((why) => lost.push(why));
    const forced = await b.acquire("q1", me("resume"), { force: true });
    assert.ok(forced, "force takes a live lease, queue or not");
    await eventually("the forced-out holder to learn it", async () => (lost.length > 0 ? true : null));
    assert.match(lost[0]!, /another process took the lease over/);
    assert.equal((await a.read("q1"))?.owner.role, "resume");
    await forced.release();
    await waiter.withdraw();
    await free.release();
  });

  it("a waiter that withdraws, or whose process is SIGKILLed or SIGSTOPped, drops out of the queue", async () => {
    const server = await devServer("lease-drop");
    const [a, b] = [storage(server.url).leases!, storage(server.url).leases!];
    const withdrawn = await b.enqueue("q2", me("serve"));
    const mine = await a.enqueue("q2", me("serve"));
    assert.equal(await a.acquire("q2", me("serve"), { ticket: mine }), null);
    await withdrawn.withdraw();
    const held = await a.acquire("q2", me("serve"), { ticket: mine });
    assert.ok(held, "the withdrawn waiter no longer goes first");
    await held.release();

    for (const [db, end] of [
      ["q3", "kill"],
      ["q5", "freeze"],
    ] as const) {
      const queued = await child(server.url, `await s.leases.enqueue(${JSON.stringify(db)}, me);`);
      try {
        const waiting = await a.enqueue(db, me("serve"));
        assert.equal(await a.acquire(db, me("serve"), { ticket: waiting }), null, "the live child waiter goes first");
        if (end === "kill") await queued.kill();
        else queued.freeze();
        const got = await eventually(`the ${end} waiter to drop out`, () => a.acquire(db, me("serve"), { ticket: waiting }));
        await got.release();
      } finally {
        await queued.kill();
      }
    }
  });

  it("many processes racing for a free lease: exactly one holds it, and every process reads the same holder", async () => {
    const server = await devServer("lease-race");
    for (let round = 0; round < 5; round++) {
      const db = `race${round}`;
      const contenders = Array.from({ length: 6 }, () => storage(server.url).leases!);
      const got = await Promise.all(contenders.map((l, i) => l.acquire(db, { ...me("serve"), pid: process.pid, role: `c${i}` })));
      const winners = got.map((h, i) => (h !== null ? i : -1)).filter((i) => i >= 0);
      assert.equal(winners.length, 1, `round ${round}: one winner (${JSON.stringify(winners)}) ${await (await fetch(`${server.url}/${db}/lease/0?offset=-1`)).text()}`);
      const views = await Promise.all(contenders.map((l) => l.read(db)));
      for (const v of views) assert.equal(v?.owner.role, `c${winners[0]}`, "every process reads the winner as the holder");
      await got[winners[0]!]!.release();
    }
  });

  it("a frozen holder stops renewing: a waiter takes the lease; a holder whose server stops answering gives it up before a reader can see it expire", async () => {
    const server = await devServer("lease-frozen");
    const a = storage(server.url).leases!;
    const holder = await child(server.url, `await s.leases.acquire("f1", me);`);
    try {
      assert.equal((await a.read("f1"))?.live, true);
      assert.equal((await storage(server.url).leases!.read("f1"))?.live, true, "a process that starts now reads the renewing holder as live");
      const ticket = await a.enqueue("f1", me("serve"));
      assert.equal(await a.acquire("f1", me("serve"), { ticket }), null, "the live holder keeps it");
      holder.freeze();
      const got = await eventually("the waiter to take the frozen holder's lease", () => a.acquire("f1", me("serve"), { ticket }));
      await got.release();
    } finally {
      await holder.kill();
    }
    const dead = await child(server.url, `await s.leases.acquire("f3", me);`);
    await dead.kill();
    const fresh = storage(server.url).leases!;
    const view = await fresh.read("f3");
    assert.equal(view?.owner.host, "elsewhere");
    assert.equal(view?.live, false, "a process that starts after the holder died sees no renewal: not live");
    const late = await eventually("the dead holder's lease to run out", () => fresh.acquire("f3", me("serve")));
    await late.release();

    const held = (await a.acquire("f2", me("serve")))!;
    const lost = new Promise<string>((r) => held.onLost(r));
    process.kill(server.pid(), "SIGSTOP");
    try {
      assert.match(await lost, /no renewal was acknowledged/);
    } finally {
      process.kill(server.pid(), "SIGCONT");
    }
    await held.release();
  });

  it("generations roll over: the stream read stays short however long a holder renews, and a newcomer finds the holder", async () => {
    const server = await devServer("lease-roll");
    const a = storage(server.url, { leaseRollRecords: 8 }).leases!;
    const held: HeldLease = (await a.acquire("r1", me("serve")))!;
    const waiter = await storage(server.url, { leaseRollRecords: 8 }).leases!.enqueue("r1", me("serve"));
    const lost: string[] = [];
    held.onLost((why) => lost.push(why));
    const generations = async (): Promise<number[]> => {
      const res = await fetch(`${server.url}/r1/leases?offset=-1`);
      return res.status === 200 ? ((await res.json()) as { g: number }[]).map((r) => r.g) : [];
    };
    await eventually("three rolls", async () => ((await generations()).length >= 3 ? true : null));
    const gens = await generations();
    const last = Math.max(...gens);
    assert.deepEqual(gens, Array.from({ length: gens.length }, (_, i) => i + 1), "one index record per roll");
    const old = await fetch(`${server.url}/r1/lease/0?offset=-1`);
    assert.equal(old.status, 404, "generations before the previous one are deleted");
    await old.arrayBuffer();
    const current = (await (await fetch(`${server.url}/r1/lease/${last}?offset=-1`)).json()) as { t: string }[];
    assert.ok(current.length <= 12, `a generation holds about its records and the move (${current.length})`);
    assert.equal(current[0]?.t, "carry");
    const newcomer = storage(server.url).leases!;
    const view = await newcomer.read("r1");
    assert.equal(view?.live, true, "a newcomer finds the holder in the current generation");
    assert.equal(await newcomer.acquire("r1", me("serve")), null, "and does not take it");
    assert.deepEqual(lost, [], "the holder kept its lease through the rolls");
    await waiter.withdraw();
    await held.release();
    assert.equal(await newcomer.read("r1"), null, "released: no holder");
    const after = await newcomer.acquire("r1", me("serve"));
    assert.ok(after, "a released lease is free at once");
    await after.release();
  });

  it("a generation closed by a roller that died before making the next: a follower makes it (with the carry), and the holder keeps its lease", async () => {
    const server = await devServer("lease-roller-died");
    const a = storage(server.url).leases!;
    const held = (await a.acquire("d1", me("serve")))!;
    const lost: string[] = [];
    held.onLost((why) => lost.push(why));
    // What a roller that died right after closing generation 0 leaves: `moved` and a closed stream, no generation 1.
    const moved = await fetch(`${server.url}/d1/lease/0`, { method: "POST", headers: { "content-type": "application/json", "stream-closed": "true" }, body: JSON.stringify({ v: 1, t: "moved", to: 1 }) });
    assert.equal(moved.status, 204);
    const b = storage(server.url).leases!;
    const view = await b.read("d1");
    assert.equal(view?.owner.pid, process.pid, "the holder is carried over to generation 1");
    assert.equal(await b.acquire("d1", me("serve")), null, "and still holds it");
    const gen1 = (await (await fetch(`${server.url}/d1/lease/1?offset=-1`)).json()) as { t: string }[];
    assert.ok(gen1.some((r) => r.t === "carry"), "generation 1 starts with the carry a follower supplied");
    // The holder renews in generation 1 and keeps its lease.
    await sleep(3000);
    assert.deepEqual(lost, []);
    assert.equal((await storage(server.url).leases!.read("d1"))?.live, true);
    await held.release();
  });

  it("the fold: records that landed before a generation's carry count after it; a second carry changes nothing", () => {
    const owner = me("serve");
    const carry: LeaseRecord = { v: 1, t: "carry", holder: { k: "h", o: owner, l: 1000 }, queue: [{ k: "w1", o: owner, l: 1000 }] };
    const early: [LeaseRecord, LeaseRecord] = [
      { v: 1, t: "queue", k: "w2", o: owner, l: 1000 },
      { v: 1, t: "take", k: "t", o: owner, l: 1000, prev: "h", force: false, w: "w1" },
    ];
    const fold = (records: readonly LeaseRecord[]) => {
      const st = emptyState(false);
      for (const r of records) applyLease(st, r);
      return { holder: st.holder?.k ?? null, queue: st.queue.map((e) => e.k), records: st.records };
    };
    const carriedFirst = fold([carry, ...early]);
    assert.deepEqual(carriedFirst, { holder: "t", queue: ["w2"], records: 3 });
    assert.deepEqual(fold([...early, carry]), carriedFirst, "the same wherever the carry landed");
    assert.deepEqual(fold([early[0], carry, early[1], carry]), { ...carriedFirst, records: 4 }, "a second copy of the carry changes nothing");
    const st = emptyState(false);
    applyLease(st, early[1]);
    assert.equal(st.holder, null, "nothing counts before the carry");
  });

  it("closes the storages", async () => {
    for (const s of storages) await s.close();
  });
});
