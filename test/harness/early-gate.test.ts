/**
 * The gate of the cell a patch queues is started while the commit that queues it is in flight (the
 * gate's spawn off the round's critical path), and that never lets code run early: the cell runs
 * only after `execution_started` is durable; a queued commit that fails, or a harness closed while
 * it is in flight, leaves no gate behind and nothing run, and the cell then runs exactly once.
 *
 * Then schedules that try to make a gate started ahead run the wrong cell, run a cell before its
 * `started` is durable or twice, leak past the run's end or the harness's close, or wedge the run:
 * patches refused or split, several cells in one patch, a cancel or a conclusion in the same patch,
 * the budget running out, a commit whose outcome is unknown, recovery while the commit is held.
 *
 * Real sqlite, real gates (the default launcher), real `sh` cells appending lines to a marker file in
 * the session's cwd; commits are held or refused by Storage wrappers (chaos/support/passthrough)
 * until the test has looked at the processes. Every wait is a hang guard, never a speed assertion.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import { test } from "node:test";
import type { NewEvent } from "../../src/state/events.js";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { StorageFailure, StorageRejected } from "../../src/storage/errors.js";
import type { Storage } from "../../src/storage/contract.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { passThrough, passThroughStorage } from "../../chaos/support/passthrough.js";
import { sleep, until } from "../support/wait.js";
import { adds, cmd, conclude, note, scripted } from "./support.js";
import { hasKind, onCommit, outcomeThroughRefusals, processesIn, project } from "./early-gate-support.js";
import { withHarness } from "../support/harness.js";

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
  await withHarness({ storage, name: "early", model: model(), workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "early gate", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage.close());
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
  await withHarness({ storage, name: "early", model: model(), workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "early gate, failed commit", cwd: p.cwd });
    const outcome = await outcomeThroughRefusals(h, id);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage.close());
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
  await withHarness({ storage: storage2, name: "early", model: model(), workDir: p.work }, async (h2) => {
    await h2.resume();
    const outcome = await h2.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage2.close());
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
  await withHarness({ storage, name: "early", model: model(), workDir: p.work }, async (h) => {
    const [id] = (await h.resume()).sessions;
    const outcome = await h.wait(id!);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage.close());
  assert.equal(p.runs(), 1, "the cell ran exactly once");
});

/** A cell that appends `word` to the marker. */
const mark = (word: string) => cmd("sh", "-c", `echo ${word} >> marker`);

/** Waits (hang guard 20 s) for a process in `dir`; resolves with whether one showed up. */
async function gateShowsUp(dir: string): Promise<boolean> {
  return (await until("a gate in the session's cwd", () => (processesIn(dir).length > 0 ? true : undefined), 20_000).catch(() => false)) === true;
}

/** Waits (hang guard 20 s) until no process is left in `dir`; resolves with those left then. */
async function noneLeft(dir: string): Promise<number[]> {
  await until("no process left in the session's cwd", () => (processesIn(dir).length === 0 ? true : undefined), 20_000).catch(() => undefined);
  return processesIn(dir);
}


/** Commits larger than this are refused as `too_large`, as etcd refuses a request over its limit. */
const COMMIT_LIMIT_CHARS = 150_000;

test(
  // A gate started ahead is used only by its cell with that very code: matched by cell id alone, the
  // refused patch's command would run under the accepted patch's cell.
  "a patch refused as too large to record, then a smaller patch with the same cell id: the accepted patch's command runs, not the refused one's",
  async (t) => {
    const p = project("cairn-early-gate-toolarge-");
    t.after(() => p.tmp.cleanup());
    const big = "x".repeat(60_000);
    // Attempt 1 of round 1: cell 1 marks "refused", with notes that make the patch too large to
    // record. Attempt 2 (told it was too large): cell 1 marks "accepted". Round 2 concludes.
    const model: Model = {
      name: "too-large-then-small",
      step(req: ModelRequest): Promise<ModelReply> {
        if (req.state.revision === 0) {
          const patch = req.attempt === 1 ? adds(0, 1, [mark("refused"), note(big), note(big), note(big)]) : adds(0, 1, [mark("accepted")]);
          return Promise.resolve({ patch, usage: null });
        }
        return Promise.resolve({ patch: adds(1, 2, [conclude("success")]), usage: null });
      },
    };
    let refusedTooLarge = 0;
    const storage = onCommit(createSqliteStorage({ dataDir: p.data }), (events, real) => {
      if (JSON.stringify(events).length > COMMIT_LIMIT_CHARS) {
        refusedTooLarge++;
        return Promise.reject(new StorageRejected("too_large", "test: the request is larger than the storage takes"));
      }
      return real(events);
    });
    let argv: readonly string[] = [];
    await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
      const id = await h.start({ goal: "too large, then small", cwd: p.cwd });
      const outcome = await h.wait(id);
      assert.equal(outcome.result, "success", outcome.reason);
      const cell = h.session(id)!.state.cells.find((c) => c.id === 1);
      argv = cell !== undefined && cell.kind === "cmd" ? cell.argv : [];
    }).finally(() => storage.close());
    assert.ok(refusedTooLarge >= 2, "the response was not refused as too large (with its verdict, then alone)");
    assert.deepEqual(argv, ["sh", "-c", "echo accepted >> marker"], "the log's cell 1 is the accepted patch's");
    assert.deepEqual(p.lines(), ["accepted"], "cell 1 ran something other than the command its log records (the refused patch's gate was used)");
    assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
  },
);

