/**
 * Conformance cases about snapshots: writeSnapshot / latestSnapshot rules, and the property that a
 * reopen after a snapshot (latest snapshot + tail) sees the same projection as a fold of the whole
 * log, over random valid logs (fast-check, seeded: a failure names its seed; FC_SEED=<n> re-runs it).
 *
 * fast-check is loaded when the property runs (it is a development dependency): an adapter author
 * running the suite needs it installed, as a test dependency.
 */
import assert from "node:assert/strict";
import type FastCheck from "fast-check";
import { ConfigError } from "../../errors.js";
import { admit } from "../../state/admission.js";
import { event, identity, turnId, type LogEvent, type NewEvent } from "../../state/events.js";
import { Reducer, reduce } from "../../state/reducer.js";
import { encodeSnapshot, restoreSnapshot } from "../../state/snapshot.js";
import type { Storage, StoredSnapshot } from "../contract.js";
import { loadProjection } from "../snapshots.js";
import type { ConformanceCase } from "./types.js";
import { AT, hasError, inbox, inboxBatch, isFenced, Owner, sessionCreated } from "./fixtures.js";

const seed = process.env["FC_SEED"] !== undefined ? Number(process.env["FC_SEED"]) : Date.now() % 2_147_483_647;

type Fc = typeof FastCheck;

async function loadFastCheck(): Promise<Fc> {
  try {
    return ((await import("fast-check")) as { default: Fc }).default;
  } catch (cause) {
    throw new ConfigError("the snapshot property case needs the fast-check package; install it as a test dependency (npm install --save-dev fast-check).", { cause });
  }
}

/** One step of a generated run; each becomes one commit (a batch) when it applies. */
type Step =
  | { t: "observe"; session: number }
  | { t: "round"; session: number; cmds: number; note: boolean; reject: boolean }
  | { t: "advance"; session: number; result: "success" | "error" | "cancelled"; outputs: number }
  | { t: "timer"; session: number; fire: boolean }
  | { t: "steer"; session: number; what: "pause" | "unpause" | "gate" | "approve" | "deny" }
  | { t: "session" };

/** Random steps of a run (see generateBatches). */
export function stepArb(fc: Fc): FastCheck.Arbitrary<Step> {
  return fc.oneof(
  { weight: 2, arbitrary: fc.record({ t: fc.constant("observe" as const), session: fc.nat(2) }) },
  { weight: 4, arbitrary: fc.record({ t: fc.constant("round" as const), session: fc.nat(2), cmds: fc.nat(2), note: fc.boolean(), reject: fc.nat(4).map((x) => x === 0) }) },
  { weight: 5, arbitrary: fc.record({ t: fc.constant("advance" as const), session: fc.nat(2), result: fc.constantFrom("success" as const, "success" as const, "error" as const, "cancelled" as const), outputs: fc.nat(3) }) },
  { weight: 1, arbitrary: fc.record({ t: fc.constant("timer" as const), session: fc.nat(2), fire: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ t: fc.constant("session" as const) }) },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("steer" as const), session: fc.nat(2), what: fc.constantFrom("pause" as const, "unpause" as const, "gate" as const, "approve" as const, "deny" as const) }) },
  );
}

/**
 * Turns steps into valid batches: a model of the run (a Reducer over what was generated) decides
 * what each step can do, and admission computes accepted patches, so every batch folds.
 */
