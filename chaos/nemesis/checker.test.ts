/**
 * The checker against hand-made histories: a clean one passes, and each anomaly the nemesis hunts for
 * (as a broken harness would produce it) is caught by the check named for it, with an excerpt.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { check, report, type FinalEvent, type Floor } from "./checker.js";
import type { HEvent, HRecord } from "./history.js";

const DB = "d";
const FLOOR: Floor = { ackedCommits: 1, successfulRuns: 1 };
let clock = 1_000;
const at = () => (clock += 10);

/** A small, correct history: w1 (epoch 1) creates run s1 and launches cell 1; w1 dies; w2 (epoch 2) resumes. */
function clean() {
  clock = 1_000;
  const h: HRecord[] = [];
  const log: FinalEvent[] = [];
  const effects: string[] = [];
  let seq = 0;
  const ops = new Map<string, number>();
  const commit = (worker: string, epoch: number, events: HEvent[], outcome: "ok" | "refused" | "uncertain" | "lost" = "ok") => {
    const op = (ops.get(worker) ?? 0) + 1;
    ops.set(worker, op);
    h.push({ type: "invoke", db: DB, worker, epoch, op, events, at: at() });
    if (outcome === "refused") {
      h.push({ type: "fail", db: DB, worker, epoch, op, outcome: "refused", code: "reset", reason: "fenced", message: "fenced", at: at() });
      return;
    }
    const first = seq + 1;
    // An effect event's name is its identity's third part (`effect:<session>:<name>:<attempt>`, `effect_end:<session>:<name>`).
    const name = (e: HEvent) => (e.kind.startsWith("effect_") ? { name: e.identity.split(":")[2]! } : {});
    for (const e of events) log.push({ seq: ++seq, kind: e.kind, identity: e.identity, session: e.session, body: e.cell !== undefined ? { cell_id: e.cell, exit_code: e.kind === "execution_finished" ? 0 : null, ...name(e) } : {} });
    if (outcome === "ok") h.push({ type: "ok", db: DB, worker, epoch, op, firstSeq: first, lastSeq: seq, at: at() });
    if (outcome === "uncertain") h.push({ type: "fail", db: DB, worker, epoch, op, outcome: "uncertain", code: "uncertain", reason: null, message: "lost", at: at() });
  };
  const created = (s: string): HEvent => ({ kind: "session_created", identity: `session:${s}`, session: s });
  h.push({ type: "submit", db: DB, req: "r1", at: at() });
  h.push({ type: "spawn", db: DB, worker: "w1", pid: 10, role: "scheduled", at: at() });
  h.push({ type: "open", db: DB, worker: "w1", pid: 10, epoch: 1, head: 0, at: at() });
  commit("w1", 1, [created("s1")]);
  log[0] = { ...log[0]!, body: { goal: "chaos r1 cells=2 long=0 timer=0" } };
  commit("w1", 1, [{ kind: "execution_started", identity: "started:s1:1", session: "s1", cell: 1 }]);
  effects.push(`s1 1 1 ${at()}`);
  commit("w1", 1, [{ kind: "execution_finished", identity: "finished:s1:1", session: "s1", cell: 1 }]);
  h.push({ type: "exit", db: DB, worker: "w1", pid: 10, code: null, signal: "SIGKILL", at: at() });
  h.push({ type: "spawn", db: DB, worker: "w2", pid: 11, role: "scheduled", at: at() });
  h.push({ type: "open", db: DB, worker: "w2", pid: 11, epoch: 2, head: seq, at: at() });
  commit("w2", 2, [{ kind: "execution_started", identity: "started:s1:2", session: "s1", cell: 2 }]);
  effects.push(`s1 2 2 ${at()}`);
  commit("w2", 2, [{ kind: "execution_finished", identity: "finished:s1:2", session: "s1", cell: 2 }]);
  commit("w2", 2, [{ kind: "run_ended", identity: "terminal:s1", session: "s1" }]);
  log[log.length - 1] = { ...log[log.length - 1]!, body: { result: "success" } };
  return { h, log, effects, commit, seq: () => seq };
}

const run = (h: HRecord[], log: FinalEvent[], effects: string[], floor = FLOOR) => check({ history: h, finals: new Map([[DB, log]]), effects: new Map([[DB, effects]]), floor });
const caught = (v: ReturnType<typeof run>, name: string) => {
  const a = v.anomalies.filter((x) => x.check === name);
  assert.ok(a.length > 0, `expected a ${name} anomaly, got ${JSON.stringify(v.anomalies.map((x) => x.check))}`);
  assert.ok(a[0]!.excerpt.length > 0, "with an excerpt");
  const text = report(42, v.anomalies);
  assert.match(text, /seed 42/);
  assert.match(text, new RegExp(`\\[${name}\\]`));
};