test("a response that fits alone but not with its verdict: the gate started ahead is the one used, for the same cell, once, after `started`", async (t) => {
  const p = project("cairn-early-gate-split-");
  t.after(() => p.tmp.cleanup());
  const big = "y".repeat(50_000);
  // The response and patch_accepted each hold the patch (about 100,000 characters): together over
  // the limit, each alone under it. admitPatch commits the response, then judges again.
  const model = scripted([adds(0, 1, [mark("ran"), note(big), note(big)]), adds(1, 4, [conclude("success")])]);
  let refused = 0;
  let gateDuringRefused = false;
  const linesAtStarted: number[] = [];
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (JSON.stringify(events).length > COMMIT_LIMIT_CHARS) {
      refused++;
      gateDuringRefused ||= await gateShowsUp(p.cwd);
      throw new StorageRejected("too_large", "test: the request is larger than the storage takes");
    }
    if (hasKind(events, "execution_started")) linesAtStarted.push(p.lines().length);
    return real(events);
  });
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "split commit", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
    assert.equal(h.session(id)!.executions.get(1)?.result, "success");
  }).finally(() => storage.close());
  assert.equal(refused, 1, "the response and its verdict were not refused together exactly once");
  assert.ok(gateDuringRefused, "no gate was started ahead while the refused commit was in flight");
  assert.deepEqual(linesAtStarted, [0], "the cell ran before its `started` commit (or was started twice)");
  assert.deepEqual(p.lines(), ["ran"], "the cell ran exactly once");
  assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
});

test("a queued commit refused (backlog_full) then answered by another patch: the retry runs the new patch's cell, not the first one's gate", async (t) => {
  const p = project("cairn-early-gate-retry-");
  t.after(() => p.tmp.cleanup());
  let calls = 0;
  const model: Model = {
    name: "changes-its-mind",
    step(req: ModelRequest): Promise<ModelReply> {
      if (req.state.revision === 0) return Promise.resolve({ patch: adds(0, 1, [mark(++calls === 1 ? "first" : "second")]), usage: null });
      return Promise.resolve({ patch: adds(1, 2, [conclude("success")]), usage: null });
    },
  };
  let refusedOnce = false;
  let gateDuringRefused = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued") && !refusedOnce) {
      refusedOnce = true;
      gateDuringRefused = await gateShowsUp(p.cwd);
      throw new StorageRejected("backlog_full", "test: refused the batch that queues the cell");
    }
    return real(events);
  });
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "refused, then another patch", cwd: p.cwd });
    const outcome = await outcomeThroughRefusals(h, id);
    assert.equal(outcome.result, "success", outcome.reason);
  }).finally(() => storage.close());
  assert.ok(gateDuringRefused, "no gate was started ahead while the refused commit was in flight");
  assert.ok(calls >= 2, "the model was not asked again after the refused commit");
  assert.deepEqual(p.lines(), ["second"], "the cell that ran is not the accepted patch's");
  assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
});

