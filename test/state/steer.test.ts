/**
 * The pure parts of steering a run: approval rules (parsing, the glob, which cell a rule asks about),
 * the verdict of each operator request against a projection, and the fold of what it commits (with
 * snapshots carrying every new field, and older snapshots restoring with them empty).
 *
 * Re-run a property failure with FC_SEED=<seed> node --import tsx --test test/state/steer.test.ts
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { describeRule, gateOf, globMatch, parseRule, ruleMatches, type ApprovalRule } from "../../src/state/approval.js";
import { identity, type LogEvent, type NewEvent } from "../../src/state/events.js";
import { Reducer } from "../../src/state/reducer.js";
import { encodeSnapshot, restoreSnapshot } from "../../src/state/snapshot.js";
import { cancelledQueued, cancelledReason, steerEvents, type SteerRequest } from "../../src/state/steer.js";
import type { ExecutableCell } from "../../src/state/schema.js";
import { LogBuilder } from "./helpers.js";

const seed = process.env.FC_SEED === undefined ? undefined : Number(process.env.FC_SEED);
const runs = { numRuns: 500, ...(seed === undefined ? {} : { seed }) };
const AT = "2026-01-01T00:00:00.000Z";

describe("approval rules", () => {
  test("globMatch agrees with the equivalent regular expression (* any run, ? one character, \\ quotes)", () => {
    const patternArb = fc.array(fc.constantFrom("a", "b", "*", "?", "\\*", " "), { maxLength: 8 }).map((parts) => parts.join(""));
    const textArb = fc.array(fc.constantFrom("a", "b", "*", " "), { maxLength: 10 }).map((p) => p.join(""));
    fc.assert(
      fc.property(patternArb, textArb, (pattern, text) => {
        let re = "";
        for (let i = 0; i < pattern.length; i++) {
          const c = pattern[i]!;
          if (c === "\\" && i + 1 < pattern.length) re += `\\${pattern[++i]!}`;
          else if (c === "*") re += "[\\s\\S]*";
          else if (c === "?") re += "[\\s\\S]";
          else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
        }
        assert.equal(globMatch(pattern, text), new RegExp(`^${re}$`).test(text), `${JSON.stringify(pattern)} on ${JSON.stringify(text)}`);
      }),
      runs,
    );
  });

  test("a rule's words parse back to the same rule; bad words are refused with a sentence", () => {
    for (const words of ["all", "script", "argv:git push", "glob:rm -rf *"]) {
      const r = parseRule(words);
      assert.notEqual(typeof r, "string", words);
      assert.equal(describeRule(r as ApprovalRule), words);
    }
    assert.deepEqual(parseRule("argv:  git   push "), { kind: "argv", prefix: ["git", "push"] });
    for (const bad of ["", "everything", "argv:", "glob:", "glob:  "]) assert.equal(typeof parseRule(bad), "string", bad);
  });

  test("which cells a rule asks about", () => {
    const push: ExecutableCell = { id: 1, previous_id: null, kind: "cmd", argv: ["git", "push", "origin"] };
    const py: ExecutableCell = { id: 2, previous_id: null, kind: "script", source: "print(1)" };
    assert.equal(ruleMatches({ kind: "argv", prefix: ["git", "push"] }, push), true);
    assert.equal(ruleMatches({ kind: "argv", prefix: ["git", "pull"] }, push), false);
    assert.equal(ruleMatches({ kind: "argv", prefix: ["git", "push", "origin", "main"] }, push), false, "a prefix longer than the argv");
    assert.equal(ruleMatches({ kind: "glob", pattern: "git push *" }, push), true);
    assert.equal(ruleMatches({ kind: "glob", pattern: "git push" }, push), false, "the glob is on the whole command line");
    assert.equal(ruleMatches({ kind: "script" }, py), true);
    assert.equal(ruleMatches({ kind: "script" }, push), false);
    assert.equal(ruleMatches({ kind: "glob", pattern: "*" }, py), false, "a glob is on a cmd cell's command line");
    assert.deepEqual(gateOf(push, [{ kind: "script" }], [{ kind: "all" }]), { kind: "all" }, "the worker's rules apply too");
    assert.equal(gateOf(push, undefined, []), null);
  });
});

/** A log of one run with two queued cells (1 and 2), folded as the reducer does. */
function runWithQueue(): { log: LogBuilder; r: Reducer } {
  const log = new LogBuilder("s1", AT);
  log.add("session_created", identity.session("s1"), { goal: "g", cwd: "/w", validators: [], budgets: {}, approval: [{ kind: "all" }] });
  log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: [] });
  const patch = [
    { op: "test", path: "/revision", value: 0 },
    { op: "add", path: "/cells/-", value: { id: 1, previous_id: null, kind: "cmd", argv: ["echo", "1"] } },
    { op: "add", path: "/cells/-", value: { id: 2, previous_id: null, kind: "cmd", argv: ["echo", "2"] } },
  ];
  log.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch, revision: 1, new_cell_ids: [1, 2], removed_ids: [], consumed: [] });
  log.add("execution_queued", identity.queued("s1", 1), { cell_id: 1, kind: "cmd" });
  log.add("execution_queued", identity.queued("s1", 2), { cell_id: 2, kind: "cmd" });
  const r = new Reducer();
  r.apply(log.events);
  return { log, r };
}

