/**
 * A fork's copy survives a SIGKILL of its owner: a real `cairn serve` owns the database (sqlite, then
 * a 3-member etcd cluster, then Durable Streams; servers started by chaos/support/adapters.ts) and
 * kills itself right after the
 * second batch of a fork's copy is committed (CAIRN_CHAOS_KILL_AT=fork:batch-committed@2). The origin
 * is big enough for several batches (41 rounds, each with a cell) and its last cell is still running
 * when the fork is asked for.
 *
 * Between the owners the fork is visibly half-made ("forking"), cannot be forked or steered, and runs
 * nothing. The next owner finishes the copy before anything else (the request stays in the mailbox
 * until the copy is complete): every planned event is in the fork's log exactly once (the count of
 * copied events equals the count `fork_completed` states, and no identity is repeated), the fork's
 * cells are the origin's as they were after the round, the running cell appears in the fork as an
 * UnknownExecution and is never launched again (it appends a line to a file: one line, one launch),
 * and the fork then runs on its own to its end. Each case first proves the kill happened.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { cleanupProcesses, describe as said, runCairn, startCairn } from "./support/cli.js";
import { effectLines } from "./support/checks.js";
import { brief, ofKind, readAll } from "./support/log.js";
import { cmdPatch, concludePatch, writeScript } from "./support/patches.js";
import { until } from "./support/procs.js";
import type { LogEvent } from "../src/state/events.js";
import { reduce } from "../src/state/reducer.js";
import { adapters, type ChaosAdapter } from "./support/adapters.js";
import { exitAfterTests } from "../test/support/exit.js";

const root = mkdtempSync(join(tmpdir(), "cairn-chaos-fork-"));
const ROUNDS = 40;
/** The last cell: appends its line, then runs until `release` appears (or 60 s). */
const GATED = ["sh", "-c", "echo ran >> effect.txt; i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"];