test("a patch that queues three cells: the first goes through the gate started ahead, each runs once, in order, after its own `started`", async (t) => {
  const p = project("cairn-early-gate-three-");
  t.after(() => p.tmp.cleanup());
  // Rounds come while cells 2 and 3 wait (after each result): they add a plain note while work is
  // pending (not idle), and conclude once every execution has finished.
  let pending = () => true;
  const model: Model = {
    name: "three-then-conclude",
    step(req: ModelRequest): Promise<ModelReply> {
      const rev = req.state.revision;
      if (rev === 0) return Promise.resolve({ patch: adds(0, 1, [mark("a"), mark("b"), mark("c")]), usage: null });
      const nextId = Math.max(0, ...req.state.cells.map((c) => c.id)) + 1;
      return Promise.resolve({ patch: adds(rev, nextId, [pending() ? note("waiting for cells") : conclude("success")]), usage: null });
    },
  };
  let gateDuringQueued = false;
  const linesAtStarted = new Map<number, number>();
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued")) gateDuringQueued ||= await gateShowsUp(p.cwd);
    for (const e of events) if (e.kind === "execution_started") linesAtStarted.set(e.body.cell_id, p.lines().length);
    return real(events);
  });
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "three cells", cwd: p.cwd });
    pending = () => [...h.session(id)!.executions.values()].some((ex) => ex.phase !== "finished");
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
    for (const c of [1, 2, 3]) assert.equal(h.session(id)!.executions.get(c)?.result, "success", `cell ${c}`);
  }).finally(() => storage.close());
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cells was in flight");
  assert.deepEqual([...linesAtStarted.entries()], [[1, 0], [2, 1], [3, 2]], "a cell ran before its `started` commit, or out of order, or twice");
  assert.deepEqual(p.lines(), ["a", "b", "c"], "each cell ran exactly once, in order");
  assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
});

test("a cancel note in the same patch comes first: the gate started ahead is discarded, the cell never runs and is recorded cancelled", async (t) => {
  const p = project("cairn-early-gate-cancel-");
  t.after(() => p.tmp.cleanup());
  const model = scripted([adds(0, 1, [mark("ran"), note("never mind", { role: "cancel", target_cell_id: 1 })]), adds(1, 3, [conclude("failure")])]);
  let gateDuringQueued = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued")) gateDuringQueued ||= await gateShowsUp(p.cwd);
    return real(events);
  });
  let left: number[] = [];
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "cancelled before launch", cwd: p.cwd });
    await h.wait(id);
    const ex = h.session(id)!.executions.get(1);
    assert.equal(ex?.phase, "finished");
    assert.equal(ex?.result, "cancelled");
    assert.equal(ex?.started, null, "the cancelled cell was started");
    left = await noneLeft(p.cwd); // before close: the run's end alone must not leave the gate
  }).finally(() => storage.close());
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cell was in flight");
  assert.deepEqual(left, [], "the gate started ahead outlived the run (it was not discarded by the cancel)");
  assert.deepEqual(p.lines(), [], "the cancelled cell ran");
});

test("a failure conclusion in the same patch ends the run first: the gate started ahead ends with the run, nothing ran", async (t) => {
  const p = project("cairn-early-gate-conclude-");
  t.after(() => p.tmp.cleanup());
  const model = scripted([adds(0, 1, [mark("ran"), conclude("failure", "giving up at once")])]);
  let gateDuringQueued = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued")) gateDuringQueued ||= await gateShowsUp(p.cwd);
    return real(events);
  });
  let left: number[] = [];
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "concluded with a queued cell", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "failure");
    assert.equal(h.session(id)!.executions.get(1)?.started ?? null, null, "the cell was started after the run's end");
    left = await noneLeft(p.cwd);
  }).finally(() => storage.close());
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cell was in flight");
  assert.deepEqual(left, [], "the gate started ahead outlived the run");
  assert.deepEqual(p.lines(), [], "a cell ran after its run ended");
});

test("the wall-time budget runs out while the queued commit is in flight: the run ends, the gate started ahead ends, nothing ran", async (t) => {
  const p = project("cairn-early-gate-budget-");
  t.after(() => p.tmp.cleanup());
  const model = scripted([adds(0, 1, [mark("ran")]), adds(1, 2, [conclude("success")])]);
  let gateDuringQueued = false;
  let createdAt = 0;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "session_created")) createdAt = Date.now();
    if (hasKind(events, "execution_queued")) {
      gateDuringQueued ||= await gateShowsUp(p.cwd);
      // Held past the 1 s budget (its timer fires while this commit is in flight).
      while (Date.now() < createdAt + 1_500) await sleep(50);
    }
    return real(events);
  });
  let left: number[] = [];
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "out of time", cwd: p.cwd, budgets: { max_wall_seconds: 1 } });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "failure");
    assert.match(outcome.reason, /wall-time/);
    assert.equal(h.session(id)!.executions.get(1)?.started ?? null, null, "the cell was started after the budget ran out");
    left = await noneLeft(p.cwd);
  }).finally(() => storage.close());
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cell was in flight");
  assert.deepEqual(left, [], "the gate started ahead outlived the run");
  assert.deepEqual(p.lines(), [], "the cell ran after the budget ran out");
});

