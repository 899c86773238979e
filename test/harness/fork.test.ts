/**
 * Forking a run, on the memory adapter within one process (a Harness owns the database; the request
 * goes through the mailbox as from any machine): the fork's State is the origin's after round N
 * (captured as the origin's owner committed that round, compared with what the fork holds), cells in
 * flight at round N are never run by the fork (the cell appends a line to a file: one line means one
 * launch), the fork's model is told where it comes from, and bad requests are refused in a sentence.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import { forkRun } from "../../src/harness/operator.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { initialState, type State } from "../../src/state/schema.js";
import { planFork } from "../../src/state/fork.js";
import { Reducer } from "../../src/state/reducer.js";
import { event, identity, type LogEvent } from "../../src/state/events.js";
import type { Storage } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { adds, cmd, conclude, note, tempDir } from "./support.js";
import { until } from "../support/wait.js";

const fast = { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200 };

/** A model driven by a function of the request; it records every call. */
function modelOf(f: (req: ModelRequest) => unknown[]): Model & { calls: ModelRequest[] } {
  const calls: ModelRequest[] = [];
  return {
    name: "fn",
    calls,
    async step(req) {
      calls.push(req);
      return { patch: f(req), usage: { input_tokens: 100, output_tokens: 10 } };
    },
  };
}

/** A cell that appends a line to `name`.lines, then waits for `name`.release (or 60 s). */
function gated(dir: string, name: string): string[] {
  const p = (f: string) => join(dir, `${name}.${f}`);
  return ["sh", "-c", `echo ran >> ${p("lines")}; i=0; while [ ! -e ${p("release")} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done`];
}
const lines = (dir: string, name: string): number => (existsSync(join(dir, `${name}.lines`)) ? readFileSync(join(dir, `${name}.lines`), "utf8").split("\n").filter(Boolean).length : 0);

/**
 * The origin: round 1 runs `echo one` and a note, round 2 a failing command, round 3 the gated cell
 * 4, round 4 concludes from what it saw of cell 4. A fork answers the same way by revision.
 */
function script(dir: string) {
  return modelOf((req) => {
    const s = req.state;
    const next = s.runtime.next_cell_id;
    switch (s.revision) {
      case 0:
        return adds(0, next, [cmd("sh", "-c", "echo one"), note("first")]);
      case 1:
        return adds(1, next, [cmd("sh", "-c", "echo two >&2; exit 3")]);
      case 2:
        return adds(2, next, [cmd(...gated(dir, "g"))]);
      default: {
        const ex = s.runtime.cells["4"];
        if (ex?.phase !== "finished") return adds(s.revision, next, [note("waiting for cell 4")]);
        return adds(s.revision, next, [conclude(ex.result === "success" ? "success" : "failure", `cell 4: ${ex.result}`)]);
      }
    }
  });
}

async function readLog(storage: Storage, name: string): Promise<LogEvent[]> {
  const r = await storage.reader(name);
  try {
    return await r.read(0);
  } finally {
    await r.close();
  }
}

/** Opens a harness on a fresh memory database; `states` collects the origin's State after each round, as committed. */
async function origin(dir: string) {
  const storage = createMemoryStorage();
  const model = script(dir);
  const h = await Harness.open({ storage, name: "f", model, workDir: dir, limits: fast });
  const states = new Map<number, State>();
  let s = "";
  h.follow((batch) => {
    for (const e of batch) {
      if (e.kind !== "patch_accepted" || e.session !== s) continue;
      states.set(Number(/:t(\d+)$/.exec(e.body.turn)![1]), structuredClone(h.session(s)!.state));
    }
  });
  s = await h.start({ goal: "g", cwd: dir });
  return { storage, model, h, s, states };
}

const withoutId = (st: State): Omit<State, "id"> => {
  const { id: _id, ...rest } = st;
  return rest;
};

