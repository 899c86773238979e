/**
 * Bounded history (src/state/history.ts) through a real Harness on memory storage, with the real
 * HISTORY_KEEP: runs long enough that every kind of history is dropped, then what a caller or a
 * cell does with what was dropped. Each run is model rounds and commits only (note cells, cancelled
 * cells, timers), so thousands of rounds take seconds; the one cell that runs is a shell loop.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { describe, it } from "node:test";
import pino from "pino";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelReply, ModelRequest } from "../../src/model/contract.js";
import { ModelError } from "../../src/model/contract.js";
import { ENDED_HISTORY_KEEP, HISTORY_KEEP } from "../../src/state/history.js";
import { turnId } from "../../src/state/events.js";
import type { State } from "../../src/state/schema.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { until } from "../support/wait.js";
import { tempDir } from "./support.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200, maxIdle: 1_000_000 };

/** A model that answers every round with `decide(state)`, records what it answered, and can be made to fail. */
class FnModel implements Model {
  readonly name = "fn";
  readonly patches = new Map<string, unknown>();
  calls = 0;
  failing: ModelError | null = null;
  constructor(private readonly decide: (state: State, turn: string) => unknown[]) {}
  async step(req: ModelRequest): Promise<ModelReply> {
    this.calls++;
    if (this.failing !== null) throw this.failing;
    const patch = this.decide(req.state, req.turn);
    this.patches.set(req.turn, patch);
    return { patch, usage: null };
  }
}

/**
 * Every round takes the previous notes out of context and adds three (idle, so an idle observation
 * starts the next round); round `rounds` concludes failure "enough".
 */
function notesModel(rounds: number): FnModel {
  return new FnModel((state) => {
    const n = state.runtime.usage.rounds;
    const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }, ...removals(state)];
    const next = state.runtime.next_cell_id;
    if (n >= rounds) ops.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "enough" } });
    else for (let i = 0; i < 3; i++) ops.push({ op: "add", path: "/cells/-", value: { id: next + i, previous_id: null, kind: "note", text: `round ${n} note ${i}` } });
    return ops;
  });
}

/** The ops that take every cell of `state` out of context except those `keep` names (highest position first). */
function removals(state: State, keep: (id: number) => boolean = () => false): unknown[] {
  const ops: unknown[] = [];
  for (let pos = state.cells.length - 1; pos >= 0; pos--) if (!keep(state.cells[pos]!.id)) ops.push({ op: "remove", path: `/cells/${pos}` });
  return ops;
}

/** One JSON request over the harness's timer socket (what `cairn timer` sends). */
function timerRequest(socket: string, req: Record<string, unknown>): Promise<{ ok: boolean; due_at?: string; error?: string }> {
  return new Promise((resolve, reject) => {
    const c = connect(socket);
    // A hang guard: a reply that never comes fails the test instead of stalling it.
    c.setTimeout(30_000, () => c.destroy(new Error(`no reply from the timer socket to ${JSON.stringify(req)} in 30 s`)));
    let buf = "";
    c.setEncoding("utf8");
    c.on("connect", () => c.write(JSON.stringify(req) + "\n"));
    c.on("data", (d: string) => (buf += d));
    c.on("end", () => {
      try {
        resolve(JSON.parse(buf) as { ok: boolean; due_at?: string; error?: string });
      } catch (err) {
        reject(err as Error);
      }
    });
    c.on("error", reject);
  });
}