test("a queued commit that lands but reports an unknown outcome: the poisoned harness leaves no gate and runs nothing; the next owner runs the cell once", async (t) => {
  const p = project("cairn-early-gate-poison-");
  t.after(() => p.tmp.cleanup());
  const model = () => scripted([adds(0, 1, [mark("ran")]), adds(1, 2, [conclude("success")])]);
  let gateDuringQueued = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (!hasKind(events, "execution_queued")) return real(events);
    gateDuringQueued = await gateShowsUp(p.cwd);
    await real(events); // durable, but the caller is told the outcome is unknown
    throw new StorageFailure("test: the connection dropped after the commit was sent");
  });
  const h = await Harness.open({ storage, name: "early", model: model(), workDir: p.work });
  const id = await h.start({ goal: "poisoned", cwd: p.cwd });
  await assert.rejects(h.wait(id), StorageFailure);
  const left = await noneLeft(p.cwd); // before close: the poisoning alone must end the gate
  const ranBeforeClose = p.lines().length;
  await h.close();
  await storage.close();
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cell was in flight");
  assert.deepEqual(left, [], "the gate started ahead outlived the poisoned harness");
  assert.equal(ranBeforeClose, 0, "the cell ran although its `started` was never committed");

  const storage2 = createSqliteStorage({ dataDir: p.data });
  await withHarness({ storage: storage2, name: "early", model: model(), workDir: p.work }, async (h2) => {
    await h2.resume();
    const outcome = await h2.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
    assert.equal(h2.session(id)!.executions.get(1)?.result, "success");
  }).finally(() => storage2.close());
  assert.deepEqual(p.lines(), ["ran"], "the cell ran exactly once");
});

test("a harness closed while the queued commit is in flight and that commit is then refused: no gate outlives close, nothing ran", async (t) => {
  const p = project("cairn-early-gate-close-refused-");
  t.after(() => p.tmp.cleanup());
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let gateSeen = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (!hasKind(events, "execution_queued")) return real(events);
    gateSeen = await gateShowsUp(p.cwd);
    await held;
    throw new StorageRejected("backlog_full", "test: refused while closing");
  });
  const h = await Harness.open({ storage, name: "early", model: scripted([adds(0, 1, [mark("ran")])]), workDir: p.work });
  await h.start({ goal: "closed, refused", cwd: p.cwd });
  await until("the gate started ahead", () => (gateSeen ? true : undefined), 30_000);
  const closing = h.close();
  release();
  await closing;
  const left = await noneLeft(p.cwd);
  await storage.close();
  assert.deepEqual(left, [], "a gate started ahead outlived close()");
  assert.deepEqual(p.lines(), [], "the cell ran although its commit was refused and its harness closed");
});

test("two rounds, each queueing a cell after the previous cell's carried result: each early gate is its own cell's, output chunks are numbered from 0 without gaps", async (t) => {
  const p = project("cairn-early-gate-output-");
  t.after(() => p.tmp.cleanup());
  // About 200,000 characters of output: 13 events of at most 16,384, over two commits at least.
  const loud = (word: string) => cmd("sh", "-c", `echo ${word} >> marker; head -c 200000 /dev/zero | tr '\\0' ${word.slice(0, 1)}`);
  const model = scripted([adds(0, 1, [loud("first")]), adds(1, 2, [loud("second")]), adds(2, 3, [conclude("success")])]);
  let gatesDuringQueued = 0;
  const linesAtStarted = new Map<number, number>();
  const output = new Map<number, { n: number; data: string }[]>();
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued") && (await gateShowsUp(p.cwd))) gatesDuringQueued++;
    for (const e of events) {
      if (e.kind === "execution_started") linesAtStarted.set(e.body.cell_id, p.lines().length);
      if (e.kind === "execution_output") {
        const list = output.get(e.body.cell_id) ?? [];
        list.push({ n: e.body.n, data: e.body.data });
        output.set(e.body.cell_id, list);
      }
    }
    return real(events);
  });
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "loud cells", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
    for (const c of [1, 2]) assert.equal(h.session(id)!.executions.get(c)?.result, "success", `cell ${c}`);
  }).finally(() => storage.close());
  assert.equal(gatesDuringQueued, 2, "a gate was not started ahead for each queued cell");
  assert.deepEqual([...linesAtStarted.entries()], [[1, 0], [2, 1]], "a cell ran before its `started` commit, or twice");
  assert.deepEqual(p.lines(), ["first", "second"], "each cell ran once, with its own command");
  for (const [c, letter] of [[1, "f"], [2, "s"]] as const) {
    const chunks = output.get(c) ?? [];
    assert.ok(chunks.length > 8, `cell ${c}'s output took one commit only (${chunks.length} events)`);
    assert.deepEqual(chunks.map((x) => x.n), chunks.map((_, i) => i), `cell ${c}'s output chunks are not numbered 0..n-1`);
    const text = chunks.map((x) => x.data).join("");
    assert.equal(text, letter.repeat(200_000), `cell ${c}'s output is not its own`);
  }
  assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
});

