/**
 * Lost acknowledgements: the sqlite commit becomes durable, then its acknowledgement is lost
 * (the adapter's `commit:after-durable` fault point throws). The harness must treat the outcome as
 * unknown (StorageFailure: poisoned, launching nothing more), and a NEW harness on the same files must
 * learn the truth from the log: the committed batch is there, nothing is done twice, nothing is lost.
 *
 * Three batches lose their acknowledgement, one per test: the accepted patch (then `submit` of the
 * same patch is a replay and another patch is a round_conflict), the launch authorization
 * (`execution_started`: the gate is aborted, so the cell never ran, and recovery says UnknownExecution)
 * and the result (`execution_finished`: the cell ran once and its recorded result stands).
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Harness } from "../src/harness/harness.js";
import type { EventKind } from "../src/state/events.js";
import type { FaultHook } from "../src/storage/contract.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";
import { cleanupProcesses } from "./support/cli.js";
import { effectLines, endedByConclusion, observedByModel, oneFinish, oneStart, recoveredUnknown } from "./support/checks.js";
import { brief, finishesOf, ofKind, readLog, startsOf } from "./support/log.js";
import { PolicyModel } from "./support/model.js";
import { cmdPatch, concludePatch } from "./support/patches.js";
import { tagBatches } from "./support/tagging.js";
import { withHarness } from "../test/support/harness.js";

const DB = "chaos";
const APPEND = ["sh", "-c", "echo ran >> effect.txt"];
const root = mkdtempSync(join(tmpdir(), "cairn-chaos-ack-"));

interface FirstLife {
  readonly dir: string;
  readonly data: string;
  readonly work: string;
  readonly model: PolicyModel;
}

/**
 * Starts a run on sqlite whose commit of the first batch holding a `target` event loses its
 * acknowledgement; waits until the harness is poisoned; closes it. Returns where it lived.
 */
async function firstLife(name: string, target: EventKind): Promise<FirstLife> {
  const dir = join(root, name);
  const data = join(dir, "data");
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  let armed = false;
  let lost = 0;
  const faults: FaultHook = (point) => {
    if (point !== "commit:after-durable" || !armed) return;
    armed = false;
    lost += 1;
    throw new Error(`chaos: the acknowledgement of the ${target} batch was lost`);
  };
  const storage = tagBatches(createSqliteStorage({ dataDir: data, faults }), (events) => {
    if (lost === 0 && events.some((e) => e.kind === target)) armed = true;
  });
  const model = new PolicyModel(APPEND);
  await withHarness({ storage, name: DB, model, workDir: dir }, async (h) => {
    const session = await h.start({ goal: "append one line to effect.txt", cwd: work });
    await assert.rejects(h.wait(session), (err: Error & { code?: string }) => {
      assert.equal(err.code, "uncertain", `the harness must stop on the lost acknowledgement, got ${err.message}`);
      return true;
    });
    assert.equal(lost, 1, `the ${target} batch lost its acknowledgement`);
    assert.equal(h.status, "poisoned");
    await assert.rejects(h.post(session, { id: "late", kind: "note", payload: null }), (err: Error & { code?: string }) => err.code === "uncertain");
    await h.settled();
  }).finally(() => storage.close());
  return { dir, data, work, model };
}

/** Opens a new storage and harness on the same files (as a restarted process would). */
async function reopen(life: FirstLife): Promise<{ h: Harness; close(): Promise<void> }> {
  const storage = createSqliteStorage({ dataDir: life.data });
  const h = await Harness.open({ storage, name: DB, model: life.model, workDir: life.dir, create: false });
  return {
    h,
    close: async () => {
      await h.close();
      await storage.close();
    },
  };
}

