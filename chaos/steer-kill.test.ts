/**
 * An operator steers a run while its owner is SIGKILLed: real `cairn run` / `cairn resume` owners
 * and real `cairn pause`, `unpause`, `cancel`, `approve`, `deny` processes, on sqlite, on the
 * replicated adapter (a 3-member etcd cluster) and on Durable Streams (the reference server), each
 * started by the file (chaos/support/adapters.ts). Each case kills the owner at one
 * boundary of a request's life, exactly where CAIRN_CHAOS_KILL_AT says, or from outside before the
 * request is posted:
 *
 *   the request waits in the mailbox (no live owner)  -> the next owner applies it before its run moves
 *   steer:committed                                   -> applied, nothing acted on it yet
 *   approval:requested                                -> the cell waits; nothing runs before approval
 *   cancel:cells-stopped                              -> the running cell recorded, the run not ended
 *   steer:committed@2 (pause, then unpause)           -> the unpause committed, the run not gone on yet
 *
 * The cell appends a line to an effect file, so "ran once", "never ran" and "ran twice" are visible on
 * disk, and the log must agree. "Asks the model nothing while paused" is read from the log's order:
 * no round is prepared between the pause and the unpause. Each case first proves the kill happened
 * (signal SIGKILL, the request's event committed), so the suite cannot pass by doing nothing.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { cleanupProcesses, describe as said, runCairn, startCairn, type CliProcess } from "./support/cli.js";
import { effectLines } from "./support/checks.js";
import { brief, ofKind, readAll } from "./support/log.js";
import { cmdPatch, concludePatch, writeScript } from "./support/patches.js";
import { until } from "./support/procs.js";
import type { LogEvent } from "../src/state/events.js";
import { adapters, type ChaosAdapter } from "./support/adapters.js";
import { exitAfterTests } from "../test/support/exit.js";
import { hasCode } from "../src/errors.js";

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-steer-"));

/** A cell that appends its line, then runs until `release` appears (or 60 s). */
const GATED = ["sh", "-c", "echo ran >> effect.txt; i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"];
const SECOND = ["sh", "-c", "echo second >> second.txt"];




interface Case {
  readonly dir: string;
  readonly work: string;
  readonly model: string;
  cairn(args: string[], role: string, env?: Record<string, string>): Promise<ReturnType<typeof runCairn> extends Promise<infer R> ? R : never>;
  start(args: string[], role: string, env?: Record<string, string>): CliProcess;
  log(): Promise<LogEvent[]>;
  /** Whether the log holds an event of `kind` yet (false while the database does not exist yet). */
  logged(kind: LogEvent["kind"], where?: (e: LogEvent) => boolean): Promise<boolean>;
  effect(): number;
}

function makeCase(adapter: ChaosAdapter, name: string, rounds: unknown[][]): Case {
  const dir = join(root, `${adapter.name}-${name}`);
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  const model = join(dir, "model.json");
  writeScript(model, rounds as never);
  // One database per case: the replicated cases share one etcd cluster.
  const db = `steer-${name}`;
  const withDb = (args: string[], role: string) => [...args, "--db", db, ...adapter.flags(dir, role)];
  return {
    dir,
    work,
    model,
    cairn: (args, role, env = {}) => runCairn(withDb(args, role), env, 120_000),
    start: (args, role, env = {}) => startCairn(withDb(args, role), env, 180_000),
    async log() {
      return readAll(adapter.storage(dir), db);
    },
    async logged(kind, where = () => true) {
      try {
        return (await this.log()).some((e) => e.kind === kind && where(e));
      } catch (err) {
        if (hasCode(err, "not_found")) return false;
        throw err;
      }
    },
    effect: () => effectLines(join(work, "effect.txt")),
  };
}

const seqOf = (log: readonly LogEvent[], kind: LogEvent["kind"]): number[] => log.filter((e) => e.kind === kind).map((e) => e.seq);
/** Rounds prepared strictly between seqs `a` and `b`. */
const roundsBetween = (log: readonly LogEvent[], a: number, b: number): number => log.filter((e) => e.kind === "turn_prepared" && e.seq > a && e.seq < b).length;

