/**
 * Properties of the pure part of a fork (src/state/fork.ts), on random runs (fast-check, seeded; the
 * seed is printed): cells queued, started, with output, effects begun and ended, finished in every
 * way, outside observations, rounds admitted by `admit` as the harness does.
 *
 * For every accepted round N of every run:
 *  - the copied part of the fork folds to the State the origin had right after round N's commit;
 *  - the whole fork folds (no corrupt log), every execution in it is finished, those the origin
 *    finished after the cut with the origin's result, the others as UnknownExecution; nothing in it
 *    is an execution started by the fork;
 *  - a copier that died after k units and plans again (the origin having moved on meanwhile, its
 *    in-flight cells maybe finished) commits exactly what is missing: the fork ends complete, with
 *    one result per execution and one `fork_completed`.
 * Re-run a failure with FC_SEED=<seed>.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { admit } from "../../src/state/admission.js";
import { identity, turnId, type EventBody, type EventKind, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { planFork, remainingUnits, type ForkPlan } from "../../src/state/fork.js";
import { admissionContext } from "../../src/state/outcomes.js";
import { Reducer } from "../../src/state/reducer.js";
import type { State } from "../../src/state/schema.js";
import { initialState } from "../../src/state/schema.js";

const seed = process.env["FC_SEED"] !== undefined ? Number(process.env["FC_SEED"]) : Date.now() % 2_147_483_647;
console.log(`fork property seed: ${seed} (re-run with FC_SEED=${seed})`);

const S = "s1";
const AT = "2026-01-01T00:00:00.000Z";

type Step = { kind: "advance"; pick: number; result: "success" | "error" | "UnknownExecution" | "cancelled"; effect: number } | { kind: "observe" } | { kind: "round"; cells: number; notes: number };

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant("advance" as const), pick: fc.nat(20), result: fc.constantFrom("success" as const, "error" as const, "UnknownExecution" as const, "cancelled" as const), effect: fc.nat(5) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("observe" as const) }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("round" as const), cells: fc.nat(3), notes: fc.nat(1) }) },
);

/** A run's log, built event by event as an owner would commit it; `after[n]` is the State after round n's commit. */
class Run {
  readonly events: LogEvent[] = [];
  readonly reducer = new Reducer();
  readonly after = new Map<number, State>();
  private seq = 0;
  private n = 0;
  private obs = 0;

  emit<K extends EventKind>(kind: K, id: string, body: EventBody<K>): void {
    const e = { seq: ++this.seq, identity: id, kind, session: S, at: AT, body } as unknown as LogEvent;
    this.events.push(e);
    this.reducer.apply([e]);
  }

  get s() {
    return this.reducer.session(S)!;
  }