describe("nemesis checker", () => {
  it("passes a correct history", () => {
    const { h, log, effects } = clean();
    const v = run(h, log, effects);
    assert.deepEqual(v.anomalies, []);
    assert.equal(v.stats.commits.acknowledged, 6);
    assert.equal(v.stats.runs.success, 1);
  });

  it("an acknowledged commit missing from the final log (acknowledged before the commit resolved)", () => {
    const { h, log, effects } = clean();
    // the log lost seq 4.. and the rest shifted: w2's events sit lower
    const broken = log.filter((e) => e.seq !== 3).map((e, i) => ({ ...e, seq: i + 1 }));
    caught(run(h, broken, effects), "acked-missing");
  });

  it("an acknowledged commit above the head a later opener found", () => {
    const { h, log, effects } = clean();
    const i = h.findIndex((r) => r.type === "open" && r.worker === "w2");
    h[i] = { ...(h[i] as Extract<HRecord, { type: "open" }>), head: 1 };
    caught(run(h, log, effects), "acked-missing");
  });

  it("a gap in seqs, and an identity twice", () => {
    const { h, log, effects } = clean();
    caught(run(h, log.map((e) => (e.seq >= 4 ? { ...e, seq: e.seq + 1 } : e)), effects), "seq-gap");
    const dup = [...log, { ...log[1]!, seq: log.length + 1 }];
    caught(run(h, dup, effects), "identity-duplicate");
  });

  it("a cell version started twice (an UnknownExecution re-run)", () => {
    const { h, log, effects, commit } = clean();
    commit("w2", 2, [{ kind: "execution_started", identity: "started:s1:1:again", session: "s1", cell: 1 }]);
    caught(run(h, log, effects), "double-start");
  });

  it("more effect lines than starts, and a line lost for a cell that exited 0", () => {
    const { h, log, effects } = clean();
    caught(run(h, log, [...effects, effects[0]!]), "effect-excess");
    caught(run(h, log, [effects[1]!]), "effect-lost");
    caught(run(h, log, [...effects, "not a cell's line"]), "effect-malformed");
  });

  it("an effect line of the old owner written after the new owner launched its first cell (no wait for the old lease)", () => {
    const { h, log, effects } = clean();
    caught(run(h, log, [...effects.slice(0, 1), `s1 1 1 ${clock + 1000}`, effects[1]!].slice(1)), "effect-after-newer-owner");
  });

  it("a long cell of the old owner still ticking after the new owner launched (killed before its last line)", () => {
    const { h, log, effects } = clean();
    // ticks before the takeover are fine; one after it is not, even without the cell's last line
    const before = [`tick s1 1 1 1005`];
    assert.deepEqual(run(h, log, [...before, ...effects]).anomalies, []);
    const v = run(h, log, [...before, `tick s1 1 1 ${clock + 500}`, `tick s1 1 1 ${clock + 700}`, ...effects]);
    caught(v, "effect-after-newer-owner");
    assert.equal(v.anomalies.filter((a) => a.check === "effect-after-newer-owner").length, 1, "one anomaly per cell and owner");
    assert.match(v.anomalies[0]!.message, /still running \(a tick line\)/);
  });

  it("a commit of an old epoch that landed after a newer epoch was claimed (no epoch guard)", () => {
    const { h, log, effects, commit } = clean();
    // w1, fenced, still appends: its commit lands above the head w2 found
    commit("w1", 1, [{ kind: "inbox_received", identity: "inbox:s1:late", session: "s1" }], "uncertain");
    caught(run(h, log, effects), "stale-epoch-commit");
  });

  it("an event no worker sent", () => {
    const { h, log, effects } = clean();
    caught(run(h, [...log, { seq: log.length + 1, kind: "inbox_received", identity: "inbox:ghost", session: "s1", body: {} }], effects), "phantom-event");
  });

  it("a run that never ends, and a submitted run that never started", () => {
    const { h, log, effects } = clean();
    caught(run(h, log.slice(0, -1), effects), "run-not-ended");
    caught(run([...h, { type: "submit", db: DB, req: "r2", at: at() }], log, effects), "submitted-run-missing");
  });

  it("a schedule where too little succeeded fails the floor", () => {
    const { h, log, effects } = clean();
    caught(run(h, log, effects, { ackedCommits: 100, successfulRuns: 1 }), "floor");
    caught(run(h, log, effects, { ackedCommits: 1, successfulRuns: 2 }), "floor");
  });

  it("a schedule where no cell wrote an effect line fails the floor: its effect checks proved nothing", () => {
    const { h, log } = clean();
    const v = run(h, log, []);
    caught(v, "floor");
    assert.match(v.anomalies.find((a) => a.check === "floor")!.message, /only 0 effects were made/);
    // Ticks and ledger answers are not effects made.
    caught(run(h, log, [`tick s1 1 1 ${at()}`, `ledger s1 1 1 ${at()} e1 refused-1`]), "floor");
  });

  it("a schedule where the ledger never answered proceed fails the floor that asks for one: its ledger checks proved nothing", () => {
    const { h, log, effects } = clean();
    const refused = [...effects, `ledger s1 2 2 ${at()} e2 refused-1`];
    assert.deepEqual(run(h, log, refused).anomalies, [], "no floor on proceeds unless asked");
    const v = run(h, log, refused, { ...FLOOR, proceeds: 1 });
    caught(v, "floor");
    assert.match(v.anomalies.find((a) => a.check === "floor")!.message, /answered proceed 0 times/);
  });

  it("a final log that was not read", () => {
    const { h, effects } = clean();
    const v = check({ history: h, finals: new Map(), effects: new Map([[DB, effects]]), floor: FLOOR });
    assert.ok(v.anomalies.some((a) => a.check === "final-log-missing"));
  });

  it("refused and uncertain commits are not anomalies by themselves", () => {
    const { h, log, effects, commit } = clean();
    commit("w1", 1, [{ kind: "inbox_received", identity: "inbox:s1:refused", session: "s1" }], "refused");
    const op = 99;
    h.push({ type: "invoke", db: DB, worker: "w1", epoch: 1, op, events: [{ kind: "inbox_received", identity: "inbox:s1:never", session: "s1" }], at: at() });
    const v = run(h, log, effects);
    assert.deepEqual(v.anomalies, []);
    assert.equal(v.stats.commits.refused, 1);
    assert.equal(v.stats.commits.uncertain, 1);
  });

  describe("the effect ledger", () => {
    /** clean(), where w2's cell 2 asks the ledger for e2, is answered proceed, makes it and ends it. */
    function ledger() {
      const c = clean();
      c.commit("w2", 2, [{ kind: "effect_begun", identity: "effect:s1:e2:1", session: "s1", cell: 2 }]);
      c.commit("w2", 2, [{ kind: "effect_ended", identity: "effect_end:s1:e2", session: "s1", cell: 2 }]);
      const t = Number(c.effects[1]!.split(" ")[3]);
      const effects = [c.effects[0]!, `ledger s1 2 2 ${t} e2 proceed`, `s1 2 2 ${t} e2`];
      return { ...c, effects, t };
    }

    it("passes a run whose cells asked the ledger, and one told done that made nothing", () => {
      const { h, log, effects, t } = ledger();
      assert.deepEqual(run(h, log, effects).anomalies, []);
      assert.deepEqual(run(h, log, effects).stats.ledger, { proceed: 1 });
      // A cell told done exits 0 without an effect line: not a lost effect.
      assert.deepEqual(run(h, log, [effects[0]!, `ledger s1 2 2 ${t} e2 done`]).anomalies, []);
    });

    it("an effect made twice by two cells (one line each, so no cell wrote too many)", () => {
      const { h, log, effects, t } = ledger();
      const v = run(h, log, [`s1 1 1 ${t - 50} e2`, ...effects.slice(1)]);
      caught(v, "effect-twice");
      assert.equal(v.anomalies.filter((a) => a.check === "effect-excess").length, 0, "each cell wrote one line: only the ledger check sees it");
    });

    it("proceed answered after done was", () => {
      const { h, log, effects, t } = ledger();
      caught(run(h, log, [effects[0]!, `ledger s1 2 2 ${t} e2 done`, ...effects.slice(1)]), "proceed-after-done");
    });

    it("done answered for an effect the run never ended (another run's, or nobody's)", () => {
      const { h, log, effects, t } = ledger();
      caught(run(h, log, [...effects, `ledger s1 2 2 ${t} e9 done`]), "done-without-end");
      caught(run(h, log, [...effects, `ledger s2 2 2 ${t} e2 done`]), "done-without-end");
    });

    it("proceed answered to a cell whose begin is not in the log (answered before it was durable)", () => {
      const { h, log, effects, t } = ledger();
      caught(run(h, log, [...effects, `ledger s1 2 2 ${t} e7 proceed`]), "proceed-not-durable");
      caught(run(h, log, [`ledger s1 1 1 ${t - 60} e2 proceed`, ...effects]), "proceed-not-durable");
    });

    it("a ledger line of the old owner's cell after the new owner launched", () => {
      const { h, log, effects } = ledger();
      caught(run(h, log, [...effects, `ledger s1 1 1 ${clock + 1000} e2 uncertain`]), "effect-after-newer-owner");
    });
  });
});