export function generateBatches(steps: readonly Step[]): NewEvent[][] {
  const r = new Reducer();
  const batches: NewEvent[][] = [];
  let seq = 0;
  let obs = 0;
  let timers = 0;
  const sessions: string[] = [];
  const push = (batch: NewEvent[]): void => {
    if (batch.length === 0) return;
    r.apply(batch.map((e) => ({ ...structuredClone(e), seq: ++seq }) as LogEvent));
    batches.push(batch);
  };
  const newSession = (): void => {
    const s = `s${sessions.length + 1}`;
    sessions.push(s);
    push([event("session_created", s, identity.session(s), AT, { goal: `goal of ${s} ✓`, cwd: "/work", validators: [["true"]], budgets: { max_rounds: 50 } })]);
  };
  newSession();
  for (const step of steps) {
    if (step.t === "session") {
      if (sessions.length < 3) newSession();
      continue;
    }
    const s = sessions[step.session % sessions.length]!;
    const p = r.session(s)!;
    if (step.t === "steer") {
      // An operator's pause or unpause, or an approval gate on the oldest queued cell and its decision.
      const n = ++obs;
      if (step.what === "pause" || step.what === "unpause") {
        const body = { request: `r${n}`, reason: step.what === "pause" ? "a look ✓" : "" };
        push([step.what === "pause" ? event("run_paused", s, identity.steer(s, `r${n}`), AT, { ...body, now: n % 2 === 0 }) : event("run_unpaused", s, identity.steer(s, `r${n}`), AT, body)]);
        continue;
      }
      const head = [...p.executions.values()].filter((e) => e.phase === "queued").sort((a, b) => a.queued_seq - b.queued_seq)[0];
      if (head === undefined) continue;
      if (step.what === "gate") {
        if (head.approval === null) push([event("approval_requested", s, identity.approvalRequested(s, head.cell_id), AT, { cell_id: head.cell_id, rule: "argv:echo" })]);
        continue;
      }
      if (head.approval?.state !== "waiting") continue;
      const decided = event("approval_decided", s, identity.approvalDecided(s, head.cell_id), AT, { cell_id: head.cell_id, request: `r${n}`, decision: step.what === "approve" ? "approved" : "denied", reason: "r ✓" });
      if (step.what === "approve") push([decided]);
      else {
        const oid = `execution:${head.cell_id}`;
        push([
          decided,
          event("execution_finished", s, identity.finished(s, head.cell_id), AT, { cell_id: head.cell_id, result: "cancelled", exit_code: null, signal: null, duration_ms: null, output_bytes: 0, dropped_bytes: 0, detail: "denied", unknown: null }),
          event("inbox_received", s, identity.inbox(s, oid), AT, { observation: { id: oid, source: "execution", kind: "execution_denied", at: AT, payload: { cell_id: head.cell_id } } }),
        ]);
      }
      continue;
    }
    if (step.t === "observe") {
      const id = `ext-${++obs}`;
      push([event("inbox_received", s, identity.inbox(s, id), AT, { observation: { id, source: "external", kind: "message", at: AT, payload: { text: `hello ${id} — ü`, n: obs } } })]);
    } else if (step.t === "timer") {
      const due = [...p.timers.values()].find((t) => !t.fired);
      if (step.fire && due !== undefined) {
        const oid = `timer:${due.timer_id}`;
        push([
          event("timer_fired", s, identity.timerFired(s, due.timer_id), AT, { timer_id: due.timer_id, due_at: due.due_at, late_ms: 3 }),
          event("inbox_received", s, identity.inbox(s, oid), AT, { observation: { id: oid, source: "timer", kind: "fired", at: AT, payload: { timer_id: due.timer_id } } }),
        ]);
      } else {
        const id = `t${++timers}`;
        push([event("timer_registered", s, identity.timer(s, id), AT, { timer_id: id, cell_id: null, due_at: AT, note: "wake me" })]);
      }
    } else if (step.t === "advance") {
      const live = [...p.executions.values()].filter((e) => e.phase !== "finished").sort((a, b) => a.queued_seq - b.queued_seq)[0];
      if (live === undefined) continue;
      const id = live.cell_id;
      if (live.phase === "queued" && step.result !== "cancelled") {
        push([event("execution_started", s, identity.execution(s, id), AT, { cell_id: id, host: "h", boot_id: "b", pid: 100 + id, pgid: 100 + id, start_time: "42" })]);
        continue;
      }
      const out: NewEvent[] = [];
      if (live.phase === "started") {
        for (let n = 0; n < step.outputs; n++) out.push(event("execution_output", s, identity.output(s, id, live.output_chunks + n), AT, { cell_id: id, n: live.output_chunks + n, stream: n % 2 === 0 ? "stdout" : "stderr", data: `line ${n} of ${id} 🚀\n` }));
      }
      const result = live.phase === "queued" ? "cancelled" : step.result;
      const oid = `execution:${id}`;
      push([
        ...out,
        event("execution_finished", s, identity.finished(s, id), AT, { cell_id: id, result, exit_code: result === "success" ? 0 : result === "error" ? 1 : null, signal: null, duration_ms: 5, output_bytes: 0, dropped_bytes: 0, detail: null, unknown: null }),
        event("inbox_received", s, identity.inbox(s, oid), AT, { observation: { id: oid, source: "execution", kind: "finished", at: AT, payload: { cell_id: id, result } } }),
      ]);
    } else {
      // A model round: prepare (when none is open), attempt, response, then admission's verdict.
      const prep: NewEvent[] = [];
      let turn = p.open_turn;
      if (turn === null) {
        turn = turnId(s, p.turn_count + 1);
        prep.push(event("turn_prepared", s, identity.turn(turn), AT, { turn, n: p.turn_count + 1, revision: p.state.revision, delivered: [...p.pending] }));
        push(prep);
      }
      const t = r.session(s)!.turns.get(turn)!;
      const attempt = t.attempts + 1;
      const state = r.session(s)!.state;
      const next = state.runtime.next_cell_id;
      const ops: unknown[] = [{ op: "test", path: "/revision", value: step.reject ? state.revision + 7 : state.revision }];
      let id = next;
      for (let i = 0; i < step.cmds; i++) ops.push({ op: "add", path: "/cells/-", value: { id: id++, previous_id: null, kind: "cmd", argv: ["echo", `cell ${i}`] } });
      if (step.note) ops.push({ op: "add", path: "/cells/-", value: { id: id++, previous_id: null, kind: "note", text: "thinking ✓" } });
      push([
        event("model_attempt", s, identity.attempt(turn, attempt), AT, { turn, attempt }),
        event("model_response", s, identity.response(turn, attempt), AT, { turn, attempt, patch: ops, usage: { input_tokens: 100, output_tokens: 20 } }),
      ]);
      const q = r.session(s)!;
      const accepted = new Map<string, { patch: unknown; revision: number; newCellIds: number[] }>();
      const verdict = admit({ state: q.state, executions: q.executions, cellsEver: q.cells, pendingObservations: q.pending.length, headSeq: seq, accepted }, ops, turn);
      if (!verdict.ok) {
        push([event("patch_rejected", s, identity.rejected(turn, attempt), AT, { turn, attempt, code: verdict.code, reason: verdict.reason })]);
        continue;
      }
      const rc = verdict.receipt;
      push([
        event("patch_accepted", s, identity.patch(turn), AT, { turn, attempt, patch: ops, revision: rc.revision, new_cell_ids: rc.newCells.map((c) => c.id), removed_ids: [...rc.removedIds], consumed: [...rc.consumed] }),
        ...rc.newCells.filter((c) => c.kind !== "note").map((c) => event("execution_queued", s, identity.queued(s, c.id), AT, { cell_id: c.id, kind: c.kind as "cmd" })),
      ]);
    }
  }
  return batches;
}

