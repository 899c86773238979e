/**
 * The gate of the cell a patch queues is started while the commit that queues it is in flight
 * (issue 13: the gate's spawn off the round's critical path), and that never lets code run early:
 * the cell runs only after `execution_started` is durable; a queued commit that fails, or a harness
 * closed while it is in flight, leaves no gate behind and nothing run, and the cell then runs
 * exactly once. Real sqlite, real gates (the default launcher), a real `sh` cell that appends a line
 * to a file. The commit is held by a Storage wrapper until the test has looked at the processes.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import { test } from "node:test";
import type { NewEvent } from "../../src/state/events.js";
import { Harness } from "../../src/harness/harness.js";
import { StorageRejected } from "../../src/storage/errors.js";
import type { Storage } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { passThrough, passThroughStorage } from "../../chaos/support/passthrough.js";
import { sleep, until } from "../support/wait.js";
import { adds, cmd, conclude, scripted } from "./support.js";
import { outcomeThroughRefusals, processesIn, project } from "./early-gate-support.js";

/** A model that runs one cell appending "ran" to the marker, then concludes. */
const model = () => scripted([adds(0, 1, [cmd("sh", "-c", "echo ran >> marker")]), adds(1, 2, [conclude("success")])]);

/** `storage` whose commits of a batch that queues an execution go through `onQueued` first. */
function holdQueued(storage: Storage, onQueued: (events: readonly NewEvent[]) => Promise<void>): Storage {
  return passThroughStorage(storage, (db) =>
    passThrough(db, {
      commit: async (events) => {
        if (events.some((e) => e.kind === "execution_queued")) await onQueued(events);
        return db.commit(events);
      },
    }),
  );
}