describe("bounded history through a real harness", { timeout: 180_000 }, () => {
  // Harness.submit answers a replay from s.turns and s.cells: a kept turn must keep its cells (else
  // "admission context is inconsistent"), and a dropped round must be refused as older than the kept
  // history, not as a round that was never accepted.
  it("Harness.submit after a long run: a kept accepted round replays, an older one is refused saying it is older than the kept history", async (tc) => {
    const t = tempDir("cairn-hr-");
    const rounds = 2 * HISTORY_KEEP + 150;
    const model = notesModel(rounds);
    const h = await Harness.open({ storage: createMemoryStorage(), name: "hr-submit", model, workDir: t.dir, limits: fast, snapshots: false });
    tc.after(async () => {
      await h.close();
      t.cleanup();
    });
    const s = await h.start({ goal: "many rounds", cwd: t.dir });
    const outcome = await h.wait(s);
    assert.equal(outcome.reason, "the model concluded failure: enough");
    const p = h.session(s)!;
    assert.ok(p.turns.size < p.turn_count, `turns were dropped (${p.turns.size} of ${p.turn_count} kept)`);

    const oldest = turnId(s, 1);
    const keptOldest = [...p.turns.values()].find((x) => x.accepted !== null)!.turn;
    const answers: Record<string, string> = {};
    for (const turn of [oldest, keptOldest]) {
      try {
        const r = await h.submit(s, turn, model.patches.get(turn));
        answers[turn] = r.ok && r.receipt.replay ? "replay" : JSON.stringify(r).slice(0, 200);
      } catch (err) {
        answers[turn] = `threw ${(err as Error).name}: ${(err as Error).message.slice(0, 200)}`;
      }
    }
    assert.equal(answers[keptOldest], "replay", "re-submitting a kept accepted round's own patch is a replay");
    assert.match(answers[oldest]!, /^threw ConfigError: round s1:t1 of session s1 is older than the rounds the run keeps at hand/, "a round older than the kept history is refused saying so, not as a round never accepted");
    // The run has ended: it keeps ENDED_HISTORY_KEEP rounds, and the refusal gives that number.
    assert.match(answers[oldest]!, new RegExp(`the run has ended and keeps the most recent ${ENDED_HISTORY_KEEP}\\)`), answers[oldest]);
    assert.ok(p.turns.size <= ENDED_HISTORY_KEEP + 1, `an ended run keeps at most ${ENDED_HISTORY_KEEP} accepted rounds: ${p.turns.size}`);
  });

  it("Harness.submit of a round older than the kept history while the run is still going: the refusal gives the running number, not the ended one", async (tc) => {
    const t = tempDir("cairn-hr-live-");
    const rounds = HISTORY_KEEP + 150;
    // At round `rounds` the model holds its answer until the test has re-submitted: the run is live then.
    let reached!: () => void;
    const atHold = new Promise<void>((r) => (reached = r));
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const model = notesModel(rounds);
    const holding: Model = {
      name: "hold",
      async step(req) {
        if (req.state.runtime.usage.rounds >= rounds) {
          reached();
          await held;
        }
        return model.step(req);
      },
    };
    const h = await Harness.open({ storage: createMemoryStorage(), name: "hr-submit-live", model: holding, workDir: t.dir, limits: fast, snapshots: false });
    tc.after(async () => {
      release();
      await h.close();
      t.cleanup();
    });
    const s = await h.start({ goal: "many rounds", cwd: t.dir });
    await atHold;
    const p = h.session(s)!;
    assert.equal(p.terminal, null, "the run is still going");
    assert.ok(p.turns.size < p.turn_count, `turns were dropped (${p.turns.size} of ${p.turn_count} kept)`);
    const oldest = turnId(s, 1);
    await assert.rejects(
      h.submit(s, oldest, model.patches.get(oldest)),
      (err: Error) => err.name === "ConfigError" && err.message.includes(`(the most recent ${HISTORY_KEEP})`) && !err.message.includes("has ended"),
      "a live run's refusal gives the running history's size",
    );
    release();
    assert.equal((await h.wait(s)).reason, "the model concluded failure: enough");
  });

  // registerTimer answers "the timer already registered" from s.timers: were a fired timer dropped
  // from history, it would commit timer_registered again, which the storage refuses (its identity is
  // in the log), and the cell's `cairn timer` would fail instead of getting the answer.
  it("a cell that registers a timer id again after thousands of timers fired gets the registered timer, not an error", async (tc) => {
    const t = tempDir("cairn-hr-");
    // Round 1 starts a cell that waits (so no later patch is idle); each round after adds a note.
    const go = join(t.dir, "go");
    const cellSocket = join(t.dir, "cell-socket");
    const model = new FnModel((state) => {
      const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
      const next = state.runtime.next_cell_id;
      if (state.revision === 0) ops.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "cmd", argv: ["sh", "-c", `echo "$CAIRN_TIMER_SOCKET $CAIRN_CELL_TOKEN" > '${cellSocket}'; while [ ! -e '${go}' ]; do sleep 0.1; done`] } });
      else ops.push(...removals(state, (id) => id === 1), { op: "add", path: "/cells/-", value: { id: next, previous_id: null, kind: "note", text: "timers fired" } });
      return ops;
    });
    // Without a sandbox: the test speaks for the waiting cell, with its token, on the socket's host path.
    const h = await Harness.open({ storage: createMemoryStorage(), name: "hr-timer", model, workDir: t.dir, limits: fast, snapshots: false, sandbox: { mode: "none" } });
    tc.after(async () => {
      writeFileSync(go, ""); // the waiting cell ends
      await h.close();
      t.cleanup();
    });
    const s = await h.start({ goal: "many timers", cwd: t.dir });
    await until("the waiting cell to start", () => h.session(s)!.executions.get(1)?.phase === "started", 60_000, 20);
    await until("the cell to say where its socket is", () => existsSync(cellSocket) && readFileSync(cellSocket, "utf8").includes("\n"), 60_000, 20);
    const [socket, token] = readFileSync(cellSocket, "utf8").trim().split(" ") as [string, string];
    const timers = 2 * HISTORY_KEEP + 50;
    const first = await timerRequest(socket, { token, timer_id: "t-0", delay_seconds: 0 });
    assert.ok(first.ok, `the first registration: ${JSON.stringify(first)}`);
    for (let i = 1; i < timers; i += 50) {
      await Promise.all(Array.from({ length: Math.min(50, timers - i) }, (_, k) => timerRequest(socket, { token, timer_id: `t-${i + k}`, delay_seconds: 0 })));
    }
    await until("every timer to fire and later rounds to drop other history", () => {
      const p = h.session(s)!;
      return p.pending.length === 0 && p.open_turn === null && [...p.timers.values()].every((x) => x.fired) && p.observations.size < timers;
    }, 60_000, 50);
    assert.ok(h.session(s)!.timers.has("t-0"), "fired timers stay in the projection (history.ts)");
    const again = await timerRequest(socket, { token, timer_id: "t-0", delay_seconds: 0 });
    assert.deepEqual(again, { ok: true, timer_id: "t-0", due_at: first.due_at }, "a repeated registration answers with the timer already registered");
  });

  // SessionDriver.recarry decides whether carried events were committed. The commit that carries a
  // finished cell also prepares the next round, and that fold may drop the cell from history at once
  // (out of context, succeeded, older in queue order than the 1,000 finished executions kept). If the
  // round then fails (the model's key is refused: RunBlocked) and recarry looked the execution up in
  // the projection, the committed events would be carried again, and after `resume` every pass would
  // re-commit them, be refused as a duplicate, and retry: the run would never call the model again.
  it("a run whose model is blocked right after a long-queued cell finished continues after resume", async (tc) => {
    const t = tempDir("cairn-hr-");
    const go = join(t.dir, "go");
    const PINNED = HISTORY_KEEP + 100; // cancelled cells left in context: executions that are never history
    const PER_ROUND = 24; // a patch removes the last round's cells and notes, cancels and adds: at most 100 ops
    let phase: "pin" | "cancel" | "quiet" = "pin";
    const pinned = new Set<number>();
    let cancelledOut = 0;
    const model = new FnModel((state) => {
      const view = state.runtime.cells;
      const ops: unknown[] = [{ op: "test", path: "/revision", value: state.revision }];
      let next = state.runtime.next_cell_id;
      const add = (value: Record<string, unknown>) => ops.push({ op: "add", path: "/cells/-", value: { id: next++, previous_id: null, ...value } });
      const addCmds = () => {
        if (phase === "quiet") return;
        for (let i = 0; i < PER_ROUND; i++) {
          if (phase === "pin") pinned.add(next);
          add({ kind: "cmd", argv: ["true"] });
        }
      };
      if (state.revision === 0) {
        // Cell 1 runs until the test says; the cells queued behind it are cancelled round after round.
        add({ kind: "cmd", argv: ["sh", "-c", `while [ ! -e '${go}' ]; do sleep 0.05; done`] });
        addCmds();
        return ops;
      }
      const queued = Object.entries(view).filter(([, c]) => c.phase === "queued").map(([id]) => Number(id));
      // Everything but the pinned cmds leaves the context (cell 1 too); the queued cmds are cancelled.
      ops.push(...removals(state, (id) => pinned.has(id)));
      for (const target of queued) add({ kind: "note", text: "not needed", role: "cancel", target_cell_id: target });
      if (phase === "cancel") cancelledOut += queued.length;
      if (phase === "pin" && pinned.size >= PINNED) phase = "cancel";
      else if (phase === "cancel" && cancelledOut >= HISTORY_KEEP + 50) phase = "quiet";
      addCmds();
      return ops;
    });
    const errors: string[] = [];
    const logger = pino({ level: "error" }, { write: (line: string) => void errors.push(line) });
    const h = await Harness.open({ storage: createMemoryStorage(), name: "hr-carry", model, workDir: t.dir, limits: fast, snapshots: false, logger });
    tc.after(async () => {
      writeFileSync(go, ""); // the waiting cell ends
      await h.close();
      t.cleanup();
    });
    const s = await h.start({ goal: "a long-queued cell", cwd: t.dir });
    await until("cell 1 to start", () => h.session(s)!.executions.get(1)?.phase === "started", 60_000, 20);
    await h.post(s, { id: "begin", kind: "message", payload: "cancel what waits" });
    await until("the cancel phase to end and the run to go quiet", () => {
      const p = h.session(s)!;
      return phase === "quiet" && p.pending.length === 0 && p.open_turn === null && ![...p.executions.values()].some((e) => e.phase === "queued") && p.executions.get(1)?.phase === "started";
    }, 60_000, 50);
    const before = h.session(s)!;
    assert.ok(before.executions.size > 2 * HISTORY_KEEP - PER_ROUND, `enough executions are kept for the next round to drop history (${before.executions.size})`);
    // The key is refused from now on; cell 1 ends (it succeeds), and its result goes with the next round.
    model.failing = new ModelError("auth", "401 invalid x-api-key", { retryable: false, status: 401 });
    writeFileSync(go, "");
    await until("the run to be blocked", () => h.session(s)!.blocked !== null, 60_000, 20);
    await h.settled();
    // Cell 1 ended out of context and older than the kept history. It stays until the model has read
    // its observation (history.ts); even were it dropped by the fold of the very commit that carried
    // its result, the driver counts that commit as done (session.ts recarry).
    const one = h.session(s)!.executions.get(1);
    assert.ok(one === undefined || one.result === "success", `cell 1 finished (${JSON.stringify(one?.result)})`);
    assert.ok(existsSync(go));
    // The key is fixed: resume. The open round calls the model again and the run goes on.
    model.failing = null;
    const calls = model.calls;
    await h.resume();
    try {
      await until("the model to be called again after resume", () => model.calls > calls && h.session(s)!.blocked === null, 20_000, 50);
    } catch (err) {
      const last = errors.length > 0 ? (JSON.parse(errors[errors.length - 1]!) as { msg?: string; err?: { message?: string } }) : null;
      assert.fail(`${(err as Error).message}; the driver's last error: ${last === null ? "none" : `${last.msg}: ${last.err?.message}`} (${errors.length} errors logged)`);
    }
  });
});