describe("lost acknowledgements on sqlite", () => {
  after(() => {
    cleanupProcesses();
    rmSync(root, { recursive: true, force: true });
  });

  test("patch_accepted: the patch is in the log, re-submitting it is a replay, another patch is a round_conflict, the cell runs once", async () => {
    const life = await firstLife("patch", "patch_accepted");
    let log = await readLog(life.data, DB);
    const accepted = ofKind(log, "patch_accepted");
    assert.equal(accepted.length, 1, `the batch whose acknowledgement was lost is durable:\n${brief(log)}`);
    assert.equal(accepted[0]!.body.turn, "s1:t1");
    assert.equal(ofKind(log, "execution_queued").length, 1);
    assert.equal(startsOf(log, 1).length, 0, "a poisoned harness launches nothing");
    assert.equal(effectLines(join(life.work, "effect.txt")), 0);

    const second = await reopen(life);
    try {
      const { h } = second;
      const head0 = (await readLog(life.data, DB)).length;
      const same = cmdPatch(0, 1, APPEND);
      const replay = await h.submit("s1", "s1:t1", same);
      assert.ok(replay.ok, JSON.stringify(replay));
      assert.equal(replay.receipt.replay, true);
      assert.equal(replay.receipt.revision, 1);
      assert.deepEqual(replay.receipt.newCells.map((c) => c.id), [1], "a replayed receipt names the cells the round created");
      // Key order does not make another patch.
      const reordered = same.map((op) => Object.fromEntries(Object.entries(op).reverse()));
      const again = await h.submit("s1", "s1:t1", reordered);
      assert.ok(again.ok && again.receipt.replay, JSON.stringify(again));
      const other = await h.submit("s1", "s1:t1", cmdPatch(0, 1, ["sh", "-c", "echo other >> effect.txt"]));
      assert.equal(other.ok, false);
      assert.equal(!other.ok && other.code, "round_conflict");

      // A round not accepted yet belongs to the round loop: submit refuses it and commits nothing.
      await assert.rejects(h.submit("s1", "s1:t2", concludePatch(1, 2, "success", "early")), (err: Error & { code?: string }) => err.code === "config");
      const before = (await readLog(life.data, DB)).length;
      assert.equal(before, head0, "a replay or a conflict commits nothing");
      const r = await h.resume();
      assert.deepEqual(r, { sessions: ["s1"], recovered: 0 });
      const outcome = await h.wait("s1");
      assert.equal(outcome.result, "success", outcome.reason);
      log = await readLog(life.data, DB);
      assert.ok(log.length > before);
    } finally {
      await second.close();
    }
    oneStart(log, 1);
    assert.equal(oneFinish(log, 1).body.result, "success");
    assert.equal(ofKind(log, "patch_accepted").filter((e) => e.body.turn === "s1:t1").length, 1);
    assert.equal(readFileSync(join(life.work, "effect.txt"), "utf8"), "ran\n", "the accepted patch's cell ran exactly once; the conflicting one never");
    assert.equal(life.model.callsFor("s1:t1"), 1, "round 1 was never asked again");
    assert.equal(observedByModel(log, 1), "execution_success");
    endedByConclusion(log, "success");
  });

  test("execution_started: the gate is aborted (the cell never ran); the next owner records UnknownExecution and never launches it", async () => {
    const life = await firstLife("started", "execution_started");
    let log = await readLog(life.data, DB);
    const start = oneStart(log, 1);
    assert.equal(finishesOf(log, 1).length, 0, `the launch is authorized in the log, its result is not:\n${brief(log)}`);
    assert.equal(effectLines(join(life.work, "effect.txt")), 0, "the gate was never released");

    const second = await reopen(life);
    try {
      const r = await second.h.resume();
      assert.deepEqual(r, { sessions: ["s1"], recovered: 1 });
      const outcome = await second.h.wait("s1");
      assert.equal(outcome.result, "success", outcome.reason);
    } finally {
      await second.close();
    }
    log = await readLog(life.data, DB);
    recoveredUnknown(log, 1, true);
    assert.equal(startsOf(log, 1).length, 1, "never launched again");
    assert.equal(effectLines(join(life.work, "effect.txt")), 0, "never ran");
    assert.equal(observedByModel(log, 1), "execution_UnknownExecution");
    const resolution = ofKind(log, "control_handled").find((e) => e.body.role === "resolution");
    assert.ok(resolution !== undefined && resolution.body.outcome === "resolved", "the model resolved it with the recorded evidence");
    assert.match(resolution.body.detail, new RegExp(`event:${start.seq}\\b`));
    endedByConclusion(log, "success");
  });

  test("execution_finished: the cell ran once; its durable result stands and nothing is re-run or recovered", async () => {
    const life = await firstLife("finished", "execution_finished");
    let log = await readLog(life.data, DB);
    oneStart(log, 1);
    assert.equal(oneFinish(log, 1).body.result, "success", `the result whose acknowledgement was lost is durable:\n${brief(log)}`);
    assert.equal(effectLines(join(life.work, "effect.txt")), 1);

    const second = await reopen(life);
    try {
      const r = await second.h.resume();
      assert.deepEqual(r, { sessions: ["s1"], recovered: 0 }, "a finished execution is not recovered again");
      const outcome = await second.h.wait("s1");
      assert.equal(outcome.result, "success", outcome.reason);
    } finally {
      await second.close();
    }
    log = await readLog(life.data, DB);
    oneStart(log, 1);
    assert.equal(oneFinish(log, 1).body.result, "success");
    assert.equal(effectLines(join(life.work, "effect.txt")), 1, "ran exactly once");
    assert.equal(observedByModel(log, 1), "execution_success");
    endedByConclusion(log, "success");
  });
});
