/**
 * Property tests for admission and the reducer (fast-check, seeded; the seed is printed).
 * Re-run a failure with FC_SEED=<seed> node --import tsx --test test/state/property.test.ts
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { Admission, AdmissionContext, RejectionCode } from "../../src/state/admission.js";
import { admit } from "../../src/state/admission.js";
import type { EventBody, EventKind, LogEvent } from "../../src/state/events.js";
import { identity, parseLogEvent, turnId } from "../../src/state/events.js";
import type { ExecutionRecord, SessionProjection } from "../../src/state/projection.js";
import { isUnresolvedUnknown, queuedExecution, runtimeCellsView } from "../../src/state/projection.js";
import { Reducer, reduce } from "../../src/state/reducer.js";
import type { Cell } from "../../src/state/schema.js";
import { State } from "../../src/state/schema.js";
import { deepFreeze, execution, LogBuilder, makeCtx, observation } from "./helpers.js";
import type { Intent, Targets } from "./patchgen.js";
import { buildPatch, intent } from "./patchgen.js";

const seed = process.env["FC_SEED"] !== undefined ? Number(process.env["FC_SEED"]) : Date.now() % 2_147_483_647;
const numRuns = 200;
console.log(`property seed: ${seed} (re-run with FC_SEED=${seed})`);

const CODES = new Set<RejectionCode>(["invalid_patch", "revision", "forbidden_op", "forbidden_path", "invalid_cell", "cell_id", "previous_id", "busy_cell", "removal_order", "test_failed", "role", "conclusion_blocked", "round_conflict", "pep723"]);

function checkShape(out: Admission): void {
  if (out.ok) State.parse(out.receipt.state);
  else {
    assert.ok(CODES.has(out.code), `unknown code ${out.code}`);
    assert.ok(out.reason.length > 10, "a rejection says why");
  }
}

function targets(ctx: AdmissionContext): Targets {
  const unknownIds = [...ctx.executions.values()].filter(isUnresolvedUnknown).map((e) => e.cell_id).sort((a, b) => a - b);
  const executableIds = [...ctx.cellsEver.values()].filter((c) => c.kind !== "note").map((c) => c.id).sort((a, b) => a - b);
  return { unknownIds, executableIds, headSeq: ctx.headSeq };
}

// ---------------------------------------------------------------------------------------------
// (1) admission never mutates its inputs, whatever the patch.

const phaseArb = fc.constantFrom("none", "queued", "started", "success", "error", "UnknownExecution", "resolved");
const cellArb = fc.record({ kind: fc.constantFrom("note", "cmd", "script"), phase: phaseArb, inContext: fc.boolean() });

const ctxArb = fc
  .record({ cells: fc.array(cellArb, { maxLength: 7 }), revision: fc.nat(30), inbox: fc.nat(3), pending: fc.nat(2), headSeq: fc.nat(50), priorRound: fc.boolean() })
  .map((g): AdmissionContext => {
    const inContext: Cell[] = [];
    const removed: Cell[] = [];
    const executions: ExecutionRecord[] = [];
    g.cells.forEach((c, i) => {
      const id = i + 1;
      const cell: Cell = c.kind === "note" ? { id, previous_id: null, kind: "note", text: "n" } : c.kind === "cmd" ? { id, previous_id: null, kind: "cmd", argv: ["ls"] } : { id, previous_id: null, kind: "script", source: "# /// script\n# ///\n" };
      (c.inContext ? inContext : removed).push(cell);
      if (c.kind === "note" || c.phase === "none") return;
      if (c.phase === "queued" || c.phase === "started") executions.push(execution(id, c.phase));
      else if (c.phase === "resolved") executions.push(execution(id, "finished", "UnknownExecution", { resolved_by: 1 }));
      else executions.push(execution(id, "finished", c.phase));
    });
    const accepted = g.priorRound ? new Map([["prior", { patch: [{ op: "test", path: "/revision", value: 0 }], revision: 1, newCellIds: [] as number[] }]]) : new Map();
    return makeCtx({
      cells: inContext,
      removed,
      revision: g.revision,
      executions,
      inbox: Array.from({ length: g.inbox }, (_, i) => observation(`o${i}`)),
      pending: g.pending,
      headSeq: g.headSeq,
      accepted,
    });
  });

const garbageArb = fc.oneof(fc.anything({ withNullPrototype: true, withObjectString: true }), fc.jsonValue(), fc.array(fc.record({ op: fc.string(), path: fc.string(), value: fc.jsonValue() }), { maxLength: 4 }));

test("(1) admit never mutates its inputs and never throws, for valid and garbage patches", () => {
  let accepted = 0;
  fc.assert(
    fc.property(ctxArb, fc.array(intent, { maxLength: 5 }), garbageArb, fc.nat(9), fc.constantFrom("r1", "prior"), (ctx, intents, garbage, choice, round) => {
      const patch = choice < 6 ? buildPatch(ctx.state, intents, targets(ctx), choice === 5) : garbage;
      const snap = (p: unknown) => JSON.stringify([ctx.state, [...ctx.executions], [...ctx.cellsEver], [...ctx.accepted], p === undefined ? "undefined" : p]);
      const before = snap(patch);
      deepFreeze(ctx);
      deepFreeze(patch);
      const out = admit(ctx, patch, round);
      assert.equal(snap(patch), before);
      checkShape(out);
      assert.deepEqual(admit(ctx, patch, round), out, "admit is deterministic");
      if (out.ok && !out.receipt.replay) accepted += 1;
    }),
    { seed, numRuns },
  );
  console.log(`(1) accepted ${accepted} of ${numRuns} patches`);
  assert.ok(accepted >= numRuns / 20, `too few accepted patches (${accepted}): the generator is not exercising acceptance`);
});

// ---------------------------------------------------------------------------------------------
// (2) admitted patches, written as events and folded, give exactly the State admission returned.

interface Round {
  readonly execs: readonly { pick: number; result: "success" | "error" | "UnknownExecution" | "cancelled" }[];
  readonly obsBefore: boolean;
  readonly obsDuring: boolean;
  readonly intents: readonly Intent[];
  readonly stale: boolean;
  readonly replayLast: boolean;
}

const roundArb: fc.Arbitrary<Round> = fc.record({
  execs: fc.array(fc.record({ pick: fc.nat(20), result: fc.constantFrom("success" as const, "error" as const, "UnknownExecution" as const, "cancelled" as const) }), { maxLength: 4 }),
  obsBefore: fc.boolean(),
  obsDuring: fc.integer({ min: 0, max: 5 }).map((x) => x === 0),
  intents: fc.array(intent, { minLength: 0, maxLength: 5 }),
  stale: fc.integer({ min: 0, max: 12 }).map((x) => x === 0),
  replayLast: fc.integer({ min: 0, max: 8 }).map((x) => x === 0),
});

const S = "s1";

class Run {
  readonly log = new LogBuilder(S);
  readonly reducer = new Reducer();
  private obs = 0;
  turnN = 0;
  openTurn: string | null = null;
  attempt = 0;
  lastAccepted: { turn: string; patch: unknown; revision: number } | null = null;
  /** Executable cells of an accepted patch whose execution_queued is not folded yet (same commit). */
  readonly toQueue = new Set<number>();

  emit<K extends EventKind>(kind: K, id: string, body: EventBody<K>): void {
    const e = this.log.add(kind, id, body) as unknown as LogEvent;
    parseLogEvent(e);
    this.reducer.apply([e]);
    // The reducer keeps runtime.cells up to date from the change alone (not by a scan of every
    // execution): after every event it must equal the view computed from scratch. Between an accepted
    // patch and its execution_queued events (one commit), a new executable cell shows as queued.
    const s = this.reducer.session(S);
    if (s !== undefined) {
      const executions = new Map(s.executions);
      if (kind === "patch_accepted") for (const cid of (body as EventBody<"patch_accepted">).new_cell_ids) this.toQueue.add(cid);
      if (kind === "execution_queued") this.toQueue.delete((body as EventBody<"execution_queued">).cell_id);
      for (const cid of this.toQueue) {
        const c = s.cells.get(cid);
        if (c !== undefined && c.kind !== "note" && !executions.has(cid)) executions.set(cid, queuedExecution(cid, c.kind, 0));
      }
      assert.equal(JSON.stringify(s.state.runtime.cells), JSON.stringify(runtimeCellsView(s.state.cells, executions)), `runtime.cells after ${kind} (${id}) equals the view computed from scratch`);
    }
  }

  get s(): SessionProjection {
    return this.reducer.session(S)!;
  }

  observe(): void {
    this.obs += 1;
    const id = `ext-${this.obs}`;
    this.emit("inbox_received", identity.inbox(S, id), { observation: observation(id) });
  }

  ctx(): AdmissionContext {
    const s = this.s;
    const accepted = new Map<string, { patch: unknown; revision: number; newCellIds: number[] }>();
    for (const t of s.turns.values()) {
      if (t.accepted === null) continue;
      const newCellIds = (t.accepted.patch as { op: string; value?: { id: number } }[]).filter((o) => o.op === "add" || o.op === "replace").map((o) => o.value!.id);
      accepted.set(t.turn, { patch: t.accepted.patch, revision: t.accepted.revision, newCellIds });
    }
    return { state: s.state, executions: new Map(s.executions), cellsEver: new Map(s.cells), pendingObservations: s.pending.length, headSeq: this.reducer.headSeq, accepted };
  }

  advanceExecutions(actions: Round["execs"]): void {
    for (const a of actions) {
      const live = [...this.s.executions.values()].filter((e) => e.phase !== "finished").sort((x, y) => x.queued_seq - y.queued_seq);
      if (live.length === 0) return;
      const ex = live[a.pick % live.length]!;
      if (ex.phase === "queued" && a.result !== "cancelled") {
        this.emit("execution_started", identity.execution(S, ex.cell_id), { cell_id: ex.cell_id, host: "h", boot_id: "b", pid: 100 + ex.cell_id, pgid: 100 + ex.cell_id, start_time: "1" });
        continue;
      }
      const result = ex.phase === "queued" ? "cancelled" : a.result;
      const unknown = result === "UnknownExecution" ? { type: "UnknownExecution" as const, cell_id: ex.cell_id, reason: "worker_lost_before_result_commit", worker_stopped: true, evidence_refs: [] } : null;
      if (ex.phase === "started") this.emit("execution_output", identity.output(S, ex.cell_id, 0), { cell_id: ex.cell_id, n: 0, stream: "stdout", data: `out ${ex.cell_id}\n` });
      this.emit("execution_finished", identity.finished(S, ex.cell_id), { cell_id: ex.cell_id, result, exit_code: result === "success" ? 0 : null, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null, unknown });
      const oid = `execution:${ex.cell_id}`;
      this.emit("inbox_received", identity.inbox(S, oid), { observation: { id: oid, source: "execution", kind: "finished", at: this.log.at, payload: { cell_id: ex.cell_id, result } } });
    }
  }

  prepareTurn(): void {
    if (this.openTurn !== null) return;
    this.turnN += 1;
    this.openTurn = turnId(S, this.turnN);
    this.attempt = 0;
    this.emit("turn_prepared", identity.turn(this.openTurn), { turn: this.openTurn, n: this.turnN, revision: this.s.state.revision, delivered: [...this.s.pending] });
  }
}