describe("fork a run (memory adapter, one process)", () => {
  it("the fork's State is the origin's after round N for every N; a cell in flight is UnknownExecution and never launched by the fork", async () => {
    const t = tempDir();
    try {
      const o = await origin(t.dir);
      try {
        await until("cell 4 to run", () => lines(t.dir, "g") === 1);
        await until("round 3 committed", () => o.states.has(3));
        // The pure plan, at every round: the copied part folds to the State the owner had.
        const log = await readLog(o.storage, "f");
        for (let n = 0; n <= 3; n++) {
          const plan = planFork(log.filter((e) => e.session === o.s), { origin: o.s, fork: `p${n}`, round: n, reason: "", at: "2026-01-01T00:00:00.000Z" });
          assert.equal(plan.kind, "plan");
          if (plan.kind !== "plan") continue;
          const r = new Reducer();
          let seq = 0;
          r.apply([plan.created, ...plan.units.filter((u) => u.cell === null).slice(0, -1).flatMap((u) => u.events)].map((e) => ({ ...e, seq: ++seq }) as LogEvent));
          const expected = n === 0 ? withoutId(initialState(o.s, "g")) : withoutId(o.states.get(n)!);
          assert.deepEqual(withoutId(r.session(`p${n}`)!.state), expected, `round ${n}`);
        }

        // The fork itself, through the mailbox, while cell 4 runs in the origin.
        const out = await forkRun(o.storage, "f", o.s, { atRound: 3, newSession: "try2", reason: "another way" }, { waitMs: 60_000 });
        assert.equal(out.status, "applied", out.message);
        assert.equal(out.session, "try2");
        const fork = await o.h.wait("try2");
        assert.equal(fork.result, "failure");
        assert.equal(fork.reason, "the model concluded failure: cell 4: UnknownExecution");
        const f = o.h.session("try2")!;
        assert.deepEqual(f.fork_of, { session: o.s, round: 3, cut_seq: f.fork_of!.cut_seq, revision: 3 });
        assert.equal(f.effect_seed, o.h.session(o.s)!.effect_seed, "a fork keeps its origin's effect seed");
        const cell4 = f.executions.get(4)!;
        assert.equal(cell4.result, "UnknownExecution");
        assert.equal(cell4.unknown?.reason, "forked_while_in_flight");
        assert.deepEqual([1, 3].map((c) => f.executions.get(c)?.result), ["success", "error"], "finished cells are copied as they were");
        // The fork's first round was told where it comes from.
        const first = o.model.calls.find((c) => c.state.id === "try2")!;
        const told = first.state.runtime.inbox.find((ob) => ob.id === "control:fork")!;
        assert.equal((told.payload as { origin: string }).origin, o.s);
        assert.match((told.payload as { message: string }).message, /fork of run s1 after round 3.*cell 4 \(UnknownExecution\).*another way/);
        assert.ok(first.state.runtime.inbox.some((ob) => ob.id === "execution:4"), "the model reads what became of cell 4");
        assert.equal(lines(t.dir, "g"), 1, "the fork never launched cell 4");

        writeFileSync(join(t.dir, "g.release"), "");
        const done = await o.h.wait(o.s);
        assert.equal(done.reason, "the model concluded success: cell 4: success", "the origin is untouched");
        assert.equal(lines(t.dir, "g"), 1);
        const after = await readLog(o.storage, "f");
        assert.equal(after.filter((e) => e.session === "try2" && e.kind === "execution_started" && !e.identity.startsWith("fork:")).length, 0, "the fork launched nothing of its own");
        assert.equal(after.filter((e) => e.kind === "fork_completed").length, 1);
        assert.equal(o.h.inspect("try2").sessions[0]!.fork_of?.session, o.s);

        // A fork made after the origin recorded cell 4's result copies it.
        const again = await forkRun(o.storage, "f", o.s, { atRound: 3 }, { waitMs: 60_000 });
        assert.equal(again.status, "applied", again.message);
        assert.match(again.session, /^s-[0-9a-f]{8}$/);
        const second = await o.h.wait(again.session);
        assert.equal(second.reason, "the model concluded success: cell 4: success");
        assert.equal(lines(t.dir, "g"), 1, "still one launch");
      } finally {
        await o.h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("refuses, in one sentence and with nothing posted: a round beyond the run's, an unknown run, an id in use, a fork of a fork being copied; the same fork again is already made", async () => {
    const t = tempDir();
    try {
      const o = await origin(t.dir);
      try {
        writeFileSync(join(t.dir, "g.release"), "");
        await o.h.wait(o.s);
        const beyond = await forkRun(o.storage, "f", o.s, { atRound: 9 });
        assert.equal(beyond.status, "refused");
        assert.equal(beyond.message, "run s1 has 4 accepted rounds; the round to fork after must be between 0 and 4");
        await assert.rejects(forkRun(o.storage, "f", "nope", { atRound: 1 }), /run "nope" does not exist in database "f"\./);
        await assert.rejects(forkRun(o.storage, "f", o.s, { atRound: 1, newSession: "s9" }), /has the form Cairn reserves/);
        const inUse = await forkRun(o.storage, "f", o.s, { atRound: 1, newSession: "b1" }, { waitMs: 60_000 });
        assert.equal(inUse.status, "applied", inUse.message);
        const taken = await forkRun(o.storage, "f", o.s, { atRound: 2, newSession: "b1" });
        assert.equal(taken.status, "refused");
        assert.equal(taken.message, `run b1 already exists in database "f"; choose another id for the fork`);
        const same = await forkRun(o.storage, "f", o.s, { atRound: 1, newSession: "b1" });
        assert.equal(same.status, "already");
        // Round 0: the State as created, nothing run.
        const zero = await forkRun(o.storage, "f", "b1", { atRound: 0, newSession: "z0" }, { waitMs: 60_000 });
        assert.equal(zero.status, "applied", zero.message);
        assert.equal(o.h.session("z0")!.fork_of?.session, "b1");
        // A fork of a fork after a round it made itself: its model is told of its own origin.
        await o.h.wait("b1");
        const c2 = await forkRun(o.storage, "f", "b1", { atRound: 2, newSession: "c2" }, { waitMs: 60_000 });
        assert.equal(c2.status, "applied", c2.message);
        await o.h.wait("c2");
        const firstOfC2 = o.model.calls.find((c) => c.state.id === "c2")!;
        const toldC2 = firstOfC2.state.runtime.inbox.filter((ob) => ob.id === "control:fork");
        assert.equal(toldC2.length, 1);
        assert.equal((toldC2[0]!.payload as { origin: string }).origin, "b1");
        const log = await readLog(o.storage, "f");
        assert.equal(log.filter((e) => e.kind === "fork_completed").length, 3);
      } finally {
        await o.h.close();
      }
      // A fork whose copy is not complete (its copier stopped) cannot be forked yet.
      const db = await o.storage.open("f");
      try {
        const origin = o.h.session(o.s)!;
        await db.commit([event("session_created", "half", identity.session("half"), "2026-01-01T00:00:00.000Z", { goal: "g", cwd: t.dir, validators: [], budgets: {}, fork: { session: o.s, round: 1, cut_seq: origin.turns.get(`${o.s}:t1`)!.accepted!.seq, revision: 1 } })]);
      } finally {
        await db.close();
      }
      const forming = await forkRun(o.storage, "f", "half", { atRound: 0, newSession: "h2" });
      assert.equal(forming.status, "refused");
      assert.equal(forming.message, "run half is a fork still being copied; fork it once its copy is complete");
    } finally {
      t.cleanup();
    }
  });
});