  step(x: Step): void {
    if (x.kind === "observe") {
      const id = `ext-${++this.obs}`;
      this.emit("inbox_received", identity.inbox(S, id), { observation: { id, source: "external", kind: "message", at: AT, payload: { n: this.obs } } });
    } else if (x.kind === "advance") {
      const live = [...this.s.executions.values()].filter((e) => e.phase !== "finished").sort((a, b) => a.cell_id - b.cell_id);
      if (live.length === 0) return;
      const ex = live[x.pick % live.length]!;
      const c = ex.cell_id;
      if (ex.phase === "queued" && x.result !== "cancelled") {
        this.emit("execution_started", identity.execution(S, c), { cell_id: c, host: "h", boot_id: "b", pid: 100 + c, pgid: 100 + c, start_time: "1" });
        return;
      }
      if (ex.phase === "started" && x.effect > 0 && x.effect < 4) {
        const name = `e${x.effect}`;
        const attempt = (this.s.effects.get(name)?.attempts.length ?? 0) + 1;
        this.emit("effect_begun", identity.effectBegun(S, name, attempt), { name, cell_id: c, attempt });
        if (x.effect === 2 && this.s.effects.get(name)!.ended === null) this.emit("effect_ended", identity.effectEnded(S, name), { name, cell_id: c, result: { ok: true } });
        return;
      }
      if (ex.phase === "started" && x.effect === 4) {
        this.emit("execution_output", identity.output(S, c, ex.output_chunks), { cell_id: c, n: ex.output_chunks, stream: "stdout", data: `out ${c}\n` });
        return;
      }
      const result = ex.phase === "queued" ? "cancelled" : x.result;
      const unknown = result === "UnknownExecution" ? { type: "UnknownExecution" as const, cell_id: c, reason: "worker_lost_before_result_commit", worker_stopped: true, evidence_refs: [] } : null;
      this.emit("execution_finished", identity.finished(S, c), { cell_id: c, result, exit_code: result === "success" ? 0 : null, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null, unknown });
      const oid = `execution:${c}`;
      this.emit("inbox_received", identity.inbox(S, oid), { observation: { id: oid, source: "execution", kind: `execution_${result}`, at: AT, payload: { cell_id: c, result } } });
    } else {
      this.n += 1;
      const turn = turnId(S, this.n);
      this.emit("turn_prepared", identity.turn(turn), { turn, n: this.n, revision: this.s.state.revision, delivered: [...this.s.pending] });
      this.emit("model_attempt", identity.attempt(turn, 1), { turn, attempt: 1 });
      const next = this.s.state.runtime.next_cell_id;
      const cells = [
        ...Array.from({ length: x.cells }, (_, i) => ({ id: next + i, previous_id: null, kind: "cmd", argv: ["true"] })),
        ...Array.from({ length: x.notes }, (_, i) => ({ id: next + x.cells + i, previous_id: null, kind: "note", text: "thinking" })),
      ];
      const patch = [{ op: "test", path: "/revision", value: this.s.state.revision }, ...cells.map((value) => ({ op: "add", path: "/cells/-", value }))];
      this.emit("model_response", identity.response(turn, 1), { turn, attempt: 1, patch, usage: { input_tokens: 10, output_tokens: 5 } });
      const out = admit(admissionContext(this.s, this.reducer.headSeq), patch, turn);
      assert.ok(out.ok, out.ok ? "" : out.reason);
      const rc = out.receipt;
      this.emit("patch_accepted", identity.patch(turn), { turn, attempt: 1, patch, revision: rc.revision, new_cell_ids: rc.newCells.map((c) => c.id), removed_ids: [...rc.removedIds], consumed: [...rc.consumed] });
      for (const c of rc.newCells) if (c.kind !== "note") this.emit("execution_queued", identity.queued(S, c.id), { cell_id: c.id, kind: c.kind });
      this.after.set(this.n, structuredClone(this.s.state));
    }
  }
}

const fork = "f1";
const spec = (round: number) => ({ origin: S, fork, round, reason: "", at: "2026-02-01T00:00:00.000Z" });

/** Folds `events` as a fork's log (seqs 1..). Throws LogCorrupt for a log the reducer refuses. */
function foldAll(events: readonly NewEvent[]): Reducer {
  const r = new Reducer();
  r.apply(events.map((e, i) => ({ ...e, seq: i + 1 }) as LogEvent));
  return r;
}

function complete(r: Reducer, plan: ForkPlan, origin: Reducer): void {
  const f = r.session(fork)!;
  assert.equal(f.forming, null, "fork_completed was folded");
  for (const ex of f.executions.values()) assert.equal(ex.phase, "finished", `cell ${ex.cell_id} is finished in the fork`);
  for (const c of plan.inFlight) {
    const o = origin.session(S)!.executions.get(c.cell_id);
    const expected = o?.phase === "finished" ? o.result : "UnknownExecution";
    assert.equal(f.executions.get(c.cell_id)!.result, c.result);
    assert.equal(c.result, expected, `cell ${c.cell_id}: the fork has ${c.result}, the origin ${expected}`);
    assert.ok(f.pending.includes(`execution:${c.cell_id}`), `the fork's model reads what became of cell ${c.cell_id}`);
  }
}

const without = (st: State) => ({ ...st, id: "" });

