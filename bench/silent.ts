/**
 * A silent member: commit throughput and p50 latency on a fresh three-member dev cluster,
 * healthy, then with one follower SIGSTOPped, then with one member's traffic dropped by iptables
 * (root only; skipped otherwise), each window right after a healthy one so both see the same load.
 * Prints the ratios (target: throughput at least 0.7x, p50 at most 1.5x the healthy window).
 *
 * Run: node --import tsx bench/silent.ts [seconds=5]. Prints numbers; asserts nothing.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { event } from "../src/state/events.js";
import type { Database } from "../src/storage/contract.js";
import { startDevCluster, type DevCluster } from "../src/cli/devcluster/index.js";
import { createReplicatedStorage } from "../storage-adapters/replicated/index.js";
import { dropPorts, firewallUnavailable, portOf } from "../chaos/support/firewall.js";

const AT = "2025-01-02T03:04:05.678Z";

/** Commits from `workers` concurrent loops for `ms`; returns commits/s and p50 latency. */
async function window(db: Database, tag: string, ms: number, workers = 4): Promise<{ perSecond: number; p50: number }> {
  const lat: number[] = [];
  const end = performance.now() + ms;
  let n = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (performance.now() < end) {
        const id = `${tag}-${n++}`;
        const t0 = performance.now();
        await db.commit([event("timer_fired", "bench", id, AT, { timer_id: id, due_at: AT, late_ms: 0 })]);
        lat.push(performance.now() - t0);
      }
    }),
  );
  lat.sort((a, b) => a - b);
  return { perSecond: lat.length / (ms / 1000), p50: lat[Math.floor(lat.length / 2)] ?? Number.NaN };
}

async function leaderIndex(cluster: DevCluster): Promise<number> {
  for (;;) {
    const i = (await cluster.status()).members.findIndex((m) => m.isLeader);
    if (i >= 0) return i;
    await sleep(100);
  }
}

export async function runSilentBench(seconds = 5): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-silent-"));
  const cluster = await startDevCluster({ dir: join(dir, "etcd") });
  const storage = createReplicatedStorage({ endpoints: cluster.endpoints, dataDir: join(dir, "data"), healthIntervalMs: 500 });
  try {
    const db = await storage.open("silent");
    await window(db, "warm", 1000);
    const report = async (name: string, silence: () => () => void) => {
      const healthy = await window(db, `${name}-h`, seconds * 1000);
      const heal = silence();
      let silent;
      try {
        silent = await window(db, `${name}-s`, seconds * 1000);
      } finally {
        heal();
      }
      await sleep(1000);
      console.log(
        `${name.padEnd(28)} healthy ${healthy.perSecond.toFixed(1)} commits/s p50 ${healthy.p50.toFixed(1)} ms | silent ${silent.perSecond.toFixed(1)} commits/s p50 ${silent.p50.toFixed(1)} ms | ` +
          `throughput x${(silent.perSecond / healthy.perSecond).toFixed(2)} (target >= 0.7), p50 x${(silent.p50 / healthy.p50).toFixed(2)} (target <= 1.5)`,
      );
    };
    const follower = async () => ((await leaderIndex(cluster)) + 1) % 3;
    const f = await follower();
    await report("follower SIGSTOPped", () => {
      cluster.signal(f, "SIGSTOP");
      return () => cluster.signal(f, "SIGCONT");
    });
    if (firewallUnavailable() === null) {
      const v = await follower();
      const m = cluster.members[v]!;
      await report("member traffic dropped", () => dropPorts([portOf(m.clientUrl), portOf(m.peerUrl)]).heal);
    } else {
      console.log(`member traffic dropped: skipped (${firewallUnavailable()})`);
    }
    await db.close();
  } finally {
    for (let i = 0; i < 3; i++) cluster.signal(i, "SIGCONT");
    await storage.close();
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await runSilentBench(Number(process.argv[2] ?? 5));