/** Commits `events` to `log` and `r` as the storage would (consecutive seqs). */
function commit(log: LogBuilder, r: Reducer, events: readonly NewEvent[]): void {
  const before = log.events.length;
  for (const e of events) log.add(e.kind, e.identity, e.body as never, e.session);
  r.apply(log.events.slice(before));
}

const decide = (r: Reducer, request: string, q: SteerRequest) => steerEvents(r.session("s1")!, request, q, AT);

describe("operator requests", () => {
  test("pause, pause again, unpause: one event per request; the run's pause state follows", () => {
    const { log, r } = runWithQueue();
    const p1 = decide(r, "p1", { action: "pause", reason: "why", now: true });
    assert.equal(p1.kind, "apply");
    if (p1.kind !== "apply") return;
    assert.deepEqual(p1.events.map((e) => e.identity), ["steer:s1:p1"]);
    commit(log, r, p1.events);
    assert.deepEqual(r.session("s1")!.paused, { reason: "why", at: AT, now: true, request: "p1" });
    const again = decide(r, "p2", { action: "pause", reason: "", now: false });
    assert.equal(again.kind === "apply" && again.message, "run s1 was already paused");
    const u = decide(r, "u1", { action: "unpause", reason: "" });
    assert.equal(u.kind, "apply");
    if (u.kind === "apply") commit(log, r, u.events);
    assert.equal(r.session("s1")!.paused, null);
    const u2 = decide(r, "u2", { action: "unpause", reason: "" });
    assert.equal(u2.kind === "apply" && u2.message, "run s1 was not paused", "recorded anyway: a redelivered request stays a duplicate");
  });

  test("approve and deny only a cell that waits; a decision stands; a denial finishes the cell, never run, and tells the model", () => {
    const { log, r } = runWithQueue();
    assert.deepEqual(decide(r, "a", { action: "approve", cell_id: 1, reason: "" }), { kind: "refused", code: "invalid", message: "cell 1 of run s1 does not wait for approval (it is queued)" });
    assert.equal(decide(r, "a", { action: "approve", cell_id: 9, reason: "" }).kind, "refused");
    commit(log, r, [{ identity: identity.approvalRequested("s1", 1), kind: "approval_requested", session: "s1", at: AT, body: { cell_id: 1, rule: "all" } } as NewEvent]);
    assert.equal(r.session("s1")!.executions.get(1)!.approval?.state, "waiting");
    const ok = decide(r, "a1", { action: "approve", cell_id: 1, reason: "fine" });
    assert.equal(ok.kind, "apply");
    if (ok.kind === "apply") commit(log, r, ok.events);
    assert.equal(r.session("s1")!.executions.get(1)!.approval?.state, "approved");
    assert.equal(decide(r, "a2", { action: "approve", cell_id: 1, reason: "" }).kind, "noop");
    assert.equal(decide(r, "d1", { action: "deny", cell_id: 1, reason: "no" }).kind, "refused");

    commit(log, r, [{ identity: identity.approvalRequested("s1", 2), kind: "approval_requested", session: "s1", at: AT, body: { cell_id: 2, rule: "all" } } as NewEvent]);
    const no = decide(r, "d2", { action: "deny", cell_id: 2, reason: "not today" });
    assert.equal(no.kind, "apply");
    if (no.kind !== "apply") return;
    assert.deepEqual(no.events.map((e) => e.kind), ["approval_decided", "execution_finished", "inbox_received"]);
    commit(log, r, no.events);
    const ex = r.session("s1")!.executions.get(2)!;
    assert.deepEqual([ex.phase, ex.result, ex.started, ex.approval?.state, ex.approval?.reason], ["finished", "cancelled", null, "denied", "not today"]);
    const obs = r.session("s1")!.observations.get("execution:2")!;
    assert.equal(obs.kind, "execution_denied");
    assert.equal((obs.payload as { reason: string }).reason, "not today");
  });

  test("cancel: once per run; it refuses pause and approval after it; the run's end cancels what is queued", () => {
    const { log, r } = runWithQueue();
    const c = decide(r, "c1", { action: "cancel", reason: "stop" });
    assert.equal(c.kind, "apply");
    if (c.kind === "apply") commit(log, r, c.events);
    assert.equal(decide(r, "c2", { action: "cancel", reason: "" }).kind, "noop");
    assert.equal(decide(r, "p", { action: "pause", reason: "", now: false }).kind, "refused");
    const s = r.session("s1")!;
    const ending = cancelledQueued(s, AT);
    assert.deepEqual(ending.map((e) => [e.kind, e.kind === "execution_finished" ? e.body.result : null]), [["execution_finished", "cancelled"], ["execution_finished", "cancelled"]]);
    commit(log, r, [...ending, { identity: identity.terminal("s1"), kind: "run_ended", session: "s1", at: AT, body: { result: "cancelled", reason: cancelledReason(s) } } as NewEvent]);
    assert.deepEqual(r.session("s1")!.terminal, { result: "cancelled", reason: "cancelled by an operator: stop", at: AT });
    assert.equal(decide(r, "c3", { action: "cancel", reason: "" }).kind, "noop", "cancelling a cancelled run is a no-op");
    assert.deepEqual(decide(r, "u", { action: "unpause", reason: "" }), { kind: "refused", code: "ended", message: "run s1 has ended (cancelled); it cannot be unpaused" });
  });

  test("a snapshot at any point of a steered run restores to the same projection, and one written before these fields restores with them empty", () => {
    const { log, r } = runWithQueue();
    const steps: SteerRequest[] = [
      { action: "pause", reason: "a", now: false },
      { action: "unpause", reason: "" },
      { action: "approve", cell_id: 1, reason: "ok" },
      { action: "deny", cell_id: 2, reason: "no" },
      { action: "cancel", reason: "done" },
    ];
    commit(log, r, [{ identity: identity.approvalRequested("s1", 1), kind: "approval_requested", session: "s1", at: AT, body: { cell_id: 1, rule: "all" } } as NewEvent]);
    commit(log, r, [{ identity: identity.approvalRequested("s1", 2), kind: "approval_requested", session: "s1", at: AT, body: { cell_id: 2, rule: "all" } } as NewEvent]);
    steps.forEach((q, i) => {
      const v = decide(r, `q${i}`, q);
      assert.equal(v.kind, "apply", `${q.action}: ${v.message}`);
      if (v.kind === "apply") commit(log, r, v.events);
    });
    const whole = r.projection();
    for (let cut = 1; cut <= log.events.length; cut++) {
      const first = new Reducer();
      first.apply(log.events.slice(0, cut));
      for (const validate of ["full", "structure"] as const) {
        const restored = restoreSnapshot(encodeSnapshot(first.projection()), cut, { validate });
        restored.apply(log.events.slice(cut) as LogEvent[]);
        assert.deepEqual(restored.projection(), whole, `snapshot at ${cut} (${validate})`);
      }
    }
    // A snapshot from before pause, cancel, fork and approval gates: none of their fields.
    const old = JSON.parse(encodeSnapshot(runWithQueue().r.projection())) as { sessions: Record<string, unknown>[] };
    for (const s of old.sessions) {
      for (const f of ["forming", "paused", "cancel_requested", "approval"]) delete s[f];
      for (const [, ex] of s["executions"] as [number, Record<string, unknown>][]) delete ex["approval"];
    }
    for (const validate of ["full", "structure"] as const) {
      const back = restoreSnapshot(JSON.stringify(old), 5, { validate }).session("s1")!;
      assert.deepEqual([back.forming, back.paused, back.cancel_requested, back.executions.get(1)!.approval], [null, null, null, null], validate);
    }
  });
});
