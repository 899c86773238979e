/**
 * Helpers for the tests of the gate started ahead (early-gate*.test.ts): the processes in a
 * session's cwd (its gates and cells), a project whose cells append lines to a marker file, and a
 * Storage whose commits a test can hold, refuse or watch.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import type { NewEvent } from "../../src/state/events.js";
import type { Harness } from "../../src/harness/harness.js";
import { StorageRejected } from "../../src/storage/errors.js";
import { sleep, until } from "../support/wait.js";
import type { CommitReceipt, Storage } from "../../src/storage/contract.js";
import { passThrough, passThroughStorage } from "../../chaos/support/passthrough.js";
import { tempDir } from "./support.js";

/** Live processes whose working directory is `dir` (the session's cwd: its gates and cells). */
export function processesIn(dir: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readlinkSync(`/proc/${d}/cwd`) !== dir) continue;
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      if (stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z")) continue;
      out.push(Number(d));
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/** A project: a cwd, and a marker file in it that cells append lines to. */
export function project(prefix: string) {
  const tmp = tempDir(prefix);
  const cwd = join(tmp.dir, "cwd");
  mkdirSync(cwd);
  const marker = join(cwd, "marker");
  /** The lines appended to the marker so far. */
  const lines = () => (existsSync(marker) ? readFileSync(marker, "utf8").split("\n").filter((l) => l !== "") : []);
  /** How many times a cell appended "ran". */
  const runs = () => lines().filter((l) => l === "ran").length;
  return { tmp, cwd, marker, lines, runs, data: join(tmp.dir, "data"), work: join(tmp.dir, "work") };
}

/** `storage` whose databases commit through `commit` (given the real database's commit). */
export function onCommit(storage: Storage, commit: (events: readonly NewEvent[], real: (events: readonly NewEvent[]) => Promise<CommitReceipt>) => Promise<CommitReceipt>): Storage {
  return passThroughStorage(storage, (db) => passThrough(db, { commit: (events) => commit(events, (e) => db.commit(e)) }));
}

export const hasKind = (events: readonly NewEvent[], kind: string): boolean => events.some((e) => e.kind === kind);

/**
 * The outcome of run `id`. wait() reports a refused commit (the driver's error) and the driver tries
 * again after its back-off, so this waits through refusals (hang guard 60 s).
 */
export function outcomeThroughRefusals(h: Harness, id: string): ReturnType<Harness["wait"]> {
  return until("the run's end", () => h.wait(id).catch((err: unknown) => {
    if (!(err instanceof StorageRejected)) throw err;
    return sleep(100).then(() => undefined);
  }), 60_000);
}
