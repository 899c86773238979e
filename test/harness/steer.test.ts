/**
 * An operator steers a run the harness owns: pause (and pause --now), unpause, cancel, approval gates
 * (approve, deny), in one process and across a reopen of the database (a restart or a failover of
 * the owner). Real cells (sh) under a scripted or functional model; the model's calls are counted,
 * so "asks the model nothing" is checked, not assumed.
 */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Harness } from "../../src/harness/harness.js";
import type { Model, ModelRequest } from "../../src/model/contract.js";
import { STEER_KIND } from "../../src/harness/steer.js";
import type { Storage } from "../../src/storage/contract.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { createSqliteStorage } from "../../storage-adapters/sqlite/index.js";
import { adds, cmd, conclude, note, tempDir } from "./support.js";
import { until } from "../support/wait.js";
import { Metrics } from "../../src/observability/metrics.js";
import { parseExposition, valueOf } from "../observability/exposition.js";

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

/** A cell that marks it started, then waits for `release` (or 60 s), then marks it ended. */
function gated(dir: string, name: string): string[] {
  const p = (f: string) => join(dir, `${name}.${f}`);
  return ["sh", "-c", `touch ${p("started")}; i=0; while [ ! -e ${p("release")} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; touch ${p("ended")}`];
}

/**
 * Once cell `cell` has finished, concludes with what the model saw of it (success, or failure after
 * an UnknownExecution, which a success may not leave unresolved), so the run's reason says it;
 * before that, a note (the run waits for the cell).
 */
const concludeSeeing = (req: ModelRequest, cell: number) => {
  const ex = req.state.runtime.cells[String(cell)];
  const at = req.state.revision;
  if (ex?.phase !== "finished") return adds(at, req.state.runtime.next_cell_id, [note(`waiting for cell ${cell}`)]);
  return adds(at, req.state.runtime.next_cell_id, [conclude(ex.result === "UnknownExecution" ? "failure" : "success", `cell ${cell}: ${ex.result}`)]);
};

