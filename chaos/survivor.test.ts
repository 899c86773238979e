/**
 * Surviving children and recycled pids.
 *
 * 1. A harness in another process (a real `cairn run`) starts a cell whose process group holds a long
 *    `sleep`; the harness is SIGKILLed. Resumed in this process, recovery must find the survivor by
 *    pid AND start time, stop its whole group, record UnknownExecution with worker_stopped true, and do
 *    all of that BEFORE any new cell is launched: checked at the moment the next launch is committed,
 *    from inside the next cell itself, and by event order.
 * 2. Fail closed: a log whose `execution_started` names a live process that is NOT the one recorded (a
 *    recycled pid: same pid, another start time), or a process on another host, must never be
 *    signalled. Recovery records UnknownExecution with worker_stopped false and the process lives on.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Harness } from "../src/harness/harness.js";
import { ScriptedModel } from "../src/model/scripted.js";
import { bootId, hostName } from "../src/exec/identity.js";
import { event, identity, turnId, type LogEvent, type NewEvent } from "../src/state/events.js";
import { createSqliteStorage } from "../storage-adapters/sqlite/index.js";
import { cleanupProcesses, describe as said, startCairn } from "./support/cli.js";
import { effectLines, endedByConclusion, observedByModel, oneFinish, oneStart, recoveredUnknown } from "./support/checks.js";
import { brief, finishesOf, ofKind, readLog } from "./support/log.js";
import { cmdPatch, concludePatch, resolvePatch, writeScript } from "./support/patches.js";
import { alive, groupMembers, processesRunning, stat, track, until } from "./support/procs.js";
import { withHarness } from "../test/support/harness.js";

const DB = "chaos";
const root = mkdtempSync(join(tmpdir(), "cairn-chaos-survivor-"));
const spawned: ChildProcess[] = [];

function caseDirs(name: string) {
  const dir = join(root, name);
  const data = join(dir, "data");
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  return { dir, data, work };
}

describe("surviving children and recycled pids", () => {
  after(() => {
    for (const c of spawned) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    cleanupProcesses();
    rmSync(root, { recursive: true, force: true });
  });

  test("a cell's surviving process group is stopped before any new cell is launched", async () => {
    const { dir, data, work } = caseDirs("survivor");
    // A sleep of its own length, so this host's pid of it can be found (the cell's own pids are its sandbox's).
    const sleepArgv = ["sleep", `30.${process.pid}`];
    const argv = ["sh", "-c", `echo ran >> effect.txt; ${sleepArgv.join(" ")} & touch sleep.started; wait`];
    const model1 = join(dir, "model.json");
    writeScript(model1, [cmdPatch(0, 1, argv)]);
    const proc = startCairn(["run", "leave a survivor", "--db", DB, "--data-dir", data, "--cwd", work, "--model", `scripted:${model1}`]);
    const sleepPid = await until("the cell's sleep to start", () => (existsSync(join(work, "sleep.started")) ? processesRunning(sleepArgv)[0] : undefined));
    track(sleepPid);
    const sleepStart = stat(sleepPid)!.startTime;
    proc.child.kill("SIGKILL");
    const killed = await proc.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));

    const before = await readLog(data, DB);
    const start = oneStart(before, 1);
    track(start.body.pid);
    const pgid = start.body.pgid;
    assert.equal(finishesOf(before, 1).length, 0);
    assert.ok(alive(sleepPid, sleepStart), "the sleep survived its harness");
    assert.ok(groupMembers(pgid).length >= 2, "the cell's group (leader and sleep) survived its harness");

    // The next cell reports, from inside, whether the old group still has a live member when it runs.
    const probe = `alive=gone; for f in /proc/[0-9]*/stat; do set -- $(sed 's/.*) //' "$f" 2>/dev/null); [ "$3" = "${pgid}" ] && [ "$1" != Z ] && alive=alive; done; echo $alive >> probe.txt`;
    const model = new ScriptedModel({
      rounds: [
        { patch: cmdPatch(0, 1, argv) },
        { patch: resolvePatch(1, 2, 1, [`event:${start.seq}`], [{ id: 3, previous_id: null, kind: "cmd", argv: ["sh", "-c", probe] }]) },
        { patch: concludePatch(2, 4, "success", "the survivor was stopped before the probe ran") },
      ],
    });
    const storage = createSqliteStorage({ dataDir: data });
    // Without a sandbox: the probe cell must see this host's /proc (a sandboxed one sees only its own).
    const h = await Harness.open({ storage, name: DB, model, workDir: dir, create: false, sandbox: { mode: "none" } });
    const liveAtNextLaunch: number[][] = [];
    const unfollow = h.follow((events) => {
      for (const e of events) if (e.kind === "execution_started") liveAtNextLaunch.push(groupMembers(pgid));
    });
    try {
      const r = await h.resume();
      assert.deepEqual(r, { sessions: ["s1"], recovered: 1 });
      // Recovery is over when resume() returns: the group must already be empty.
      assert.deepEqual(groupMembers(pgid), [], "resume() returns only after the survivor's group is stopped");
      const outcome = await h.wait("s1");
      assert.equal(outcome.result, "success", outcome.reason);
    } finally {
      unfollow();
      await h.close();
      await storage.close();
    }

    const log = await readLog(data, DB);
    const unknown = recoveredUnknown(log, 1, true);
    assert.match(unknown.body.detail ?? "", /still running/, "recovery says it found the process running");
    assert.ok(!alive(sleepPid, sleepStart), "the sleep is gone");
    assert.deepEqual(liveAtNextLaunch, [[]], "when the next launch was committed, the old group was already empty");
    assert.equal(readFileSync(join(work, "probe.txt"), "utf8"), "gone\n", "the next cell saw no live member of the old group");
    const next = oneStart(log, 3);
    assert.ok(unknown.seq < next.seq, `the UnknownExecution precedes the next launch:\n${brief(log)}`);
    for (const e of ofKind(log, "execution_started")) if (e.body.cell_id !== 1) assert.ok(e.seq > unknown.seq);
    assert.equal(oneFinish(log, 3).body.result, "success");
    assert.equal(effectLines(join(work, "effect.txt")), 1, "cell 1 ran once");
    assert.equal(observedByModel(log, 1), "execution_UnknownExecution");
    endedByConclusion(log, "success");
  });

  test("fail closed: a recycled pid and a process on another host are never signalled", async () => {
    const { dir, data, work } = caseDirs("recycled");
    // Two live processes that are not Cairn's cells, each leading its own process group.
    const victims = [0, 1].map(() => {
      const c = spawn("sleep", ["60"], { detached: true, stdio: "ignore" });
      spawned.push(c);
      return c;
    });
    const ids = victims.map((c) => {
      const s = stat(c.pid!);
      assert.ok(s !== null && s.pgid === c.pid, "each victim leads its own group");
      return { pid: c.pid!, start: s.startTime };
    });
    const recycled = ids[0]!;
    const remote = ids[1]!;
    const cellArgv = ["sh", "-c", "echo ran >> effect.txt"];

    // s1: same host and boot, the victim's pid and pgid, another start time (the pid was reused).
    // s2: the victim's exact pid, pgid and start time, but recorded on another host.
    const storage = createSqliteStorage({ dataDir: data });
    const db = await storage.open(DB);
    const at = new Date().toISOString();
    const sessionEvents = (s: string, started: { host: string; pid: number; start_time: string }): NewEvent[] => {
      const turn = turnId(s, 1);
      const patch = cmdPatch(0, 1, cellArgv);
      return [
        event("session_created", s, identity.session(s), at, { goal: "crafted", cwd: work, validators: [], budgets: {} }),
        event("turn_prepared", s, identity.turn(turn), at, { turn, n: 1, revision: 0, delivered: [] }),
        event("model_attempt", s, identity.attempt(turn, 1), at, { turn, attempt: 1 }),
        event("model_response", s, identity.response(turn, 1), at, { turn, attempt: 1, patch, usage: null }),
        event("patch_accepted", s, identity.patch(turn), at, { turn, attempt: 1, patch, revision: 1, new_cell_ids: [1], removed_ids: [], consumed: [] }),
        event("execution_queued", s, identity.queued(s, 1), at, { cell_id: 1, kind: "cmd" }),
        event("execution_started", s, identity.execution(s, 1), at, {
          cell_id: 1,
          host: started.host,
          boot_id: bootId(),
          pid: started.pid,
          pgid: started.pid,
          start_time: started.start_time,
        }),
      ];
    };
    try {
      for (const e of sessionEvents("s1", { host: hostName(), pid: recycled.pid, start_time: String(Number(recycled.start) + 1000) })) await db.commit([e]);
      for (const e of sessionEvents("s2", { host: `not-${hostName()}`, pid: remote.pid, start_time: remote.start })) await db.commit([e]);
    } finally {
      await db.close();
      await storage.close();
    }

    const model = new ScriptedModel({ rounds: [{ patch: cmdPatch(0, 1, cellArgv) }, { patch: concludePatch(1, 2, "failure", "cannot tell what cell 1 did") }] });
    const storage2 = createSqliteStorage({ dataDir: data });
    await withHarness({ storage: storage2, name: DB, model, workDir: dir, create: false }, async (h) => {
      const r = await h.resume();
      assert.deepEqual(r, { sessions: ["s1", "s2"], recovered: 2 });
      for (const s of ["s1", "s2"]) assert.equal((await h.wait(s)).result, "failure");
    }).finally(() => storage2.close());

    assert.ok(alive(recycled.pid, recycled.start), "the process holding the recycled pid was not signalled");
    assert.ok(alive(remote.pid, remote.start), "the process named by another host's record was not signalled");
    const log = await readLog(data, DB);
    for (const s of ["s1", "s2"]) {
      const mine = log.filter((e) => e.session === s) as LogEvent[];
      recoveredUnknown(mine, 1, false);
      const obs = ofKind(mine, "inbox_received").find((e) => e.body.observation.id === "execution:1")!;
      assert.equal((obs.body.observation.payload as { unknown: { worker_stopped: boolean } }).unknown.worker_stopped, false, "the model is told the worker may still run");
      assert.equal(observedByModel(mine, 1), "execution_UnknownExecution");
      endedByConclusion(mine, "failure");
    }
    assert.equal(effectLines(join(work, "effect.txt")), 0, "nothing was run");
  });
});