/** How many generated runs the property checks per adapter (each opens fresh databases). */
const RUNS = Number(process.env["CAIRN_SNAPSHOT_RUNS"] ?? "12");

/** A stored snapshot's position and text (an adapter may add `verified`). */
function stored(s: StoredSnapshot | null): { seq: number; data: string } | null {
  return s === null ? null : { seq: s.seq, data: s.data };
}

export const snapshotCases: ConformanceCase[] = [
  {
    id: "snapshot.rules",
    name: "snapshots: none at first, the latest one wins, seq must be committed and may not go back, fenced handles cannot write",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      assert.equal(await db.db.latestSnapshot(), null, "a new database has no snapshot");
      await db.commit([sessionCreated("s1")]);
      await db.commit(inboxBatch("s1", "a", 3));
      await assert.rejects(db.db.writeSnapshot(5, "x"), hasError("rejected", "invalid"), "a seq past the head is refused");
      await assert.rejects(db.db.writeSnapshot(0, "x"), hasError("rejected", "invalid"));
      await assert.rejects(db.db.writeSnapshot(2, ""), hasError("rejected", "invalid"), "an empty snapshot is refused");
      await db.db.writeSnapshot(1, "first snapshot ✓");
      assert.deepEqual(stored(await db.db.latestSnapshot()), { seq: 1, data: "first snapshot ✓" });
      const big = "ü".repeat(700_000) + "end";
      await db.db.writeSnapshot(4, big);
      assert.deepEqual(stored(await db.db.latestSnapshot()), { seq: 4, data: big }, "a snapshot larger than one etcd request round-trips");
      await assert.rejects(db.db.writeSnapshot(2, "older"), hasError("rejected", "invalid"), "snapshots only move forward");
      await db.commit([inbox("s1", "after")]);
      assert.equal(await db.head(), 5, "commits continue after a snapshot");
      const other = await target.reopenStorage();
      const reader = await other.reader(name);
      assert.deepEqual(stored(await reader.latestSnapshot()), { seq: 4, data: big }, "a reader in another process sees the latest snapshot");
      await reader.close();
      const b = await other.open(name);
      await assert.rejects(db.db.writeSnapshot(5, "from the fenced owner"), isFenced);
      assert.deepEqual(stored(await b.latestSnapshot()), { seq: 4, data: big }, "the fenced owner wrote nothing");
      assert.equal((await b.read(4)).length, 1, "the tail after the snapshot is readable");
      await b.close();
      await db.close();
    },
  },
  {
    id: "snapshot.property",
    name: "snapshots: a reopen after a snapshot sees the same projection as a fold of the whole log (fast-check property)",
    async run({ target, reopen, name }) {
      const fc = await loadFastCheck();
      let run = 0;
      let snapshotsTaken = 0;
      let eventsTotal = 0;
      await fc.assert(
        fc.asyncProperty(fc.array(stepArb(fc), { minLength: 10, maxLength: 80, size: "max" }), fc.array(fc.nat(1000), { minLength: 1, maxLength: 3 }), async (steps, cuts) => {
          const batches = generateBatches(steps);
          const dbName = `${name}-p${run++}`;
          const points = new Set(cuts.map((c) => c % (batches.length + 1)));
          const storage: Storage = target.storage;
          let db = await storage.open(dbName);
          const folded = new Reducer();
          let head = 0;
          for (let i = 0; i <= batches.length; i++) {
            if (points.has(i) && head > 0) {
              const text = encodeSnapshot(folded.projection());
              // What opening checks only in structure (a digest-verified snapshot) must pass the full schema.
              restoreSnapshot(text, head, { validate: "full" });
              await db.writeSnapshot(head, text);
              snapshotsTaken++;
            }
            const batch = batches[i];
            if (batch === undefined) break;
            const receipt = await db.commit(batch);
            folded.apply(batch.map((e, k) => ({ ...structuredClone(e), seq: receipt.firstSeq + k }) as LogEvent));
            head = receipt.lastSeq;
            if (reopen) {
              await db.close();
              db = await storage.open(dbName);
            }
          }
          eventsTotal += head;
          const full = reduce(await db.read(0));
          await db.close();
          // Another Storage object (another process, on replicated another machine's empty data dir).
          const other = await target.reopenStorage();
          const again = await other.open(dbName);
          const loaded = await loadProjection(again);
          assert.deepEqual(loaded.projection(), full, "latest snapshot + tail folds to the whole log's projection");
          assert.deepEqual(loaded.projection(), folded.projection(), "and to what the writer folded");
          const reader = await other.reader(dbName);
          assert.deepEqual((await loadProjection(reader)).projection(), full, "a reader loads the same projection");
          await reader.close();
          await again.close();
        }),
        { seed, numRuns: RUNS },
      );
      assert.ok(snapshotsTaken >= RUNS / 2, `the property took too few snapshots (${snapshotsTaken} in ${RUNS} runs, ${eventsTotal} events, seed ${seed}) to mean anything`);
    },
  },
  {
    id: "snapshot.damaged",
    name: "snapshots: a damaged snapshot is an error, not a different projection",
    async run({ target, reopen, name }) {
      const db = await Owner.open(target.storage, name, reopen);
      await db.commit([sessionCreated("s1")]);
      const r = new Reducer();
      r.apply(await db.read());
      await db.db.writeSnapshot(1, encodeSnapshot(r.projection()).replace('"v":1', '"v":2'));
      await assert.rejects(loadProjection(db.db), hasError("uncertain"), "a snapshot of another format version is refused with a StorageFailure");
      await db.commit([sessionCreated("s2")]);
      // Well-formed JSON with a container that is not what encodeSnapshot writes (entries as an object).
      await db.db.writeSnapshot(2, encodeSnapshot(reduce(await db.read())).replace('"executions":[]', '"executions":{}'));
      await assert.rejects(loadProjection(db.db), (err: unknown) => hasError("uncertain")(err) && /executions/.test((err as Error).message), "a snapshot whose structure is wrong is refused, naming the field");
      await db.close();
    },
  },
];