function killMatrix(adapter: ChaosAdapter): void {
  const run = (c: Case, env: Record<string, string> = {}, extra: string[] = []) => c.start(["run", "append one line", "--model", `scripted:${c.model}`, "--cwd", c.work, ...extra], "owner1", env);
  const resume = (c: Case, role: string, env: Record<string, string> = {}) => c.start(["resume", "--model", `scripted:${c.model}`], role, env);

  test(`${adapter.name}: pause, SIGKILL right after it is committed while the cell runs: the next owner keeps the run paused and asks nothing until unpause`, async () => {
    const c = makeCase(adapter, "pause-committed", [cmdPatch(0, 1, GATED), concludePatch(1, 2, "failure", "cell 1 was stopped by the failover")]);
    const owner = run(c, { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    const paused = await c.cairn(["pause", "--session", "s1", "--reason", "look first"], "cli");
    assert.equal(paused.code, 0, said(paused));
    const killed = await owner.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await c.log();
    assert.equal(ofKind(log, "run_paused").length, 1, `the pause is committed before the kill:\n${brief(log)}`);
    const status = await c.cairn(["status", "--json"], "cli");
    assert.equal((JSON.parse(status.stdout) as { sessions: { status: string }[] }).sessions[0]!.status, "paused", said(status));

    const next = resume(c, "owner2");
    await until("the next owner to record the lost cell", () => c.logged("execution_finished"), 120_000);
    const unpaused = await c.cairn(["unpause", "--session", "s1"], "cli");
    assert.equal(unpaused.code, 0, said(unpaused));
    const done = await next.result;
    assert.equal(done.code, 1, said(done));
    log = await c.log();
    const [p] = seqOf(log, "run_paused");
    const [u] = seqOf(log, "run_unpaused");
    assert.equal(roundsBetween(log, p!, u!), 0, `no round while paused:\n${brief(log)}`);
    assert.equal(ofKind(log, "execution_finished")[0]!.body.result, "UnknownExecution");
    assert.equal(ofKind(log, "execution_started").length, 1, "never re-run");
    assert.equal(c.effect(), 1);
    assert.match(ofKind(log, "run_ended")[0]!.body.reason, /the model concluded failure/);
  });

  test(`${adapter.name}: pause --now posted while no owner is live (the owner was SIGKILLed): the next owner applies it before anything else`, async () => {
    const c = makeCase(adapter, "pause-mailbox", [cmdPatch(0, 1, GATED), concludePatch(1, 2, "failure", "cell 1 is unknown")]);
    const owner = run(c);
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    owner.child.kill("SIGKILL");
    assert.equal((await owner.result).signal, "SIGKILL");
    // The owner's lease must be gone for the request to wait instead of being followed (on etcd it
    // outlives a SIGKILL by up to its TTL).
    await until("the dead owner's lease to expire", async () => ((await c.cairn(["status", "--json"], "cli")).stdout.includes('"status": "owner_gone"') ? true : undefined), 120_000);
    const paused = await c.cairn(["pause", "--session", "s1", "--now"], "cli");
    assert.equal(paused.code, 0, said(paused));
    assert.match(paused.stdout, /waits in the mailbox: no live worker owns/);
    let log = await c.log();
    assert.equal(ofKind(log, "run_paused").length, 0, "no owner applied it yet");

    const next = resume(c, "owner2");
    await until("the next owner to apply the pause", () => c.logged("run_paused"), 120_000);
    await until("the lost cell to be recorded", () => c.logged("execution_finished"), 120_000);
    const unpaused = await c.cairn(["unpause", "--session", "s1"], "cli");
    assert.equal(unpaused.code, 0, said(unpaused));
    const done = await next.result;
    assert.equal(done.code, 1, said(done));
    log = await c.log();
    const [p] = seqOf(log, "run_paused");
    const [u] = seqOf(log, "run_unpaused");
    const claim = ofKind(log, "owner_claimed").filter((e) => e.body.epoch > 1)[0]!;
    assert.ok(p! <= claim.seq + 1, `the pause is the new owner's first act:\n${brief(log)}`);
    assert.equal(roundsBetween(log, p!, u!), 0, `no round while paused:\n${brief(log)}`);
    assert.equal(c.effect(), 1, "never re-run");
  });

  test(`${adapter.name}: pause --now, SIGKILL right after it is committed while the cell runs: the next owner records the stopped cell once, stays paused, never re-runs it`, async () => {
    const c = makeCase(adapter, "pause-now-committed", [cmdPatch(0, 1, GATED), concludePatch(1, 2, "failure", "cell 1 was stopped by the pause")]);
    const owner = run(c, { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    const paused = await c.cairn(["pause", "--session", "s1", "--now", "--reason", "stop it"], "cli");
    assert.equal(paused.code, 0, said(paused));
    const killed = await owner.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await c.log();
    const pause = ofKind(log, "run_paused");
    assert.equal(pause.length, 1, `the pause is committed before the kill:\n${brief(log)}`);
    assert.equal(pause[0]!.body.now, true);

    const next = resume(c, "owner2");
    await until("the next owner to record the stopped cell", () => c.logged("execution_finished"), 120_000);
    const status = await c.cairn(["status", "--json"], "cli");
    assert.equal((JSON.parse(status.stdout) as { sessions: { status: string }[] }).sessions[0]!.status, "paused", said(status));
    const unpaused = await c.cairn(["unpause", "--session", "s1"], "cli");
    assert.equal(unpaused.code, 0, said(unpaused));
    const done = await next.result;
    assert.equal(done.code, 1, said(done));
    log = await c.log();
    const [p] = seqOf(log, "run_paused");
    const [u] = seqOf(log, "run_unpaused");
    assert.equal(roundsBetween(log, p!, u!), 0, `no round while paused:\n${brief(log)}`);
    const fins = ofKind(log, "execution_finished");
    assert.equal(fins.length, 1, `the stopped cell is recorded once:\n${brief(log)}`);
    assert.equal(fins[0]!.body.result, "UnknownExecution");
    assert.equal(ofKind(log, "execution_started").length, 1, "never re-run");
    assert.equal(c.effect(), 1);
    assert.match(ofKind(log, "run_ended")[0]!.body.reason, /the model concluded failure/);
  });

  test(`${adapter.name}: unpause, SIGKILL right after it is committed: the next owner goes on (asks the model again) without a second unpause`, async () => {
    const c = makeCase(adapter, "unpause-committed", [cmdPatch(0, 1, GATED), concludePatch(1, 2, "success", "cell 1 ran")]);
    const owner = run(c, { CAIRN_CHAOS_KILL_AT: "steer:committed@2" });
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    const paused = await c.cairn(["pause", "--session", "s1"], "cli");
    assert.equal(paused.code, 0, said(paused));
    writeFileSync(join(c.work, "release"), "");
    await until("the cell to finish while paused", () => c.logged("execution_finished"), 120_000);
    const unpaused = await c.cairn(["unpause", "--session", "s1", "--reason", "go on"], "cli");
    assert.equal(unpaused.code, 0, said(unpaused));
    const killed = await owner.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));
    let log = await c.log();
    assert.equal(ofKind(log, "run_unpaused").length, 1, `the unpause is committed before the kill:\n${brief(log)}`);
    assert.equal(ofKind(log, "run_ended").length, 0, "killed before the run went on");

    const done = await resume(c, "owner2").result;
    assert.equal(done.code, 0, said(done));
    log = await c.log();
    const [p] = seqOf(log, "run_paused");
    const [u] = seqOf(log, "run_unpaused");
    assert.equal(roundsBetween(log, p!, u!), 0, `no round while paused:\n${brief(log)}`);
    assert.ok(roundsBetween(log, u!, Number.MAX_SAFE_INTEGER) >= 1, `the model is asked again after the unpause:\n${brief(log)}`);
    assert.equal(ofKind(log, "run_unpaused").length, 1, "one unpause");
    assert.equal(ofKind(log, "execution_finished")[0]!.body.result, "success", "the cell finished while paused");
    assert.equal(ofKind(log, "execution_started").length, 1, "never re-run");
    assert.equal(c.effect(), 1);
    assert.equal(ofKind(log, "run_ended")[0]!.body.result, "success");
  });

  test(`${adapter.name}: cancel, SIGKILL right after it is committed while a cell runs: the next owner records the cell cancelled, cancels the queued one, ends the run cancelled`, async () => {
    const c = makeCase(adapter, "cancel-committed", [[...cmdPatch(0, 1, GATED), { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "cmd", argv: SECOND } }], concludePatch(1, 3, "failure", "unexpected")]);
    const owner = run(c, { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    const cancelled = await c.cairn(["cancel", "--session", "s1", "--reason", "wrong task"], "cli");
    assert.equal(cancelled.code, 0, said(cancelled));
    assert.equal((await owner.result).signal, "SIGKILL");
    let log = await c.log();
    assert.equal(ofKind(log, "run_cancel_requested").length, 1, brief(log));
    assert.equal(ofKind(log, "run_ended").length, 0, "killed before the run ended");

    const done = await resume(c, "owner2").result;
    assert.equal(done.code, 1, said(done));
    log = await c.log();
    const end = ofKind(log, "run_ended");
    assert.equal(end.length, 1);
    assert.equal(end[0]!.body.result, "cancelled");
    assert.equal(end[0]!.body.reason, "cancelled by an operator: wrong task");
    const fins = ofKind(log, "execution_finished");
    assert.deepEqual(fins.map((e) => [e.body.cell_id, e.body.result]), [[1, "cancelled"], [2, "cancelled"]]);
    assert.equal(ofKind(log, "execution_started").length, 1, "cell 2 never started");
    assert.equal(existsSync(join(c.work, "second.txt")), false);
    assert.equal(roundsBetween(log, seqOf(log, "run_cancel_requested")[0]!, end[0]!.seq), 0, "the model is not asked after a cancel");
    const again = await c.cairn(["cancel", "--session", "s1"], "cli");
    assert.equal(again.code, 0, said(again));
    assert.match(again.stdout, /already cancelled/);
  });

  test(`${adapter.name}: cancel, SIGKILL after the running cell was stopped and recorded, before the run ended: the next owner ends it, launching nothing`, async () => {
    const c = makeCase(adapter, "cancel-stopped", [[...cmdPatch(0, 1, GATED), { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "cmd", argv: SECOND } }], concludePatch(1, 3, "failure", "unexpected")]);
    const owner = run(c, { CAIRN_CHAOS_KILL_AT: "cancel:cells-stopped" });
    await until("the cell to run", () => (c.effect() === 1 ? true : undefined), 120_000);
    const cancelled = await c.cairn(["cancel", "--session", "s1"], "cli");
    assert.equal(cancelled.code, 0, said(cancelled));
    assert.equal((await owner.result).signal, "SIGKILL");
    let log = await c.log();
    assert.deepEqual(ofKind(log, "execution_finished").map((e) => [e.body.cell_id, e.body.result]), [[1, "cancelled"]], brief(log));
    assert.equal(ofKind(log, "run_ended").length, 0);

    const done = await resume(c, "owner2").result;
    assert.equal(done.code, 1, said(done));
    log = await c.log();
    assert.equal(ofKind(log, "run_ended")[0]!.body.result, "cancelled");
    assert.equal(ofKind(log, "execution_started").length, 1);
    assert.equal(existsSync(join(c.work, "second.txt")), false);
  });

  test(`${adapter.name}: approval, SIGKILL right after a cell's approval is asked and again right after it is approved: it runs exactly once, only after approval`, async () => {
    const c = makeCase(adapter, "approve", [cmdPatch(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludePatch(1, 2, "success", "ran once")]);
    const first = run(c, { CAIRN_CHAOS_KILL_AT: "approval:requested" }, ["--require-approval", "argv:sh"]);
    assert.equal((await first.result).signal, "SIGKILL");
    let log = await c.log();
    assert.equal(ofKind(log, "approval_requested").length, 1, brief(log));
    assert.equal(c.effect(), 0);
    const status = await c.cairn(["status", "--json"], "cli");
    const st = JSON.parse(status.stdout) as { sessions: { awaiting_approval: { cell_id: number; rule: string }[] }[] };
    assert.deepEqual(st.sessions[0]!.awaiting_approval.map((a) => [a.cell_id, a.rule]), [[1, "argv:sh"]]);

    // An owner without any rule of its own: the request in the log holds the cell.
    const second = resume(c, "owner2", { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    await until("the second owner to claim the run", async () => ((await c.log()).some((e) => e.kind === "owner_claimed" && e.body.epoch > 1) || (await c.cairn(["status", "--json"], "cli")).stdout.includes(`"role": "resume"`) ? true : undefined), 120_000);
    const approved = await c.cairn(["approve", "--session", "s1", "--cell", "1", "--reason", "checked"], "cli");
    assert.equal(approved.code, 0, said(approved));
    assert.equal((await second.result).signal, "SIGKILL");
    log = await c.log();
    assert.equal(ofKind(log, "approval_decided").length, 1);
    assert.equal(ofKind(log, "execution_started").length, 0, "approved, not launched yet");
    assert.equal(c.effect(), 0);

    const third = await resume(c, "owner3").result;
    assert.equal(third.code, 0, said(third));
    log = await c.log();
    assert.equal(c.effect(), 1, "ran exactly once");
    const starts = ofKind(log, "execution_started");
    assert.equal(starts.length, 1);
    assert.ok(starts[0]!.seq > ofKind(log, "approval_decided")[0]!.seq, "launched only after the approval");
  });

  test(`${adapter.name}: deny, SIGKILL right after it is committed: the cell never runs and the next owner's model reads the denial`, async () => {
    const c = makeCase(adapter, "deny", [cmdPatch(0, 1, ["sh", "-c", "echo ran >> effect.txt"]), concludePatch(1, 2, "failure", "denied, giving up")]);
    const first = run(c, {}, ["--require-approval", "all"]);
    await until("the cell to wait for approval", () => c.logged("approval_requested"), 120_000);
    first.child.kill("SIGKILL");
    await first.result;
    const owner = resume(c, "owner2", { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    await until("the second owner to be live", async () => ((await c.cairn(["status", "--json"], "cli")).stdout.includes(`"role": "resume"`) ? true : undefined), 120_000);
    const denied = await c.cairn(["deny", "--session", "s1", "--cell", "1", "--reason", "not on this host"], "cli");
    assert.equal(denied.code, 0, said(denied));
    assert.equal((await owner.result).signal, "SIGKILL");
    const done = await resume(c, "owner3").result;
    assert.equal(done.code, 1, said(done));
    const log = await c.log();
    assert.equal(c.effect(), 0, "never ran");
    assert.equal(ofKind(log, "execution_started").length, 0);
    const obs = ofKind(log, "inbox_received").find((e) => e.body.observation.id === "execution:1")!;
    assert.equal(obs.body.observation.kind, "execution_denied");
    const delivered = ofKind(log, "turn_prepared").find((e) => e.body.delivered.includes("execution:1"));
    assert.ok(delivered !== undefined, `the model was given the denial:\n${brief(log)}`);
    assert.match(ofKind(log, "run_ended")[0]!.body.reason, /denied, giving up/);
  });
}

describe("steering a run while its owner is SIGKILLed", { timeout: 1_800_000 }, () => {
  const { sqlite, replicated, durableStreams } = adapters(root);
  after(async () => {
    cleanupProcesses();
    rmSync(root, { recursive: true, force: true });
  });
  describe("sqlite", () => killMatrix(sqlite));
  describe("replicated", () => killMatrix(replicated));
  describe("durable-streams", () => killMatrix(durableStreams));
});

exitAfterTests("chaos/steer-kill.test.ts");
