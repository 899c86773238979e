/**
 * Durable Streams commit benchmark: the adapter's `Database.commit` against a raw append of the same
 * bytes to the same server (one POST with the idempotent producer headers, to a stream of its own),
 * for 1-event and 20-event batches, alternating one by one so the machine's load hits both alike. The
 * server is the reference server (file-backed, fsync per append) run as a child process in a
 * temporary directory. Prints p50/p99 latency, commits/s and the ratio adapter/raw, then the latency
 * of opening an existing database (a claim: index read, log read, claim, read back, opened mark).
 * Never asserts: the numbers depend on the disk and on the neighbours.
 *
 * Run: node --import tsx bench/durable-streams.ts
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { event, identity, type NewEvent } from "../src/state/events.js";
import { prepareBatch } from "../src/storage/semantics.js";
import { startDevServer } from "../storage-adapters/durable-streams/devserver.js";
import { createDurableStreamsStorage } from "../storage-adapters/durable-streams/index.js";
import { commitRecord } from "../storage-adapters/durable-streams/records.js";
import { formatMs, summarize, table } from "./stats.js";

const BATCH_SIZES = [1, 20] as const;
/** Wall time per batch size; adapter and raw appends alternate one by one within it. */
const BUDGET_MS = 10_000;
const WARMUP = 10;
const OPENS = 10;
const AT = "2025-01-01T00:00:00.000Z";

function batch(tag: string, i: number, size: number): NewEvent[] {
  return Array.from({ length: size }, (_, j) => {
    const id = `${tag}-${i}-${j}`;
    return event("inbox_received", "bench", identity.inbox("bench", id), AT, {
      observation: { id, source: "external", kind: "note", at: AT, payload: { text: "a typical small observation payload", i, j } },
    });
  });
}

/** A raw producer on its own stream: one POST per batch, the body the adapter would send for it. */
async function rawAppender(url: string, stream: string): Promise<(events: NewEvent[]) => Promise<void>> {
  const target = `${url}/${stream}`;
  const created = await fetch(target, { method: "PUT", headers: { "content-type": "application/json" } });
  if (created.status !== 201 && created.status !== 200) throw new Error(`PUT ${target}: ${created.status}`);
  let seq = 0;
  let head = 0;
  return async (events) => {
    const body = JSON.stringify(commitRecord(1, seq + 2, head + 1, events.length, JSON.stringify(prepareBatch(events))));
    const res = await fetch(target, { method: "POST", headers: { "content-type": "application/json", "producer-id": "bench-raw", "producer-epoch": "1", "producer-seq": String(seq) }, body });
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`raw append answered ${res.status}`);
    seq += 1;
    head += events.length;
  };
}

/** Runs the benchmark and prints its table. Stops the server and removes its directory even on failure. */
export async function runDurableStreamsBench(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-ds-"));
  const server = await startDevServer({ dir: join(dir, "server") });
  const storage = createDurableStreamsStorage({ url: server.url });
  const rows: Record<string, string | number>[] = [];
  try {
    console.log(`durable-streams commit benchmark: the reference server (file-backed, fsync per append) at ${server.url}; adapter commits and raw appends of the same bytes alternate; ${BUDGET_MS / 1000} s per batch size`);
    for (const size of BATCH_SIZES) {
      const db = await storage.open(`bench-${size}`);
      const raw = await rawAppender(server.url, `raw-${size}`);
      const commits = { adapter: (e: NewEvent[]) => db.commit(e), raw };
      const samples = { adapter: [] as number[], raw: [] as number[] };
      try {
        for (let i = 0; i < WARMUP; i++) {
          await commits.adapter(batch("adapter-warm", i, size));
          await commits.raw(batch("raw-warm", i, size));
        }
        const start = performance.now();
        for (let i = 0; performance.now() - start < BUDGET_MS; i++) {
          for (const which of i % 2 === 0 ? (["adapter", "raw"] as const) : (["raw", "adapter"] as const)) {
            const events = batch(which, i, size);
            const t0 = performance.now();
            await commits[which](events);
            samples[which].push(performance.now() - t0);
          }
        }
      } finally {
        await db.close();
      }
      const summary = { adapter: summarize(samples.adapter), raw: summarize(samples.raw) };
      const rate = (w: "adapter" | "raw") => 1000 / summary[w].mean;
      for (const w of ["adapter", "raw"] as const) {
        rows.push({ impl: w === "adapter" ? "adapter commit" : "raw append", batch: size, n: summary[w].n, "p50 ms": formatMs(summary[w].p50), "p99 ms": formatMs(summary[w].p99), "commits/s": rate(w).toFixed(0) });
      }
      rows.push({ impl: "adapter/raw", batch: size, n: "", "p50 ms": (summary.adapter.p50 / summary.raw.p50).toFixed(2), "p99 ms": (summary.adapter.p99 / summary.raw.p99).toFixed(2), "commits/s": (rate("adapter") / rate("raw")).toFixed(2) });
    }
    console.log(table(rows));
    const opens: number[] = [];
    for (let i = 0; i < OPENS; i++) {
      const t0 = performance.now();
      const db = await storage.open("bench-1");
      opens.push(performance.now() - t0);
      await db.close();
    }
    const o = summarize(opens);
    console.log(`open of an existing database (claim): p50 ${formatMs(o.p50)} ms, max ${formatMs(o.max)} ms (n=${o.n}); one raw append p50 above is the unit (an open is about 3 appends and 3 reads)`);
  } finally {
    await storage.close();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await runDurableStreamsBench();
}