test("a fork's State is its origin's after round N; in-flight cells end as the origin recorded them or UnknownExecution; a resumed copy commits exactly what is missing", () => {
  let rounds = 0;
  let inFlight = 0;
  let resumedChanged = 0;
  fc.assert(
    fc.property(fc.array(stepArb, { minLength: 1, maxLength: 40 }), fc.nat(1000), fc.nat(1000), (steps, kPick, tPick) => {
      const run = new Run();
      run.emit("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {}, effect_seed: "0123456789abcdef0123456789abcdef" });
      const cuts: number[] = [run.events.length];
      for (const x of steps) {
        run.step(x);
        cuts.push(run.events.length);
      }
      for (let n = 0; n <= run.after.size; n++) {
        const plan = planFork(run.events, spec(n));
        assert.equal(plan.kind, "plan");
        if (plan.kind !== "plan") return;
        rounds += 1;
        inFlight += plan.inFlight.length;
        // The copied part folds to the State after round n.
        const copied = foldAll([plan.created, ...plan.units.filter((u) => u.cell === null).slice(0, -1).flatMap((u) => u.events)]);
        const expected = n === 0 ? initialState(S, "g") : run.after.get(n)!;
        assert.deepEqual(without(copied.session(fork)!.state), without(expected), `round ${n}`);
        // The whole fork.
        const all = plan.units.flatMap((u) => u.events);
        const whole = foldAll([plan.created, ...all]);
        complete(whole, plan, run.reducer);
        assert.equal(all.filter((e) => e.kind === "fork_completed").length, 1);
        assert.ok(all.every((e) => e.session === fork && (e.identity.startsWith(`fork:${fork}:`) || e.identity.startsWith(`fork_completed:${fork}`) || e.identity === identity.inbox(fork, "control:fork"))));
        // A copier that died after k units of a plan made when the log ended at event T.
        const cutIndex = run.events.findIndex((e) => e.seq === plan.origin.cut_seq);
        const laterCuts = cuts.filter((c) => c > cutIndex);
        const t = laterCuts.length === 0 ? run.events.length : laterCuts[tPick % laterCuts.length]!;
        const early = planFork(run.events.slice(0, t), spec(n));
        assert.equal(early.kind, "plan");
        if (early.kind !== "plan") return;
        const k = kPick % (early.units.length + 1);
        const committed = early.units.slice(0, k).flatMap((u) => u.events);
        const done = new Set(committed.map((e) => e.identity));
        const finished = new Set(committed.filter((e): e is NewEvent<"execution_finished"> => e.kind === "execution_finished").map((e) => e.body.cell_id));
        const rest = remainingUnits(plan, done, finished).flatMap((u) => u.events);
        if (t === run.events.length) assert.deepEqual(rest, plan.units.slice(k).flatMap((u) => u.events), "an unchanged origin: the rest of the same plan");
        else resumedChanged += 1;
        const resumed = foldAll([plan.created, ...committed, ...rest]);
        const f = resumed.session(fork)!;
        assert.equal(f.forming, null);
        for (const ex of f.executions.values()) assert.equal(ex.phase, "finished");
        const log = [...committed, ...rest];
        const results = log.filter((e): e is NewEvent<"execution_finished"> => e.kind === "execution_finished").map((e) => e.body.cell_id);
        assert.equal(new Set(results).size, results.length, "one result per execution");
        assert.equal(new Set(log.map((e) => e.identity)).size, log.length, "no identity twice");
        const stated = log.filter((e): e is NewEvent<"fork_completed"> => e.kind === "fork_completed");
        assert.equal(stated.length, 1);
        assert.equal(stated[0]!.body.copied, log.filter((e) => e.identity.startsWith(`fork:${fork}:`)).length, "fork_completed counts the copies in the fork's log");
        assert.deepEqual(without(f.state).cells, without(whole.session(fork)!.state).cells);
      }
      // A round beyond the run's is refused in a sentence.
      const beyond = planFork(run.events, spec(run.after.size + 1));
      assert.equal(beyond.kind, "refused");
    }),
    { seed, numRuns: 150 },
  );
  console.log(`fork property: ${rounds} forks planned, ${inFlight} in-flight executions, ${resumedChanged} resumed after the origin moved`);
  assert.ok(rounds >= 300 && inFlight >= 50 && resumedChanged >= 50, "the generator exercised forks with cells in flight and resumed copies");
});