test("(2) admitted patches folded by the Reducer give the State admission returned", () => {
  const seen = new Map<string, number>();
  let acceptedTotal = 0;
  let replays = 0;
  fc.assert(
    fc.property(fc.array(roundArb, { minLength: 1, maxLength: 8 }), (rounds) => {
      const run = new Run();
      run.emit("session_created", identity.session(S), { goal: "make the tests pass", cwd: "/w", validators: [], budgets: {} });
      let lastState: State | null = null;
      for (const r of rounds) {
        run.advanceExecutions(r.execs);
        if (r.obsBefore) run.observe();
        if (r.replayLast && run.lastAccepted !== null) {
          const last = run.lastAccepted;
          const out = admit(run.ctx(), last.patch, last.turn);
          assert.ok(out.ok && out.receipt.replay && out.receipt.revision === last.revision, "a re-submitted accepted patch is a replay");
          replays += 1;
        }
        run.prepareTurn();
        if (r.obsDuring) run.observe();
        const turn = run.openTurn!;
        run.attempt += 1;
        const ctx = run.ctx();
        const patch = buildPatch(ctx.state, r.intents, targets(ctx), r.stale);
        const delivered = [...run.s.delivered];
        const before = structuredClone(run.s.state);
        run.emit("model_attempt", identity.attempt(turn, run.attempt), { turn, attempt: run.attempt });
        run.emit("model_response", identity.response(turn, run.attempt), { turn, attempt: run.attempt, patch: patch as never, usage: { input_tokens: 10, output_tokens: 5 } });
        const stateAtResponse = run.s.state;
        const out = admit({ ...ctx, state: stateAtResponse, headSeq: run.reducer.headSeq }, patch, turn);
        checkShape(out);
        if (!out.ok) {
          seen.set(out.code, (seen.get(out.code) ?? 0) + 1);
          run.emit("patch_rejected", identity.rejected(turn, run.attempt), { turn, attempt: run.attempt, code: out.code, reason: out.reason });
          assert.deepEqual(run.s.state.cells, before.cells, "a rejected patch changes nothing");
          assert.equal(run.s.state.revision, before.revision);
          continue;
        }
        const rc = out.receipt;
        assert.deepEqual(rc.consumed, delivered, "a patch consumes exactly the observations delivered to its round");
        run.emit("patch_accepted", identity.patch(turn), { turn, attempt: run.attempt, patch: patch as never, revision: rc.revision, new_cell_ids: rc.newCells.map((c) => c.id), removed_ids: [...rc.removedIds], consumed: [...rc.consumed] });
        for (const c of rc.newCells) if (c.kind !== "note") run.emit("execution_queued", identity.queued(S, c.id), { cell_id: c.id, kind: c.kind });
        assert.deepEqual(run.s.state, rc.state, "the folded State equals the admitted State");
        seen.set("accepted", (seen.get("accepted") ?? 0) + 1);
        acceptedTotal += 1;
        run.lastAccepted = { turn, patch, revision: rc.revision };
        run.openTurn = null;
        lastState = rc.state;
      }
      // A fresh fold of the whole log gives the same State as the last admission.
      const fresh = reduce(run.log.events).sessions.get(S)!;
      assert.deepEqual(fresh.state, run.s.state);
      if (lastState !== null && run.openTurn === null) assert.deepEqual(fresh.state, lastState);
    }),
    { seed, numRuns },
  );
  console.log(`(2) outcomes: ${JSON.stringify(Object.fromEntries([...seen].sort()))}, replays checked: ${replays}`);
  assert.ok(acceptedTotal >= numRuns, `too few accepted patches (${acceptedTotal}) for ${numRuns} runs`);
  for (const code of ["busy_cell", "cell_id", "forbidden_path", "role", "pep723"]) assert.ok((seen.get(code) ?? 0) > 0, `the generator never produced ${code}`);
});
