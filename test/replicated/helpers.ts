/**
 * Helpers of the replicated adapter's tests: one dev cluster per test file, fresh data directories,
 * a logger that captures every line (to assert on warnings and on secrets never appearing), and
 * valid events.
 */
import assert from "node:assert/strict";
import { closeSync, existsSync, mkdtempSync, openSync, rmSync, statSync, writeSync } from "node:fs";
import Sqlite from "better-sqlite3";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { event, type NewEvent } from "../../src/state/events.js";
import { after, before } from "node:test";
import { startDevCluster, type DevCluster, type DevClusterOptions } from "../../src/cli/devcluster/index.js";
import { createReplicatedStorage, type ReplicatedLogger } from "../../storage-adapters/replicated/index.js";
import type { Storage } from "../../src/storage/contract.js";

/** A fixed timestamp: the storage never interprets `at`. */
export const AT = "2025-01-02T03:04:05.678Z";

/** A small valid event with identity `id` in session `session`. */
export function ev(id: string, session = "s1", note = ""): NewEvent {
  return event("timer_fired", session, id, AT, { timer_id: `${id}${note}`, due_at: AT, late_ms: 0 });
}

/** A temporary directory removed by the returned cleanup. */
export function tempDir(prefix: string): { dir: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `cairn-${prefix}-`));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Overwrites with garbage the root page of table `table` in the closed SQLite file `path` and, with
 * `withIndexes`, those of its indexes too: the file still opens (its header and schema on page 1 are
 * intact), and only a read of that table meets the damage. The file's last connection must have
 * closed (its WAL checkpointed into it: asserted). Returns the pages overwritten.
 */
export function damageTable(path: string, table: string, withIndexes = false): number[] {
  const file = new Sqlite(path);
  const pageSize = file.pragma("page_size", { simple: true }) as number;
  const roots = (file.prepare(`SELECT rootpage FROM sqlite_master WHERE ${withIndexes ? "tbl_name" : "name"} = ?`).all(table) as { rootpage: number }[]).map((r) => r.rootpage);
  file.close();
  assert.ok(roots.length >= 1 && roots.every((r) => r > 1), `${table}'s pages: ${roots.join(", ")}`);
  assert.equal(existsSync(`${path}-wal`) && statSync(`${path}-wal`).size > 0, false, "the file was checkpointed by its last close");
  const fd = openSync(path, "r+");
  try {
    for (const root of roots) writeSync(fd, Buffer.alloc(pageSize, 0xa5), 0, pageSize, (root - 1) * pageSize);
  } finally {
    closeSync(fd);
  }
  return roots;
}

/** A logger that records every line as JSON text (object and message). */
export function captureLogger(): ReplicatedLogger & { lines: string[] } {
  const lines: string[] = [];
  const rec = (level: string) => (obj: object, msg?: string) => {
    lines.push(JSON.stringify({ level, msg, ...obj }));
  };
  return { lines, info: rec("info"), warn: rec("warn"), error: rec("error") };
}

/** Starts a dev cluster in a fresh temporary directory; `stop()` stops it and removes the directory. */
export async function devCluster(options: Omit<DevClusterOptions, "dir"> = {}): Promise<{ cluster: DevCluster; dir: string; stop: () => Promise<void> }> {
  const { dir, remove } = tempDir("etcd");
  let cluster: DevCluster;
  try {
    cluster = await startDevCluster({ ...options, dir });
  } catch (err) {
    remove();
    throw err;
  }
  return {
    cluster,
    dir,
    stop: async () => {
      await cluster.stop();
      remove();
    },
  };
}

/**
 * One cluster for the calling suite (call inside `describe`): started before its tests; after them
 * every member is continued (a test may have left one frozen), every storage `make` created is
 * closed, the cluster stopped and the data directories removed. `make(dataDir, extra)` creates a
 * storage on it with short deadlines (commit 1.5 s, health every 250 ms) and the captured logger.
 */
export function clusterSuite(prefix: string): {
  readonly cluster: () => DevCluster;
  readonly dirs: { dir: string; remove: () => void };
  readonly logger: ReturnType<typeof captureLogger>;
  make: (dataDir: string, extra?: Partial<Parameters<typeof createReplicatedStorage>[0]>) => Storage;
} {
  let dc: Awaited<ReturnType<typeof devCluster>> | undefined;
  const dirs = tempDir(prefix);
  const storages: Storage[] = [];
  const logger = captureLogger();
  before(async () => {
    dc = await devCluster();
  });
  after(async () => {
    for (let i = 0; i < 3; i++) dc?.cluster.signal(i, "SIGCONT");
    for (const s of storages) await s.close().catch(() => undefined);
    await dc?.stop();
    dirs.remove();
  });
  const cluster = (): DevCluster => {
    if (dc === undefined) throw new Error("clusterSuite: the cluster is started in before(); use it inside a test");
    return dc.cluster;
  };
  return {
    cluster,
    dirs,
    logger,
    make: (dataDir, extra = {}) => {
      const s = createReplicatedStorage({ endpoints: cluster().endpoints, dataDir, commitTimeoutMs: 1500, healthIntervalMs: 250, logger, ...extra });
      storages.push(s);
      return s;
    },
  };
}

/** Resolves to "pending" when `p` has not settled after `ms` (a check that something waits, not a speed assertion). */
export async function stillPending<T>(p: Promise<T>, ms: number): Promise<"pending" | "settled"> {
  let settled = false;
  p.then(
    () => (settled = true),
    () => (settled = true),
  );
  await new Promise((r) => setTimeout(r, ms));
  return settled ? "settled" : "pending";
}

/** A bound so a broken adapter fails the test instead of hanging it (not a speed assertion). */
export function bounded<T>(p: Promise<T>, what: string, ms = 90_000): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: not settled after ${ms} ms`)), ms);
    }),
  ]);
}

/** Waits until `done()` holds, polling; fails naming `what` after `ms`. */
export async function eventually(done: () => boolean, what: string, ms = 60_000, everyMs = 50): Promise<void> {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) assert.fail(`never happened: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * Waits until the dev cluster answers with a quorum again (after members were restarted or thawed)
 * and every running member commits a write proposal (see `DevCluster.serving`): a CI run opened a
 * database through a member thawed a moment before, while its election was still running, and the
 * open's one 1.5 s attempt ran out.
 */
export async function untilQuorum(cluster: DevCluster, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cluster.status()).quorumHeld || !(await cluster.serving())) {
    if (Date.now() > deadline) assert.fail(`the dev cluster did not regain its quorum within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
