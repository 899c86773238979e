/**
 * The replicated adapter against the physical limit: one etcd transaction.
 *
 * On a fresh three-member dev cluster (real etcd processes, fsync on), prints:
 * 1. the latency of a 1-event `Database.commit` beside a raw transaction of the same shape
 *    (2 compares: epoch value, head value; 2 puts, the record and the head, of the same bytes)
 *    on a client configured as the adapter's (client.ts: the etcd3 library, require-leader
 *    metadata, per-call deadlines), and beside the same raw transaction through the etcd3 library's
 *    defaults and fluent builders, interleaved so all see the same machine load, with the ratio of
 *    the adapter to the raw transaction on its own client (target < 1.3);
 * 2. commits/s with 1, 8 and 64 concurrent committers (sessions) in one process, and how many etcd
 *    transactions that took (grouping); one session is measured again after 64, and 64 sessions are
 *    compared with the mean of the two one-session rows (the machine's speed drifts within a run).
 *
 * Run: node --import tsx bench/etcd.ts [samples=300]. Under ~90 s. Prints numbers; asserts nothing.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { Etcd3 } from "etcd3";
import { event, type NewEvent } from "../src/state/events.js";
import { startDevCluster } from "../src/cli/devcluster/index.js";
import { createReplicatedStorage, type ReplicatedStats } from "../storage-adapters/replicated/index.js";
import { encodeBatch, chainHash, GENESIS_HASH } from "../storage-adapters/replicated/layout.js";
import { put, valueIs } from "../storage-adapters/replicated/ops.js";
import { clientOptions, closeEtcdClient, memberClient } from "../storage-adapters/replicated/client.js";
import { summarize, type Summary } from "./stats.js";

const AT = "2025-01-02T03:04:05.678Z";
const ev = (id: string): NewEvent => event("timer_fired", "bench", id, AT, { timer_id: id, due_at: AT, late_ms: 0 });

function line(name: string, s: Summary): string {
  return `${name.padEnd(40)} p50 ${s.p50.toFixed(2).padStart(7)} ms   p99 ${s.p99.toFixed(2).padStart(7)} ms   (n=${s.n})`;
}

/** Runs the benchmark and prints the results. */
export async function runEtcdBench(samples = 300, throughputSeconds = 5): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-etcd-"));
  const cluster = await startDevCluster({ dir: join(dir, "cluster") });
  const storage = createReplicatedStorage({ endpoints: cluster.endpoints, dataDir: join(dir, "data") });
  const raw = new Etcd3({ hosts: cluster.endpoints });
  const wire = memberClient(cluster.endpoints[0]!, clientOptions({}), 5000);
  try {
    // 1. Latency, adapter vs raw guarded txn of the same shape, interleaved.
    const db = await storage.open("bench-latency");
    const adapter: number[] = [];
    const direct: number[] = [];
    const library: number[] = [];
    let rawHead = 0;
    let wireHead = 0;
    const sample = ev("sample-0000000");
    const recordBytes = encodeBatch({
      header: { v: 1, first: 1, last: 1, epoch: 1, token: `1.${"0".repeat(16)}`, hash: chainHash(GENESIS_HASH, 1, JSON.stringify([sample])) },
      eventsJson: JSON.stringify([sample]),
    });
    const rawValue = "r".repeat(Buffer.byteLength(recordBytes));
    await raw.put("bench/raw/epoch").value("1");
    await raw.put("bench/raw/head").value("0");
    await raw.put("bench/wire/epoch").value("1");
    await raw.put("bench/wire/head").value("0");
    for (let i = 0; i < samples + 10; i++) {
      const id = `sample-${String(i).padStart(7, "0")}`;
      let t = performance.now();
      await db.commit([ev(id)]);
      const a = performance.now() - t;
      t = performance.now();
      const res = await raw
        .if("bench/raw/epoch", "Value", "==", "1")
        .and("bench/raw/head", "Value", "==", String(rawHead))
        .then(
          raw.put(`bench/raw/log/${String(rawHead + 1).padStart(16, "0")}`).value(rawValue),
          raw.put("bench/raw/head").value(String(rawHead + 1)),
        )
        .commit();
      const l = performance.now() - t;
      if (!res.succeeded) throw new Error("raw txn guard failed");
      rawHead++;
      t = performance.now();
      const w = await wire.kv.txn({
        compare: [valueIs("bench/wire/epoch", "1"), valueIs("bench/wire/head", String(wireHead))],
        success: [put(`bench/wire/log/${String(wireHead + 1).padStart(16, "0")}`, rawValue), put("bench/wire/head", String(wireHead + 1))],
        failure: [],
      });
      const d = performance.now() - t;
      if (!w.succeeded) throw new Error("raw txn guard failed");
      wireHead++;
      if (i >= 10) {
        adapter.push(a);
        direct.push(d);
        library.push(l);
      }
    }
    await db.close();
    const sa = summarize(adapter);
    const sd = summarize(direct);
    console.log(`etcd: 3-member dev cluster on 127.0.0.1, fsync on; 1-event commits, ${samples} samples each, interleaved`);
    console.log(line("adapter Database.commit (1 event)", sa));
    console.log(line("raw guarded txn, same shape and client", sd));
    console.log(line("the same, etcd3 defaults and builders", summarize(library)));
    console.log(`ratio adapter/raw (same client): p50 ${(sa.p50 / sd.p50).toFixed(2)}x   p99 ${(sa.p99 / sd.p99).toFixed(2)}x   (target < 1.3)`);

    // 2. Throughput with concurrent committers (sessions) in one process.
    console.log(`throughput: ${throughputSeconds} s per row, 1-event commits, one Storage`);
    const rates = new Map<string, number>();
    for (const [row, sessions] of [["1", 1], ["8", 8], ["64", 64], ["1 again", 1]] as const) {
      const tdb = await storage.open(`bench-throughput-${row.replace(" ", "-")}`);
      const before = tdb.stats() as ReplicatedStats;
      const end = performance.now() + throughputSeconds * 1000;
      let commits = 0;
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: sessions }, async (_, s) => {
          for (let i = 0; performance.now() < end; i++) {
            await tdb.commit([ev(`s${s}-${i}`)]);
            commits++;
          }
        }),
      );
      const seconds = (performance.now() - t0) / 1000;
      const txns = (tdb.stats() as ReplicatedStats).commitTxns - before.commitTxns;
      rates.set(row, commits / seconds);
      console.log(
        `${(sessions === 1 ? (row === "1" ? "1 session" : "1 session, again") : `${sessions} sessions`).padStart(16)}: ${(commits / seconds).toFixed(0).padStart(6)} commits/s   (${commits} commits in ${txns} etcd txns, ${(commits / Math.max(1, txns)).toFixed(1)} per txn)`,
      );
      await tdb.close();
    }
    const one = (rates.get("1")! + rates.get("1 again")!) / 2;
    console.log(
      `64 sessions against one: ${(rates.get("64")! / one).toFixed(1)}x against the mean of its two rows (${one.toFixed(0)} commits/s), ${(rates.get("64")! / rates.get("1")!).toFixed(1)}x against the first alone   (target >= 20x)`,
    );
  } finally {
    raw.close();
    closeEtcdClient(wire);
    await storage.close();
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const n = Number(process.argv[2] ?? 300);
  await runEtcdBench(Number.isInteger(n) && n > 0 ? n : 300);
}
