/**
 * The kill matrix: a real `cairn run` on sqlite is SIGKILLed at each commit boundary of a
 * cell's life, then `cairn resume` (a new process) finishes the run. The cell appends one line to an
 * effect file, so "ran once", "never ran" and "ran twice" are visible on disk, and the log must agree.
 *
 *   patch:committed               -> the queued cell runs exactly once after resume (success)
 *   execution:started-committed   -> the child never ran; UnknownExecution; never re-run
 *   (outside SIGKILL while it runs) -> UnknownExecution; the surviving group is found by pid AND start
 *                                    time and stopped; never re-run
 *   execution:exited              -> the child ran once; UnknownExecution; never re-run
 *
 * Each case first proves the kill happened where it should (signal SIGKILL, and the log ends exactly
 * at that boundary), so the suite cannot pass by doing nothing.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { cleanupProcesses, describe as said, runCairn, startCairn } from "./support/cli.js";
import { effectLines, endedByConclusion, observedByModel, oneFinish, oneStart, recoveredUnknown } from "./support/checks.js";
import { brief, finishesOf, ofKind, readLog, startsOf } from "./support/log.js";
import { cmdPatch, concludePatch, resolvePatch, writeScript } from "./support/patches.js";
import { alive, groupMembers, processesRunning, stat, track, until } from "./support/procs.js";

const DB = "chaos";
const GOAL = "append one line to effect.txt";
const APPEND = ["sh", "-c", "echo ran >> effect.txt"];

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-matrix-"));

interface Case {
  readonly dir: string;
  readonly data: string;
  readonly work: string;
  readonly effect: string;
  readonly model: string;
  run(env?: Record<string, string>): ReturnType<typeof startCairn>;
  resume(model?: string): ReturnType<typeof runCairn>;
}

function makeCase(name: string): Case {
  const dir = join(root, name);
  const data = join(dir, "data");
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  const model = join(dir, "model.json");
  const common = (m: string) => ["--db", DB, "--data-dir", data, "--model", `scripted:${m}`];
  return {
    dir,
    data,
    work,
    effect: join(work, "effect.txt"),
    model,
    run: (env = {}) => startCairn(["run", GOAL, ...common(model), "--cwd", work], env),
    resume: (m = model) => runCairn(["resume", ...common(m)]),
  };
}

describe("kill matrix: a real cairn process SIGKILLed at every commit boundary", () => {
  after(() => {
    cleanupProcesses();
    rmSync(root, { recursive: true, force: true });
  });

  test("patch:committed: the queued cell runs exactly once after resume", async () => {
    const c = makeCase("patch-committed");
    writeScript(c.model, [cmdPatch(0, 1, APPEND), concludePatch(1, 2, "success", "the line was appended once")]);

    const killed = await c.run({ CAIRN_CHAOS_KILL_AT: "patch:committed" }).result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await readLog(c.data, DB);
    assert.equal(ofKind(log, "patch_accepted").length, 1, `the patch is committed before the kill:\n${brief(log)}`);
    assert.equal(ofKind(log, "execution_queued").length, 1);
    assert.equal(startsOf(log, 1).length, 0, "killed before dispatch: nothing started");
    assert.equal(effectLines(c.effect), 0);

    const resumed = await c.resume();
    assert.equal(resumed.code, 0, said(resumed));
    log = await readLog(c.data, DB);
    oneStart(log, 1);
    const fin = oneFinish(log, 1);
    assert.equal(fin.body.result, "success", String(fin.body.detail));
    assert.equal(fin.body.unknown, null);
    assert.equal(effectLines(c.effect), 1, "the cell ran exactly once");
    assert.equal(observedByModel(log, 1), "execution_success");
    endedByConclusion(log, "success");
  });

  test("execution:started-committed: the child never runs, and resume records UnknownExecution without re-running", async () => {
    const c = makeCase("started-committed");
    writeScript(c.model, [cmdPatch(0, 1, APPEND), concludePatch(1, 2, "failure", "cell 1 is unknown; giving up")]);

    const killed = await c.run({ CAIRN_CHAOS_KILL_AT: "execution:started-committed" }).result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await readLog(c.data, DB);
    const start = oneStart(log, 1);
    assert.equal(finishesOf(log, 1).length, 0, "killed before any result");
    // The gate was never released; with its parent dead it reads end-of-file and exits on its own.
    await until(`the unreleased gate (pid ${start.body.pid}) to exit`, () => (alive(start.body.pid, start.body.start_time) ? undefined : true), 60_000);
    assert.equal(effectLines(c.effect), 0, "the cell's code never ran");

    const resumed = await c.resume();
    assert.equal(resumed.code, 1, said(resumed));
    log = await readLog(c.data, DB);
    recoveredUnknown(log, 1, true);
    assert.equal(startsOf(log, 1).length, 1, "never launched again");
    assert.equal(effectLines(c.effect), 0, "never ran, before or after resume");
    assert.equal(observedByModel(log, 1), "execution_UnknownExecution");
    endedByConclusion(log, "failure");

    // What an operator sees: `cairn status --json` (a reader; no ownership taken).
    const status = await runCairn(["status", "--db", DB, "--data-dir", c.data, "--json"]);
    assert.equal(status.code, 0, said(status));
    const doc = JSON.parse(status.stdout) as {
      sessions: { status: string; executions: { cell_id: number; phase: string; result: string | null }[]; unresolved_unknown: { cell_id: number; reason: string; worker_stopped: boolean }[] }[];
    };
    const s = doc.sessions[0]!;
    assert.equal(s.status, "failure");
    assert.deepEqual(
      s.executions.map((e) => [e.cell_id, e.phase, e.result]),
      [[1, "finished", "UnknownExecution"]],
    );
    assert.deepEqual(s.unresolved_unknown.map((u) => [u.cell_id, u.reason, u.worker_stopped]), [[1, "worker_lost_before_result_commit", true]]);
  });

  test("SIGKILL while the child runs: the survivor is found by pid and start time, its group stopped, nothing re-run", async () => {
    const c = makeCase("while-running");
    // A sleep of its own length, so this host's pid of it can be found (the cell's own pids are its sandbox's).
    const sleepArgv = ["sleep", `30.${process.pid}`];
    const argv = ["sh", "-c", `echo ran >> effect.txt; ${sleepArgv.join(" ")} & touch sleep.started; wait`];
    writeScript(c.model, [cmdPatch(0, 1, argv)]);

    const proc = c.run();
    const sleepPid = await until("the cell to append its line and start its sleep", () => (existsSync(join(c.work, "sleep.started")) ? processesRunning(sleepArgv)[0] : undefined));
    track(sleepPid);
    const sleepStart = stat(sleepPid)?.startTime;
    assert.ok(sleepStart !== undefined, "the sleep is running");
    proc.child.kill("SIGKILL");
    const killed = await proc.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));

    let log = await readLog(c.data, DB);
    const start = oneStart(log, 1);
    track(start.body.pid);
    assert.equal(finishesOf(log, 1).length, 0, "killed before any result");
    assert.equal(effectLines(c.effect), 1);
    // The survivors are really there (so recovery has something to find), and the log names them.
    assert.ok(alive(sleepPid, sleepStart), "the cell's sleep outlived the harness");
    assert.ok(alive(start.body.pid), "the cell's leader outlived the harness");
    assert.equal(stat(start.body.pid)!.startTime, start.body.start_time, "the recorded start time is the leader's");
    assert.equal(start.body.pgid, start.body.pid, "the cell leads its own process group");
    assert.equal(stat(sleepPid)!.pgid, start.body.pgid, "the sleep is in the cell's group");

    // The resumed model resolves the UnknownExecution with evidence from the log, then concludes success.
    const model2 = join(c.dir, "model-resume.json");
    writeScript(model2, [
      cmdPatch(0, 1, argv),
      resolvePatch(1, 2, 1, [`event:${start.seq}`], [{ id: 3, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "the line is there" }]),
    ]);
    const resumed = await c.resume(model2);
    assert.equal(resumed.code, 0, said(resumed));

    log = await readLog(c.data, DB);
    recoveredUnknown(log, 1, true);
    assert.equal(startsOf(log, 1).length, 1, "never launched again");
    assert.equal(effectLines(c.effect), 1, "ran exactly once");
    assert.ok(!alive(sleepPid, sleepStart), "the surviving sleep was stopped");
    assert.ok(!alive(start.body.pid, start.body.start_time), "the surviving leader was stopped");
    assert.deepEqual(groupMembers(start.body.pgid), [], "the cell's process group is empty");
    assert.equal(observedByModel(log, 1), "execution_UnknownExecution");
    const handled = ofKind(log, "control_handled").map((e) => [e.body.note_id, e.body.role, e.body.outcome]);
    assert.deepEqual(handled, [
      [2, "resolution", "resolved"],
      [3, "conclusion", "concluded"],
    ]);
    endedByConclusion(log, "success");
  });

  test("execution:exited: the child ran once; resume records UnknownExecution and does not re-run it", async () => {
    const c = makeCase("exited");
    writeScript(c.model, [cmdPatch(0, 1, APPEND), concludePatch(1, 2, "failure", "cell 1's outcome is unknown")]);

    const killed = await c.run({ CAIRN_CHAOS_KILL_AT: "execution:exited" }).result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await readLog(c.data, DB);
    const start = oneStart(log, 1);
    assert.equal(finishesOf(log, 1).length, 0, "killed before the result commit");
    assert.equal(effectLines(c.effect), 1, "the child ran before the kill");
    assert.ok(!alive(start.body.pid, start.body.start_time), "the child has exited");

    const resumed = await c.resume();
    assert.equal(resumed.code, 1, said(resumed));
    log = await readLog(c.data, DB);
    recoveredUnknown(log, 1, true);
    assert.equal(startsOf(log, 1).length, 1, "never launched again");
    assert.equal(effectLines(c.effect), 1, "ran exactly once");
    assert.equal(observedByModel(log, 1), "execution_UnknownExecution");
    endedByConclusion(log, "failure");
  });
});
