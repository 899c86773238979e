/**
 * Recovery time: how long `Harness.open` + `resume()` take on a sqlite database whose last owner died
 * with cells `started` (each becomes UnknownExecution after its process is checked), for logs of
 * several sizes. Also the pure fold of the same log, to show what the storage read and the
 * recovery commits add. Prints numbers; asserts nothing.
 *
 * Run: node --import tsx bench/recovery.ts
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { execa } from "execa";
import { Harness } from "../src/harness/harness.js";
import { ScriptedModel } from "../src/model/scripted.js";
import { event, identity, turnId, type NewEvent } from "../src/state/events.js";
import { Reducer } from "../src/state/reducer.js";
import { parseLogEvent } from "../src/state/events.js";
import { bootId, hostName, processStartTime } from "../src/exec/identity.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";

/** Commits a log with `outputs` output events and `started` interrupted executions. */
async function craft(dataDir: string, outputs: number, started: number): Promise<void> {
  const storage = createSqliteStorage({ dataDir });
  const db = await storage.open("bench");
  const s = "s1";
  const at = new Date().toISOString();
  const turn = turnId(s, 1);
  // A dead process's identity: same host and boot, a pid that no longer runs.
  const dead = await execa("sh", ["-c", "echo $$"]);
  const pid = Number(dead.stdout.trim());
  const startTime = processStartTime(process.pid)!;
  const cells = Array.from({ length: started }, (_, i) => ({ id: i + 1, previous_id: null, kind: "cmd" as const, argv: ["true"] }));
  const patch = [{ op: "test", path: "/revision", value: 0 }, ...cells.map((c) => ({ op: "add", path: "/cells/-", value: c }))];
  const head: NewEvent[] = [
    event("session_created", s, identity.session(s), at, { goal: "bench", cwd: dataDir, validators: [], budgets: {} }),
    event("turn_prepared", s, identity.turn(turn), at, { turn, n: 1, revision: 0, delivered: [] }),
    event("model_attempt", s, identity.attempt(turn, 1), at, { turn, attempt: 1 }),
    event("model_response", s, identity.response(turn, 1), at, { turn, attempt: 1, patch, usage: null }),
    event("patch_accepted", s, identity.patch(turn), at, { turn, attempt: 1, patch, revision: 1, new_cell_ids: cells.map((c) => c.id), removed_ids: [], consumed: [] }),
    ...cells.map((c) => event("execution_queued", s, identity.queued(s, c.id), at, { cell_id: c.id, kind: "cmd" })),
    ...cells.map((c) => event("execution_started", s, identity.execution(s, c.id), at, { cell_id: c.id, host: hostName(), boot_id: bootId(), pid, pgid: pid, start_time: startTime })),
  ];
  await db.commit(head);
  const line = "x".repeat(200) + "\n";
  for (let n = 0; n < outputs; n += 500) {
    const batch: NewEvent[] = [];
    for (let k = n; k < Math.min(outputs, n + 500); k++) batch.push(event("execution_output", s, identity.output(s, 1, k), at, { cell_id: 1, n: k, stream: "stdout", data: line }));
    await db.commit(batch);
  }
  await db.close();
  await storage.close();
}

export async function runRecoveryBench(): Promise<void> {
  console.log("recovery: open + resume() of a database whose owner died with cells started (sqlite)");
  for (const [outputs, started] of [
    [0, 1],
    [10_000, 1],
    [50_000, 1],
    [10_000, 20],
  ] as const) {
    const dir = mkdtempSync(join(tmpdir(), "cairn-bench-recovery-"));
    try {
      await craft(dir, outputs, started);
      const events = outputs + 5 + 2 * started;
      // The pure fold, for comparison.
      const storage0 = createSqliteStorage({ dataDir: dir });
      const reader = await storage0.reader("bench");
      const tRead = performance.now();
      const raw = await reader.read(0);
      const readMs = performance.now() - tRead;
      const tFold = performance.now();
      new Reducer().apply(raw.map((e) => parseLogEvent(e)));
      const foldMs = performance.now() - tFold;
      await reader.close();
      await storage0.close();

      const storage = createSqliteStorage({ dataDir: dir });
      const model = new ScriptedModel({ rounds: [] });
      const t0 = performance.now();
      const h = await Harness.open({ storage, name: "bench", model, workDir: dir, limits: { stopGraceMs: 0 } });
      const tOpen = performance.now();
      const r = await h.resume();
      const tResume = performance.now();
      await h.close();
      await storage.close();
      console.log(
        `  ${String(events).padStart(6)} events, ${String(started).padStart(2)} interrupted: open ${(tOpen - t0).toFixed(1).padStart(7)} ms (read ${readMs.toFixed(1)} ms + fold ${foldMs.toFixed(1)} ms), resume ${(tResume - tOpen).toFixed(1).padStart(7)} ms (${r.recovered} UnknownExecution recorded, ${((tResume - tOpen) / Math.max(1, r.recovered)).toFixed(2)} ms each)`,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await runRecoveryBench();
