/**
 * Sqlite commit benchmark: the adapter against raw better-sqlite3 doing the same inserts with the
 * same settings (WAL, synchronous=FULL, one transaction per batch, same table), for 1-event and
 * 20-event batches, in a temporary directory. Prints p50/p99 latency, commits/s and the ratio
 * adapter/raw. Runs about 20 s. Never asserts: the numbers depend on the disk and on the neighbours.
 *
 * Run: node --import tsx bench/sqlite.ts
 */
import BetterSqlite3 from "better-sqlite3";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { event, identity, type NewEvent } from "../src/state/events.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";
import { performance } from "node:perf_hooks";
import { formatMs, summarize, table } from "./stats.js";

const BATCH_SIZES = [1, 20] as const;
/** Wall time per batch size; adapter and raw commits alternate one by one within it. */
const BUDGET_MS = 10_000;
const MAX_PAIRS = 20_000;
const WARMUP_COMMITS = 20;
const AT = "2025-01-01T00:00:00.000Z";

/** A committer: one call commits one batch durably. */
type Commit = (events: NewEvent[]) => unknown;

function batch(tag: string, i: number, size: number): NewEvent[] {
  return Array.from({ length: size }, (_, j) => {
    const id = `${tag}-${i}-${j}`;
    return event("inbox_received", "bench", identity.inbox("bench", id), AT, {
      observation: { id, source: "external", kind: "note", at: AT, payload: { text: "a typical small observation payload", i, j } },
    });
  });
}

/** Raw better-sqlite3 with the adapter's pragmas and events table; one BEGIN IMMEDIATE/COMMIT per batch. */
function rawCommitter(path: string): { commit: Commit; close: () => void } {
  const conn = new BetterSqlite3(path);
  conn.pragma("journal_mode = WAL");
  conn.pragma("synchronous = FULL");
  conn.exec(`CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, identity TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
    session TEXT NOT NULL, at TEXT NOT NULL, body TEXT NOT NULL)`);
  const begin = conn.prepare("BEGIN IMMEDIATE");
  const commit = conn.prepare("COMMIT");
  const insert = conn.prepare("INSERT INTO events (identity, kind, session, at, body) VALUES (?, ?, ?, ?, ?)");
  return {
    commit: (events) => {
      begin.run();
      for (const e of events) insert.run(e.identity, e.kind, e.session, e.at, JSON.stringify(e.body));
      commit.run();
    },
    close: () => conn.close(),
  };
}

/**
 * Alternates one adapter commit and one raw commit (swapping which goes first every pair) until the
 * budget is spent, so load from neighbours and disk hiccups hit both alike. Returns per-commit ms.
 */
async function measurePairs(adapter: Commit, raw: Commit, size: number): Promise<{ adapter: number[]; raw: number[] }> {
  for (let i = 0; i < WARMUP_COMMITS; i++) {
    await adapter(batch("adapter-warm", i, size));
    await raw(batch("raw-warm", i, size));
  }
  const out = { adapter: [] as number[], raw: [] as number[] };
  const both = [["adapter", adapter], ["raw", raw]] as const;
  const start = performance.now();
  for (let i = 0; i < MAX_PAIRS && performance.now() - start < BUDGET_MS; i++) {
    for (const [which, commit] of i % 2 === 0 ? both : [both[1], both[0]]) {
      const events = batch(which, i, size);
      const t0 = performance.now();
      await commit(events);
      out[which].push(performance.now() - t0);
    }
  }
  return out;
}

/**
 * Runs the benchmark and prints one table: for each batch size, adapter and raw commits alternate
 * one by one (see measurePairs); commits/s is 1000 / mean latency of that implementation's commits.
 * Removes its temporary directory even on failure.
 */
export async function runSqliteBench(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "cairn-bench-sqlite-"));
  const storage = createSqliteStorage({ dataDir: dir });
  const rows: Record<string, string | number>[] = [];
  try {
    console.log(`sqlite commit benchmark in ${dir} (WAL, synchronous=FULL; adapter and raw commits alternate; ${BUDGET_MS / 1000} s per batch size)`);
    for (const size of BATCH_SIZES) {
      const db = await storage.open(`adapter-${size}`);
      const raw = rawCommitter(join(dir, `raw-${size}.db`));
      let samples: { adapter: number[]; raw: number[] };
      try {
        samples = await measurePairs((e) => db.commit(e), raw.commit, size);
      } finally {
        await db.close();
        raw.close();
      }
      const summary = { adapter: summarize(samples.adapter), raw: summarize(samples.raw) };
      const rate = (w: "adapter" | "raw") => 1000 / summary[w].mean;
      for (const w of ["adapter", "raw"] as const) {
        rows.push({
          impl: w,
          batch: size,
          commits: summary[w].n,
          "p50 ms": formatMs(summary[w].p50),
          "p99 ms": formatMs(summary[w].p99),
          "commits/s": rate(w).toFixed(0),
          "events/s": (rate(w) * size).toFixed(0),
        });
      }
      rows.push({
        impl: "adapter/raw",
        batch: size,
        commits: "",
        "p50 ms": (summary.adapter.p50 / summary.raw.p50).toFixed(2),
        "p99 ms": (summary.adapter.p99 / summary.raw.p99).toFixed(2),
        "commits/s": (rate("adapter") / rate("raw")).toFixed(2),
        "events/s": "",
      });
    }
    console.log(table(rows));
  } finally {
    await storage.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await runSqliteBench();
}