test("the queued cell's gate starts while the commit that queues it is in flight, and the cell runs only after `started` is durable", async (t) => {
  const p = project("cairn-early-gate-");
  t.after(() => p.tmp.cleanup());
  let gateDuringQueued: number[] = [];
  let ranBeforeStarted = false;
  const storage = passThroughStorage(
    holdQueued(createSqliteStorage({ dataDir: p.data }), async () => {
      // Held until the gate shows up (or 20 s pass: then it was not started early, and the test fails).
      gateDuringQueued = await until("a gate in the session's cwd", () => {
        const ps = processesIn(p.cwd);
        return ps.length > 0 ? ps : undefined;
      }, 20_000).catch(() => []);
      await sleep(200); // time for a gate that did not wait to run its cell
    }),
    (db) =>
      passThrough(db, {
        commit: async (events) => {
          if (events.some((e) => e.kind === "execution_started")) ranBeforeStarted ||= p.runs() > 0;
          return db.commit(events);
        },
      }),
  );
  const h = await Harness.open({ storage, name: "early", model: model(), workDir: p.work });
  try {
    const id = await h.start({ goal: "early gate", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
  } finally {
    await h.close();
    await storage.close();
  }
  assert.ok(gateDuringQueued.length > 0, "no gate was started while the commit that queues the cell was in flight");
  assert.equal(ranBeforeStarted, false, "the cell ran before its `started` commit");
  assert.equal(p.runs(), 1, "the cell ran exactly once");
});

test("a queued commit that fails discards the gate started ahead: nothing ran, no gate is left, and the retry runs the cell once", async (t) => {
  const p = project("cairn-early-gate-fail-");
  t.after(() => p.tmp.cleanup());
  let failed = false;
  let firstGates: number[] = [];
  let firstGatesEnded = false;
  let ranBeforeRetry = -1;
  const storage = holdQueued(createSqliteStorage({ dataDir: p.data }), async () => {
    if (failed) {
      // The retry's queued commit: the gate started ahead for the refused one must have ended.
      ranBeforeRetry = p.runs();
      const alive = (pid: number) => processesIn(p.cwd).includes(pid);
      firstGatesEnded = (await until("the first gate to end", () => (firstGates.every((pid) => !alive(pid)) ? true : undefined), 10_000).catch(() => false)) === true;
      return;
    }
    failed = true;
    firstGates = await until("a gate in the session's cwd", () => {
      const ps = processesIn(p.cwd);
      return ps.length > 0 ? ps : undefined;
    }, 20_000);
    // Refused, nothing written: the driver tries the round again.
    throw new StorageRejected("backlog_full", "test: refused the batch that queues the cell");
  });
  const h = await Harness.open({ storage, name: "early", model: model(), workDir: p.work });
  try {
    const id = await h.start({ goal: "early gate, failed commit", cwd: p.cwd });
    const outcome = await outcomeThroughRefusals(h, id);
    assert.equal(outcome.result, "success", outcome.reason);
  } finally {
    await h.close();
    await storage.close();
  }
  assert.ok(failed, "the queued commit was never refused");
  assert.ok(firstGates.length > 0, "no gate was started ahead");
  assert.ok(firstGatesEnded, `the gate started ahead (${firstGates.join(", ")}) still runs after the commit that queued its cell failed`);
  assert.equal(ranBeforeRetry, 0, "the cell ran although the commit that queued it failed");
  assert.equal(p.runs(), 1, "the cell ran exactly once");
});

test("a harness closed while the queued commit is in flight leaves no gate and runs nothing; the next owner runs the cell once", async (t) => {
  const p = project("cairn-early-gate-close-");
  t.after(() => p.tmp.cleanup());
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let gateSeen = false;
  const storage = holdQueued(createSqliteStorage({ dataDir: p.data }), async () => {
    gateSeen = (await until("a gate in the session's cwd", () => (processesIn(p.cwd).length > 0 ? true : undefined), 20_000).catch(() => false)) === true;
    await held;
  });
  const h = await Harness.open({ storage, name: "early", model: model(), workDir: p.work });
  const id = await h.start({ goal: "early gate, closed", cwd: p.cwd });
  await until("the gate started ahead", () => (gateSeen ? true : undefined), 30_000);
  const closing = h.close();
  release(); // the queued commit lands while the harness closes
  await closing;
  assert.deepEqual(processesIn(p.cwd), [], "a gate started ahead outlived close()");
  await storage.close();
  assert.equal(p.runs(), 0, "the cell ran although its harness closed before `started`");

  const storage2 = createSqliteStorage({ dataDir: p.data });
  const h2 = await Harness.open({ storage: storage2, name: "early", model: model(), workDir: p.work });
  try {
    await h2.resume();
    const outcome = await h2.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
  } finally {
    await h2.close();
    await storage2.close();
  }
  assert.equal(p.runs(), 1, "the cell ran exactly once");
});

test("an owner SIGKILLed while the queued commit is in flight: its gate started ahead ends without running anything, and the next owner runs the cell once", async (t) => {
  const p = project("cairn-early-gate-kill-");
  t.after(() => p.tmp.cleanup());
  const src = (rel: string) => JSON.stringify(pathToFileURL(new URL(`../../${rel}`, import.meta.url).pathname).href);
  // The owner: holds the commit that queues the cell forever and says "held" once its gate runs.
  const owner = `
import { Harness } from ${src("src/harness/harness.ts")};
import { createSqliteStorage } from ${src("storage-adapters/sqlite/index.ts")};
import { onCommit, hasKind, processesIn } from ${src("test/harness/early-gate-support.ts")};
import { adds, cmd, conclude, scripted } from ${src("test/harness/support.ts")};
const [data, work, cwd] = process.argv.slice(1);
const storage = onCommit(createSqliteStorage({ dataDir: data }), async (events, real) => {
  if (!hasKind(events, "execution_queued")) return real(events);
  while (processesIn(cwd).length === 0) await new Promise((r) => setTimeout(r, 20));
  console.log("held");
  return new Promise(() => {});
});
const model = scripted([adds(0, 1, [cmd("sh", "-c", "echo ran >> marker")]), adds(1, 2, [conclude("success")])]);
const h = await Harness.open({ storage, name: "early", model, workDir: work });
await h.start({ goal: "killed owner", cwd });
`;
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", owner, p.data, p.work, p.cwd], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => child.kill("SIGKILL"));
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  await until("the owner holding the queued commit with its gate started", () => (out.includes("held") ? true : undefined), 60_000);
  const gates = processesIn(p.cwd);
  child.kill("SIGKILL");
  // Its stdin's peer gone, an unreleased gate reads end-of-file and exits 125, having run nothing.
  await until("the killed owner's gate to end", () => (gates.every((pid) => !processesIn(p.cwd).includes(pid)) ? true : undefined), 30_000);
  assert.equal(p.runs(), 0, "the gate of a killed owner ran its cell");

  const storage = createSqliteStorage({ dataDir: p.data });
  const h = await Harness.open({ storage, name: "early", model: model(), workDir: p.work });
  try {
    const [id] = (await h.resume()).sessions;
    const outcome = await h.wait(id!);
    assert.equal(outcome.result, "success", outcome.reason);
  } finally {
    await h.close();
    await storage.close();
  }
  assert.equal(p.runs(), 1, "the cell ran exactly once");
});
