/**
 * Issue 10: provider failures pause a run, they do not end it. A real HTTP server plays the Anthropic
 * API; the harness runs on a virtual clock (its backoff sleeps advance virtual time), so two minutes
 * of 429s take milliseconds and nothing here depends on wall time.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { RunBlocked } from "../../src/harness/model-retry.js";
import { defaultWorld, type HarnessWorld } from "../../src/harness/world.js";
import { createModel } from "../../src/model/providers.js";
import { Metrics } from "../../src/observability/metrics.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { tempDir } from "../harness/support.js";
import { errorReply, revisionOf, startProvider, stepReply } from "./provider-server.js";
import { withHarness } from "../support/harness.js";

const conclusion = (revision: number) => [
  { op: "test", path: "/revision", value: revision },
  { op: "add", path: "/cells/-", value: { id: revision + 1, previous_id: null, kind: "note", role: "conclusion", result: "success", text: "done" } },
];

function virtualWorld(start: number): { world: HarnessWorld; now: () => number; sleeps: number[] } {
  let now = start;
  const sleeps: number[] = [];
  const world: HarnessWorld = {
    ...defaultWorld(),
    clock: {
      now: () => now,
      sleep: async (ms: number) => {
        sleeps.push(ms);
        now += ms;
        await new Promise((r) => setImmediate(r));
      },
    },
  };
  return { world, now: () => now, sleeps };
}

const HANG_GUARD_MS = 60_000;
function guard<T>(p: Promise<T>, what: string): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<T>((_, reject) => (t = setTimeout(() => reject(new Error(`${what}: no outcome after ${HANG_GUARD_MS} ms`)), HANG_GUARD_MS)))]).finally(() => clearTimeout(t));
}

describe("a flaky provider", () => {
  it("429 with Retry-After: 20 for two minutes, then recovery: the run finishes and no retry came early", async () => {
    const t = tempDir();
    const v = virtualWorld(Date.parse("2026-01-01T00:00:00Z"));
    const recoverAt = v.now() + 120_000;
    const seen: number[] = [];
    const server = await startProvider((req) => {
      seen.push(v.now());
      return v.now() < recoverAt ? errorReply(429, { "retry-after": "20" }) : stepReply(conclusion(revisionOf(req.body)));
    });
    const model = createModel("anthropic/claude-test", { env: { ANTHROPIC_API_KEY: "sk-test-key", ANTHROPIC_BASE_URL: server.url } });
    await withHarness({ storage: createMemoryStorage(), name: "flaky", model, workDir: t.dir, world: v.world, limits: { outputFlushMs: 20 } }, async (h) => {
      const s = await h.start({ goal: "g", cwd: t.dir });
      const out = await guard(h.wait(s), "the run");
      assert.equal(out.result, "success", out.reason);
      const failures = seen.length - 1;
      assert.ok(failures >= 6, `${failures} refused calls over two minutes of 429s at Retry-After 20 s`);
      for (let i = 1; i < seen.length; i++) assert.ok(seen[i]! - seen[i - 1]! >= 20_000, `call ${i + 1} came ${seen[i]! - seen[i - 1]!} ms after the previous one, before Retry-After`);
      // More failed calls than the admissible-patch limit (6): transport failures do not count toward it.
      assert.ok(failures > 6 || failures === 6);
      const turn = [...h.session(s)!.turns.values()][0]!;
      assert.equal(turn.rejections.length, 0);
      assert.equal(turn.model_failures, 0, "429s do not count toward the admissible-patch limit");
      assert.ok(v.sleeps.every((ms) => ms >= 20_000), `backoffs ${v.sleeps.join(", ")}`);
      const usage = h.session(s)!.state.runtime.usage;
      assert.equal(usage.attempts, seen.length, "each attempt is recorded");
    }).finally(async () => {
      await server.close();
      t.cleanup();
    });
  });

  it("a provider still failing past the retry budget parks the run as blocked; resume after recovery finishes it", async () => {
    const t = tempDir();
    const v = virtualWorld(Date.parse("2026-01-01T00:00:00Z"));
    let up = false;
    const server = await startProvider((req) => (up ? stepReply(conclusion(revisionOf(req.body))) : errorReply(503)));
    const model = createModel("anthropic/claude-test", { env: { ANTHROPIC_API_KEY: "sk-test-key", ANTHROPIC_BASE_URL: server.url } });
    const storage = createMemoryStorage();
    const metrics = new Metrics({ defaultMetrics: false });
    let s = "";
    await withHarness({ storage, name: "budget", model, workDir: t.dir, world: v.world, metrics, limits: { outputFlushMs: 20, modelRetryBudgetMs: 60_000 } }, async (h) => {
      s = await h.start({ goal: "g", cwd: t.dir });
      const err = await guard(h.wait(s).then(() => null, (e: unknown) => e), "the run");
      assert.ok(err instanceof RunBlocked, `expected RunBlocked, got ${String(err)}`);
      assert.equal(err.cause, "retry_budget");
      const i = h.inspect(s).sessions[0]!;
      assert.equal(i.status, "blocked");
      assert.match(i.blocked?.reason ?? "", /kept failing/);
      assert.match(await metrics.registry.metrics(), /cairn_runs_blocked 1/);
      // Backoff grows and is jittered (never more than the cap), and the budget bounds it.
      assert.ok(v.sleeps.length >= 3 && v.sleeps.every((ms) => ms >= 0 && ms <= 60_000), `backoffs ${v.sleeps.join(", ")}`);
    });
    up = true;
    await withHarness({ storage, name: "budget", model, workDir: t.dir, world: v.world, limits: { outputFlushMs: 20 } }, async (again) => {
      const r = await again.resume();
      assert.deepEqual(r.sessions, [s]);
      const out = await guard(again.wait(s), "the resumed run");
      assert.equal(out.result, "success", out.reason);
      assert.equal(again.inspect(s).sessions[0]!.blocked, null);
    }).finally(async () => {
      await server.close();
      t.cleanup();
    });
  });
});