test("the wall-time budget runs out during the model call: the late patch's gate started ahead ends with the run, nothing ran", async (t) => {
  const p = project("cairn-early-gate-late-");
  t.after(() => p.tmp.cleanup());
  let createdAt = 0;
  let modelReturned = false;
  // A model that answers only after the 1 s budget has run out (it does not heed the abort).
  const model: Model = {
    name: "slow",
    async step(req: ModelRequest): Promise<ModelReply> {
      while (Date.now() < createdAt + 1_500) await sleep(50);
      modelReturned = true;
      return { patch: adds(req.state.revision, 1, [mark("ran")]), usage: null };
    },
  };
  let queuedCommits = 0;
  let gateDuringQueued = false;
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "session_created")) createdAt = Date.now();
    if (hasKind(events, "execution_queued")) {
      queuedCommits++;
      gateDuringQueued ||= await gateShowsUp(p.cwd);
    }
    return real(events);
  });
  let left: number[] = [];
  await withHarness({ storage, name: "early", model, workDir: p.work }, async (h) => {
    const id = await h.start({ goal: "slow model", cwd: p.cwd, budgets: { max_wall_seconds: 1 } });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "failure");
    await until("the model's late answer", () => modelReturned, 20_000);
    await h.settled();
    assert.equal(h.session(id)!.executions.get(1)?.started ?? null, null, "a cell was started after the run ended");
    left = await noneLeft(p.cwd);
  }).finally(() => storage.close());
  // The late patch is admitted after `run_ended` (its verdict queues the cell), so a gate is started
  // ahead for a run that has ended: it must end, and nothing may run.
  assert.equal(queuedCommits, 1, "the late patch did not queue its cell (this test no longer reaches a gate started ahead)");
  assert.ok(gateDuringQueued, "no gate was started ahead for the late patch's cell");
  assert.deepEqual(left, [], "the gate started ahead outlived the run");
  assert.deepEqual(p.lines(), [], "a cell ran after its run ended");
});

test("resume() (recovery) while the cell's queued commit is in flight and again right after its `started` commit: it is not recorded as UnknownExecution and runs once", async (t) => {
  const p = project("cairn-early-gate-recover-");
  t.after(() => p.tmp.cleanup());
  const model = scripted([adds(0, 1, [mark("ran")]), adds(1, 2, [conclude("success")])]);
  let gateDuringQueued = false;
  let resumeDuringQueued: Promise<unknown> = Promise.resolve();
  const storage = onCommit(createSqliteStorage({ dataDir: p.data }), async (events, real) => {
    if (hasKind(events, "execution_queued")) {
      gateDuringQueued = await gateShowsUp(p.cwd);
      resumeDuringQueued = h.resume();
      await resumeDuringQueued;
    }
    return real(events);
  });
  const h = await Harness.open({ storage, name: "early", model, workDir: p.work });
  const recovered: number[] = [];
  const linesAtStartedFolded: number[] = [];
  const stop = h.follow((events) => {
    if (!events.some((e) => e.kind === "execution_started")) return;
    linesAtStartedFolded.push(p.lines().length);
    // `started` is folded and the launch has not released the gate yet: recovery must leave it alone.
    void h.resume().then((r) => recovered.push(r.recovered));
  });
  try {
    const id = await h.start({ goal: "recover meanwhile", cwd: p.cwd });
    const outcome = await h.wait(id);
    assert.equal(outcome.result, "success", outcome.reason);
    await resumeDuringQueued;
    await until("the second resume", () => recovered.length > 0, 20_000);
    assert.equal(h.session(id)!.executions.get(1)?.result, "success", "the cell's execution is not its own result");
  } finally {
    stop();
    await h.close();
    await storage.close();
  }
  assert.ok(gateDuringQueued, "no gate was started ahead while the commit that queues the cell was in flight");
  assert.deepEqual(recovered, [0], "recovery recorded the cell being launched as UnknownExecution");
  assert.deepEqual(linesAtStartedFolded, [0], "the cell ran before its `started` commit");
  assert.deepEqual(p.lines(), ["ran"], "the cell ran exactly once");
  assert.deepEqual(await noneLeft(p.cwd), [], "a gate is left running");
});