function forkKill(adapter: ChaosAdapter): void {
  test(`${adapter.name}: the owner is SIGKILLed in the middle of a fork's copy; the next owner finishes it exactly once, re-running nothing`, async () => {
    const dir = join(root, adapter.name);
    const work = join(dir, "work");
    mkdirSync(work, { recursive: true });
    const model = join(dir, "model.json");
    const rounds = [...Array.from({ length: ROUNDS }, (_, i) => cmdPatch(i, i + 1, ["true"])), cmdPatch(ROUNDS, ROUNDS + 1, GATED), concludePatch(ROUNDS + 1, ROUNDS + 2, "failure", "the last cell is unknown")];
    writeScript(model, rounds);
    const db = "fork";
    const cli = (args: string[]) => runCairn([...args, "--db", db, ...adapter.flags(dir, "cli")], {}, 120_000);
    const serve = (role: string, env: Record<string, string> = {}) => startCairn(["serve", "--db", db, ...adapter.flags(dir, role), "--model", `scripted:${model}`, "--create", "--cwd", work, "--listen", "127.0.0.1:0"], env, 400_000);
    const log = async (): Promise<LogEvent[]> => readAll(adapter.storage(dir), db);
    const status = async (session: string): Promise<{ status: string; result: { reason: string } | null } | undefined> => {
      const r = await cli(["status", "--session", session, "--json"]);
      return r.code === 0 ? (JSON.parse(r.stdout) as { sessions: { status: string; result: { reason: string } | null }[] }).sessions[0] : undefined;
    };

    const first = serve("owner1", { CAIRN_CHAOS_KILL_AT: "fork:batch-committed@2" });
    const submitted = await cli(["submit", "many rounds", "--session", "job1"]);
    assert.equal(submitted.code, 0, said(submitted));
    await until("the last cell to run", () => (effectLines(join(work, "effect.txt")) === 1 ? true : undefined), 240_000);

    const asked = await cli(["fork", "--session", "job1", "--at-round", String(ROUNDS + 1), "--new-session", "f1", "--reason", "try again", "--wait", "0"]);
    assert.equal(asked.code, 4, said(asked));
    assert.match(asked.stdout, /fork of run job1 after round 41 as run f1 was posted/);
    const killed = await first.result;
    assert.equal(killed.signal, "SIGKILL", said(killed));

    let events = await log();
    const copiedBefore = events.filter((e) => e.session === "f1" && e.identity.startsWith("fork:f1:")).length;
    assert.ok(copiedBefore >= 2, `two batches were committed before the kill:\n${brief(events.filter((e) => e.session === "f1"))}`);
    assert.equal(ofKind(events, "fork_completed").length, 0, "killed in the middle of the copy");
    assert.equal((await status("f1"))?.status, "forking");
    // A half-made fork cannot be forked or steered, and nothing runs in it.
    const forkOfForming = await cli(["fork", "--session", "f1", "--at-round", "0"]);
    assert.equal(forkOfForming.code, 2, said(forkOfForming));
    assert.match(forkOfForming.stderr, /run f1 is a fork still being copied; fork it once its copy is complete/);
    const pause = await cli(["pause", "--session", "f1"]);
    assert.equal(pause.code, 2, said(pause));
    assert.match(pause.stderr, /still being copied/);

    const second = serve("owner2");
    try {
      const fork = await until("the fork to end", async () => {
        const v = await status("f1");
        return v?.result ? v : undefined;
      }, 240_000);
      assert.equal(fork.result!.reason, "the model concluded failure: the last cell is unknown");
      await until("the origin to end", async () => ((await status("job1"))?.result ? true : undefined), 240_000);
    } finally {
      second.child.kill("SIGTERM");
      await second.result;
    }

    events = await log();
    const forkEvents = events.filter((e) => e.session === "f1");
    const completed = ofKind(events, "fork_completed");
    assert.equal(completed.length, 1, "completed exactly once");
    const copies = forkEvents.filter((e) => e.identity.startsWith("fork:f1:"));
    assert.equal(copies.length, completed[0]!.body.copied, "every planned event copied exactly once");
    assert.equal(new Set(copies.map((e) => e.identity)).size, copies.length);
    assert.ok(copies.length > copiedBefore, "the next owner copied the rest");
    assert.ok(copies.length > 200, `the origin was big enough for several batches (${copies.length} events)`);
    // Nothing re-run: the fork launched no cell of its own, the running cell ran once.
    assert.equal(forkEvents.filter((e) => e.kind === "execution_started" && !e.identity.startsWith("fork:")).length, 0);
    assert.equal(effectLines(join(work, "effect.txt")), 1, "the cell in flight ran exactly once");
    const p = reduce(events);
    const f = p.sessions.get("f1")!;
    const o = p.sessions.get("job1")!;
    assert.equal(f.executions.get(ROUNDS + 1)?.result, "UnknownExecution");
    assert.equal(f.executions.get(ROUNDS + 1)?.unknown?.reason, "forked_while_in_flight");
    assert.deepEqual(f.state.cells.filter((c) => c.id <= ROUNDS + 1), o.state.cells.filter((c) => c.id <= ROUNDS + 1), "the fork's cells are the origin's after the round");
    assert.equal(f.effect_seed, o.effect_seed);
    const delivered = ofKind(events, "turn_prepared").filter((e) => e.session === "f1").flatMap((e) => e.body.delivered);
    assert.ok(delivered.includes("control:fork") && delivered.includes(`execution:${ROUNDS + 1}`), `the fork's model was told: ${delivered.join(", ")}`);
    // The copy came before anything else the next owner did for the origin (its recovery of the lost cell).
    const originUnknown = ofKind(events, "execution_finished").find((e) => e.session === "job1" && e.body.cell_id === ROUNDS + 1)!;
    assert.ok(completed[0]!.seq < originUnknown.seq, `the fork was completed first:\n${brief(events.slice(-30))}`);
  });
}

describe("a fork's copy while its owner is SIGKILLed", { timeout: 1_800_000 }, () => {
  const { sqlite, replicated, durableStreams } = adapters(root);
  after(async () => {
    cleanupProcesses();
    rmSync(root, { recursive: true, force: true });
  });
  describe("sqlite", () => forkKill(sqlite));
  describe("replicated", () => forkKill(replicated));
  describe("durable-streams", () => forkKill(durableStreams));
});

exitAfterTests("chaos/fork-kill.test.ts");
