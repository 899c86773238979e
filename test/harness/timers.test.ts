/**
 * Session timers with injected timer functions: time is run forward by hand, nothing sleeps.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import pino from "pino";
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import { event, identity } from "../../src/state/events.js";
import { Reducer } from "../../src/state/reducer.js";
import type { HarnessCore } from "../../src/harness/core.js";
import type { SessionContext } from "../../src/harness/session.js";
import { SessionTimers } from "../../src/harness/timers.js";
import type { TimerFunctions } from "../../src/harness/world.js";

const T0 = Date.parse("2026-01-01T00:00:00.000Z");

function fixture(budgets: { max_wall_seconds?: number } = {}) {
  let now = T0;
  const reducer = new Reducer();
  const commits: NewEvent[][] = [];
  const armed: { cb: () => void; ms: number; cleared: boolean }[] = [];
  const fns: TimerFunctions = {
    setTimeout: (cb, ms) => {
      const h = { cb, ms, cleared: false };
      armed.push(h);
      return h;
    },
    clearTimeout: (h) => {
      (h as { cleared: boolean }).cleared = true;
    },
  };
  const commit = async (events: readonly NewEvent[]): Promise<readonly LogEvent[]> => {
    commits.push([...events]);
    const logged = events.map((e, i) => ({ ...e, seq: reducer.headSeq + 1 + i }) as LogEvent);
    reducer.apply(logged);
    return logged;
  };
  const ended: string[] = [];
  let wakes = 0;
  let aborted = 0;
  const core = {
    world: { clock: { now: () => now } },
    logger: pino({ level: "silent" }),
    metrics: null,
    stopping: () => false,
    nowIso: () => new Date(now).toISOString(),
    commit,
  } as unknown as HarnessCore;
  const ctx: SessionContext = {
    core,
    id: "s1",
    session: () => reducer.session("s1")!,
    signal: new AbortController().signal,
    endRun: async (_result, reason) => {
      ended.push(reason);
    },
    wake: () => {
      wakes++;
    },
    carry: (events) => void commit(events),
    prepareEarly: () => undefined,
  };
  const timers = new SessionTimers(ctx, fns, () => aborted++);
  void commit([event("session_created", "s1", identity.session("s1"), new Date(T0).toISOString(), { goal: "g", cwd: "/tmp", validators: [], budgets })]);
  const register = (id: string, dueInMs: number) =>
    commit([event("timer_registered", "s1", identity.timer("s1", id), new Date(now).toISOString(), { timer_id: id, cell_id: null, due_at: new Date(now + dueInMs).toISOString(), note: null })]);
  return {
    timers,
    armed,
    commits,
    ended,
    register,
    session: () => reducer.session("s1")!,
    advance: (ms: number) => (now += ms),
    now: () => now,
    wakes: () => wakes,
    aborted: () => aborted,
  };
}

/** Lets the promise callbacks a timer callback started run to the end. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test("a registered timer is armed once for its delay and, when due, fires once with its observation", async () => {
  const f = fixture();
  await f.register("t1", 60_000);
  f.timers.arm(f.session(), f.now());
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed.length, 1, "armed once");
  assert.equal(f.armed[0]!.ms, 60_000);
  f.advance(60_250);
  f.armed[0]!.cb();
  await settle();
  const fired = f.commits.at(-1)!;
  assert.deepEqual(
    fired.map((e) => e.kind),
    ["timer_fired", "inbox_received"],
  );
  assert.equal((fired[0]!.body as { late_ms: number }).late_ms, 250);
  assert.equal(f.session().timers.get("t1")!.fired, true);
  assert.ok(f.session().pending.includes("timer:t1"));
  assert.ok(f.wakes() >= 1, "the driver is woken after a timer fires");
  const n = f.commits.length;
  f.armed[0]!.cb();
  await settle();
  assert.equal(f.commits.length, n, "a fired timer never fires again");
});

test("a callback that comes early re-arms the rest and commits nothing; a far timer is armed in setTimeout-sized chunks", async () => {
  const f = fixture();
  await f.register("far", 40 * 86_400_000);
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed[0]!.ms, 2 ** 31 - 1, "capped at setTimeout's range");
  const n = f.commits.length;
  f.advance(2 ** 31 - 1);
  f.armed[0]!.cb();
  await settle();
  assert.equal(f.commits.length, n, "not due: nothing committed");
  assert.equal(f.armed.length, 2, "re-armed");
  assert.equal(f.armed[1]!.ms, 40 * 86_400_000 - (2 ** 31 - 1));
});

test("concurrent fires of one timer (its callback and the driver's step) commit once", async () => {
  const f = fixture();
  await f.register("t1", 1000);
  f.advance(1000);
  const n = f.commits.length;
  await Promise.all([f.timers.fire("t1"), f.timers.fire("t1"), f.timers.fire("t1")]);
  assert.equal(f.commits.length, n + 1);
});

test("the wall-time budget ends the run when its timer comes, and aborts a model call in flight", async () => {
  const f = fixture({ max_wall_seconds: 10 });
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed.length, 1);
  assert.equal(f.armed[0]!.ms, 10_010, "ten ms past the deadline");
  // Early (a chunk of a longer wait): the driver is woken to re-arm, the run goes on.
  f.advance(5_000);
  f.armed[0]!.cb();
  await settle();
  assert.deepEqual(f.ended, []);
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed[1]!.ms, 5_010);
  f.advance(5_010);
  f.armed[1]!.cb();
  await settle();
  assert.deepEqual(f.ended, ["the wall-time budget of 10 s is exhausted"]);
  assert.equal(f.aborted(), 1);
});

test("stop disarms every timer and nothing is armed after it", async () => {
  const f = fixture({ max_wall_seconds: 100 });
  await f.register("t1", 5000);
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed.length, 2);
  f.timers.stop();
  assert.ok(f.armed.every((h) => h.cleared));
  await f.register("t2", 5000);
  f.timers.arm(f.session(), f.now());
  assert.equal(f.armed.length, 2);
});