describe("pause and unpause", () => {
  it("a pause lets the running cell finish, asks the model nothing until unpaused, then the run goes on", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => (req.state.revision === 0 ? adds(0, 1, [cmd(...gated(t.dir, "a"))]) : concludeSeeing(req, 1)));
      const h = await Harness.open({ storage: createMemoryStorage(), name: "p", model, workDir: t.dir, limits: fast });
      try {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await until("cell 1 to start", () => existsSync(join(t.dir, "a.started")));
        const v = await h.steer(s, "p1", { action: "pause", reason: "looking", now: false });
        assert.equal(v.kind, "apply");
        assert.deepEqual({ ...h.session(s)!.paused!, at: "" }, { reason: "looking", at: "", now: false, request: "p1" });
        writeFileSync(join(t.dir, "a.release"), "");
        await until("cell 1 to finish", () => h.session(s)!.executions.get(1)!.phase === "finished");
        await h.settled();
        assert.equal(h.session(s)!.executions.get(1)!.result, "success", "the running cell finished as it would have");
        assert.equal(model.calls.length, 1, "no model call while paused, though the cell's result is unread");
        assert.equal(h.session(s)!.pending.length, 1, "its observation waits");
        assert.equal(h.inspect(s).sessions[0]!.status, "paused");
        // A second pause is recorded and changes nothing; an unpause continues the run.
        assert.equal((await h.steer(s, "p2", { action: "pause", reason: "", now: false })).kind, "apply");
        assert.equal((await h.steer(s, "p1", { action: "pause", reason: "looking", now: false })).kind, "noop", "the same request again is a duplicate");
        await h.steer(s, "u1", { action: "unpause", reason: "" });
        const out = await h.wait(s);
        assert.equal(out.result, "success");
        assert.equal(out.reason, "the model concluded success: cell 1: success");
        assert.equal(model.calls.length, 2);
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("pause --now stops the running cell as a cancel does (UnknownExecution, stopped_by_pause); the model learns it after the unpause", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => (req.state.revision === 0 ? adds(0, 1, [cmd(...gated(t.dir, "a"))]) : concludeSeeing(req, 1)));
      const h = await Harness.open({ storage: createMemoryStorage(), name: "p", model, workDir: t.dir, limits: fast });
      try {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await until("cell 1 to start", () => existsSync(join(t.dir, "a.started")));
        await h.steer(s, "p1", { action: "pause", reason: "stop it", now: true });
        await until("cell 1 to be recorded", () => h.session(s)!.executions.get(1)!.phase === "finished");
        const ex = h.session(s)!.executions.get(1)!;
        assert.equal(ex.result, "UnknownExecution");
        assert.equal(ex.unknown?.reason, "stopped_by_pause");
        assert.equal(ex.unknown?.worker_stopped, true);
        await h.settled();
        assert.equal(model.calls.length, 1);
        assert.equal(existsSync(join(t.dir, "a.ended")), false, "its process group was stopped");
        await h.steer(s, "u1", { action: "unpause", reason: "" });
        const out = await h.wait(s);
        assert.equal(out.reason, "the model concluded failure: cell 1: UnknownExecution");
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("a pause survives a restart of the owner, and one that waited in the mailbox applies before the new owner does anything", async () => {
    const t = tempDir();
    try {
      const storage = (): Storage => createSqliteStorage({ dataDir: join(t.dir, "data") });
      const script = (req: ModelRequest) => (req.state.revision === 0 ? adds(0, 1, [note("first")]) : adds(req.state.revision, req.state.runtime.next_cell_id, [conclude("success", "done")]));
      // Owner 1 starts a run and is paused before its first round ends.
      const m1 = modelOf(script);
      const st1 = storage();
      const h1 = await Harness.open({ storage: st1, name: "p", model: m1, workDir: t.dir, limits: fast });
      const s = await h1.start({ goal: "g", cwd: t.dir });
      await h1.steer(s, "p1", { action: "pause", reason: "", now: false });
      await h1.settled();
      await h1.close();
      await st1.close();
      // Owner 2: still paused. Asks the model nothing.
      const m2 = modelOf(script);
      const st2 = storage();
      const h2 = await Harness.open({ storage: st2, name: "p", model: m2, workDir: t.dir, limits: fast });
      await h2.resume();
      await h2.settled();
      assert.equal(h2.session(s)!.paused?.request, "p1");
      assert.equal(m2.calls.length, 0, "a paused run asks nothing after a restart");
      await h2.steer(s, "u1", { action: "unpause", reason: "" });
      await until("the first round", () => h2.session(s)!.turn_count >= 1);
      await h2.steer(s, "p2", { action: "pause", reason: "", now: false });
      await h2.settled();
      const calls = m2.calls.length;
      await h2.close();
      await st2.close();
      // No owner: an unpause and a pause wait in the mailbox, in that order; owner 3 applies both first.
      const poster = storage();
      await poster.post("p", { id: "u2", session: s, kind: STEER_KIND, payload: { action: "unpause" }, at: new Date().toISOString() });
      await poster.post("p", { id: "p3", session: s, kind: STEER_KIND, payload: { action: "pause", reason: "again" }, at: new Date().toISOString() });
      await poster.close();
      const m3 = modelOf(script);
      const st3 = storage();
      const h3 = await Harness.open({ storage: st3, name: "p", model: m3, workDir: t.dir, limits: fast });
      try {
        await h3.resume();
        await h3.settled();
        assert.equal(h3.session(s)!.paused?.request, "p3", "the mailbox was applied in order before the run moved");
        assert.equal(m3.calls.length, 0, "nothing asked between the unpause and the pause that followed it");
        await h3.steer(s, "u3", { action: "unpause", reason: "" });
        const out = await h3.wait(s);
        assert.equal(out.result, "success");
        assert.ok(calls >= 1);
      } finally {
        await h3.close();
        await st3.close();
      }
    } finally {
      t.cleanup();
    }
  });
});

describe("cancel", () => {
  it("stops the running cell and records it cancelled, cancels queued cells, ends the run as cancelled; a second cancel changes nothing", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => (req.state.revision === 0 ? adds(0, 1, [cmd(...gated(t.dir, "a")), cmd("touch", join(t.dir, "never"))]) : concludeSeeing(req, 1)));
      const h = await Harness.open({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast });
      try {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await until("cell 1 to start", () => existsSync(join(t.dir, "a.started")));
        assert.equal((await h.steer(s, "c1", { action: "cancel", reason: "wrong goal" })).kind, "apply");
        const out = await h.wait(s);
        assert.deepEqual(out, { session: s, result: "cancelled", reason: "cancelled by an operator: wrong goal" });
        const sp = h.session(s)!;
        assert.equal(sp.executions.get(1)!.result, "cancelled");
        assert.match(sp.executions.get(1)!.detail ?? "", /operator's cancel/);
        assert.equal(sp.executions.get(2)!.result, "cancelled");
        assert.equal(sp.executions.get(2)!.started, null, "the queued cell never started");
        assert.equal(existsSync(join(t.dir, "never")), false);
        assert.equal(existsSync(join(t.dir, "a.ended")), false, "the running cell's group was stopped");
        assert.equal(model.calls.length, 1);
        assert.equal((await h.steer(s, "c2", { action: "cancel", reason: "" })).kind, "noop");
        assert.equal((await h.steer(s, "p9", { action: "pause", reason: "", now: false })).kind, "refused");
        assert.equal(h.inspect(s).sessions[0]!.status, "cancelled");
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("no validator starts after a cancel: the one running finishes, the next never runs, and the run ends cancelled", async () => {
    const t = tempDir();
    try {
      const v1 = join(t.dir, "v1");
      const v2 = join(t.dir, "v2");
      const model = modelOf(() => adds(0, 1, [conclude("success", "done")]));
      const h = await Harness.open({ storage: createMemoryStorage(), name: "c", model, workDir: t.dir, limits: fast });
      try {
        const s = await h.start({ goal: "g", cwd: t.dir, validators: [["sh", "-c", `touch ${v1}; sleep 1`], ["touch", v2]] });
        await until("the first validator to run", () => existsSync(v1));
        await h.steer(s, "c1", { action: "cancel", reason: "" });
        const out = await h.wait(s);
        assert.equal(out.result, "cancelled");
        await h.settled();
        assert.equal(existsSync(v2), false, "the second validator never ran");
        assert.equal(h.session(s)!.validators_run.get(1)?.length ?? 0, 0, "no validator result was recorded after the cancel");
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("a cancel that waited in the mailbox applies before the next owner does anything: a cell left started is recorded cancelled, nothing runs", async () => {
    const t = tempDir();
    try {
      const storage = (): Storage => createSqliteStorage({ dataDir: join(t.dir, "data") });
      const m1 = modelOf(() => adds(0, 1, [cmd(...gated(t.dir, "a")), cmd("touch", join(t.dir, "never"))]));
      const st1 = storage();
      const h1 = await Harness.open({ storage: st1, name: "c", model: m1, workDir: t.dir, limits: fast });
      const s = await h1.start({ goal: "g", cwd: t.dir });
      await until("cell 1 to start", () => existsSync(join(t.dir, "a.started")));
      // The owner goes away with cell 1 started (a close leaves it `started`, as a crash would).
      await h1.close();
      await st1.close();
      const poster = storage();
      await poster.post("c", { id: "c1", session: s, kind: STEER_KIND, payload: { action: "cancel", reason: "while nobody owned it" }, at: new Date().toISOString() });
      await poster.close();
      const m2 = modelOf(() => adds(1, 3, [conclude("failure", "should not be asked")]));
      const st2 = storage();
      const h2 = await Harness.open({ storage: st2, name: "c", model: m2, workDir: t.dir, limits: fast });
      try {
        await h2.resume();
        const out = await h2.wait(s);
        assert.equal(out.result, "cancelled");
        assert.equal(out.reason, "cancelled by an operator: while nobody owned it");
        const sp = h2.session(s)!;
        assert.equal(sp.executions.get(1)!.result, "cancelled", "recovery records the started cell as cancelled");
        assert.equal(sp.executions.get(2)!.result, "cancelled");
        assert.equal(m2.calls.length, 0);
        assert.equal(existsSync(join(t.dir, "never")), false);
      } finally {
        await h2.close();
        await st2.close();
      }
    } finally {
      t.cleanup();
    }
  });
});

describe("approval gates", () => {
  it("a matching cell waits for approval (visible in status), runs once approved; a cell no rule matches runs at once", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) =>
        req.state.revision === 0 ? adds(0, 1, [cmd("touch", join(t.dir, "free")), cmd("touch", join(t.dir, "gated"))]) : concludeSeeing(req, 2),
      );
      const metrics = new Metrics();
      const gauge = async (name: string, labels: Record<string, string> = {}) => {
        h.refreshMetrics();
        return valueOf(parseExposition(await metrics.registry.metrics()), name, labels);
      };
      const h = await Harness.open({ storage: createMemoryStorage(), name: "a", model, workDir: t.dir, limits: fast, metrics });
      try {
        assert.equal(await gauge("cairn_approvals_waiting"), 0);
        const s = await h.start({ goal: "g", cwd: t.dir, approval: [{ kind: "glob", pattern: `touch *gated` }] });
        await until("cell 2 to wait for approval", () => h.session(s)!.executions.get(2)?.approval?.state === "waiting");
        await h.settled();
        assert.equal(await gauge("cairn_approvals_waiting"), 1, "the waiting cell is a metric");
        assert.ok((await gauge("cairn_approval_oldest_wait_seconds"))! >= 0);
        assert.equal(existsSync(join(t.dir, "free")), true, "cell 1 matched no rule and ran");
        assert.equal(existsSync(join(t.dir, "gated")), false, "cell 2 waits");
        const st = h.inspect(s).sessions[0]!;
        assert.equal(st.status, "awaiting_approval");
        assert.deepEqual(
          st.awaiting_approval.map((a) => [a.cell_id, a.rule]),
          [[2, `glob:touch *gated`]],
        );
        assert.equal((await h.steer(s, "x", { action: "approve", cell_id: 1, reason: "" })).kind, "refused", "cell 1 never waited");
        assert.equal((await h.steer(s, "ok", { action: "approve", cell_id: 2, reason: "looks fine" })).kind, "apply");
        const out = await h.wait(s);
        assert.equal(out.reason, "the model concluded success: cell 2: success");
        assert.equal(existsSync(join(t.dir, "gated")), true);
        assert.equal(h.session(s)!.executions.get(2)!.approval?.state, "approved");
        assert.equal(await gauge("cairn_approvals_waiting"), 0);
        assert.equal(await gauge("cairn_approval_oldest_wait_seconds"), 0);
        assert.equal(await gauge("cairn_operator_requests_total", { action: "approve" }), 1, "the refused approval of cell 1 is not counted");
        assert.equal((await h.steer(s, "no", { action: "deny", cell_id: 2, reason: "late" })).kind, "refused");
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("a denial never runs the cell and reaches the model as an observation it acts on; the queue waits until the model saw it", async () => {
    const t = tempDir();
    try {
      const model = modelOf((req) => {
        if (req.state.revision === 0) return adds(0, 1, [cmd("touch", join(t.dir, "risky")), cmd("touch", join(t.dir, "after"))]);
        const denied = req.state.runtime.inbox.find((o) => o.id === "execution:1");
        const payload = denied?.payload as { reason?: string } | undefined;
        return adds(req.state.revision, req.state.runtime.next_cell_id, [conclude("failure", `${denied?.kind}: ${payload?.reason}; cell 2 ${req.state.runtime.cells["2"]?.phase}`)]);
      });
      const h = await Harness.open({ storage: createMemoryStorage(), name: "a", model, workDir: t.dir, limits: fast, approval: [{ kind: "argv", prefix: ["touch"] }] });
      try {
        const s = await h.start({ goal: "g", cwd: t.dir });
        await until("cell 1 to wait for approval", () => h.session(s)!.executions.get(1)?.approval?.state === "waiting");
        await h.steer(s, "d1", { action: "deny", cell_id: 1, reason: "not on prod" });
        const out = await h.wait(s);
        assert.equal(out.reason, "the model concluded failure: execution_denied: not on prod; cell 2 queued", "the model saw the denial before cell 2 was asked about");
        assert.equal(existsSync(join(t.dir, "risky")), false);
        assert.equal(h.session(s)!.executions.get(1)!.result, "cancelled");
        assert.equal(h.session(s)!.executions.get(1)!.started, null);
      } finally {
        await h.close();
      }
    } finally {
      t.cleanup();
    }
  });

  it("nothing runs before approval across a restart, even on a worker without the rule; an approval posted to the mailbox releases it", async () => {
    const t = tempDir();
    try {
      const storage = (): Storage => createSqliteStorage({ dataDir: join(t.dir, "data") });
      const script = (req: ModelRequest) => (req.state.revision === 0 ? adds(0, 1, [cmd("touch", join(t.dir, "x"))]) : concludeSeeing(req, 1));
      const st1 = storage();
      const h1 = await Harness.open({ storage: st1, name: "a", model: modelOf(script), workDir: t.dir, limits: fast, approval: [{ kind: "all" }] });
      const s = await h1.start({ goal: "g", cwd: t.dir });
      await until("cell 1 to wait", () => h1.session(s)!.executions.get(1)?.approval?.state === "waiting");
      await h1.close();
      await st1.close();
      // The next owner has no approval rule of its own: the request in the log still holds the cell.
      const st2 = storage();
      const h2 = await Harness.open({ storage: st2, name: "a", model: modelOf(script), workDir: t.dir, limits: fast });
      try {
        await h2.resume();
        await h2.settled();
        assert.equal(h2.session(s)!.executions.get(1)!.phase, "queued");
        assert.equal(existsSync(join(t.dir, "x")), false);
        const poster = storage();
        await poster.post("a", { id: "ok", session: s, kind: STEER_KIND, payload: { action: "approve", cell_id: 1 }, at: new Date().toISOString() });
        await poster.close();
        const out = await h2.wait(s);
        assert.equal(out.reason, "the model concluded success: cell 1: success");
        assert.equal(existsSync(join(t.dir, "x")), true);
      } finally {
        await h2.close();
        await st2.close();
      }
    } finally {
      t.cleanup();
    }
  });
});

describe("an operator's request when the owner lease cannot be read", () => {
  it("is followed in the log (an owner may be working on it), not reported as waiting for an owner", async () => {
    const { ownerLive } = await import("../../src/harness/operator.js");
    const base = createMemoryStorage();
    const unreadable: Storage = Object.assign(Object.create(base) as Storage, {
      leases: {
        ttlMs: 10_000,
        read: () => Promise.reject(new Error("the lease store is unreachable")),
        acquire: () => Promise.reject(new Error("unused")),
        enqueue: () => Promise.reject(new Error("unused")),
      },
    });
    assert.equal(await ownerLive(unreadable, "db"), true, "unknown is a maybe");
    const free: Storage = Object.assign(Object.create(base) as Storage, { leases: { ...unreadable.leases!, read: () => Promise.resolve(null) } });
    assert.equal(await ownerLive(free, "db"), false, "no lease: no live owner");
    const dead: Storage = Object.assign(Object.create(base) as Storage, { leases: { ...unreadable.leases!, read: () => Promise.resolve({ owner: { host: "h", pid: 1, since: "", epoch: 1, role: "serve" }, live: false }) } });
    assert.equal(await ownerLive(dead, "db"), false, "an expired lease: no live owner");
    await base.close();
  });
});
