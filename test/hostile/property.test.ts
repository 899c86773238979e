/**
 * Random and adversarial patches and argv (fast-check, seeded; the seed is printed) through
 * admission, the executor and whole runs. Whatever comes in is admitted and runs, or is refused with a
 * bounded reason; admission never throws; a launch always settles; every run ends terminal or waits on
 * the model, never in a state `resume` cannot move.
 * Re-run a failure with FC_SEED=<seed> node --import tsx --test test/hostile/property.test.ts
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { createExecutor } from "../../src/exec/executor.js";
import { admit, MAX_REASON_CHARS } from "../../src/state/admission.js";
import { createMemoryStorage } from "../../storage-adapters/memory/index.js";
import { collector, tempDir } from "../exec/helpers.js";
import { makeCtx } from "../state/helpers.js";
import { modelOf, nested } from "./support.js";
import { withHarness } from "../support/harness.js";

const seed = process.env["FC_SEED"] !== undefined ? Number(process.env["FC_SEED"]) : Date.now() % 2_147_483_647;
console.log(`property seed: ${seed} (re-run with FC_SEED=${seed})`);

/** A deeply nested value that fast-check prints by name (its own printer recurses). */
function deep(n: number): unknown {
  const v = nested(n) as object;
  Object.defineProperty(v, fc.toStringMethod, { value: () => `nested(${n})`, enumerable: false });
  return v;
}

const tmp = tempDir("cairn-hostile-prop-");
after(() => tmp.remove());

/** Strings a hostile model might put in an argv: NUL, huge, lone surrogates, odd Unicode, shell syntax. */
const hostileString = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.constantFrom("a\u0000b", "\u0000", "\ud800", "\udfff x", "e\u0301", "\u202e\u2066", "$(touch /tmp/pwned)", "; rm -rf /", "🧪".repeat(10), "\r\n"),
  fc.constantFrom(65_536, 43_691, 131_071, 131_072, 200_000).map((n) => (n === 43_691 ? "€".repeat(n) : n === 65_536 ? "€".repeat(n) : "x".repeat(n))),
);
/** Only harmless programs ever run: echo, true, printf, or commands that do not exist. */
const argvArb = fc.tuple(fc.constantFrom("echo", "true", "printf", "/no/such/cmd", "no-such-cmd-xyz", "", "./missing"), fc.array(hostileString, { maxLength: 6 })).map(([cmd, rest]) => [cmd, ...rest]);

const revision = 3;
const cellAt = (id: number) =>
  fc.oneof(
    argvArb.map((argv) => ({ id, previous_id: null, kind: "cmd", argv })),
    fc.string({ maxLength: 50 }).map((text) => ({ id, previous_id: null, kind: "note", text })),
    fc.constantFrom("# /// script\n# ///\n", "# /// a\n".repeat(2000), "\u0000print(1)").map((source) => ({ id, previous_id: null, kind: "script", source })),
    fc.jsonValue({ maxDepth: 3 }),
  );
const opArb = fc.oneof(
  cellAt(1).map((value) => ({ op: "add", path: "/cells/-", value })),
  fc.record({ op: fc.constantFrom("add", "replace", "remove", "move", "copy", "test", "__proto__"), path: fc.oneof(fc.string({ maxLength: 30 }), fc.constant(`/${"p".repeat(300_000)}`), fc.constant("/cells/0/__proto__")), value: fc.jsonValue({ maxDepth: 2 }) }),
  fc.constantFrom(deep(10_000), deep(65), JSON.parse('{"__proto__":{"polluted":true}}') as unknown),
);
const patchArb = fc.oneof(
  fc.array(opArb, { maxLength: 4 }).map((ops) => [{ op: "test", path: "/revision", value: revision }, ...ops]),
  fc.jsonValue({ maxDepth: 4 }),
  fc.constantFrom(deep(100_000), [], null, "patch"),
);

describe("admission under hostile input", () => {
  it("never throws; every refusal is a bounded reason; nothing outside plain objects is polluted", () => {
    fc.assert(
      fc.property(patchArb, (patch) => {
        const out = admit(makeCtx({ revision }), patch, "s1:t9");
        if (!out.ok) {
          assert.ok(out.reason.length > 0 && out.reason.length <= MAX_REASON_CHARS, `reason of ${out.reason.length} characters`);
        } else {
          for (const c of out.receipt.newCells) if (c.kind === "cmd") for (const a of c.argv) assert.ok(!a.includes("\u0000") && Buffer.byteLength(a) < 131_072);
        }
        assert.equal(({} as Record<string, unknown>)["polluted"], undefined);
      }),
      { seed, numRuns: 300 },
    );
  });
});

describe("the executor under hostile argv", () => {
  const executor = createExecutor({ killGraceMs: 200 });
  let cell = 1;
  it("every launch settles: gated and then finished, or unlaunchable with result error and a reason", async () => {
    await fc.assert(
      fc.asyncProperty(argvArb, async (argv) => {
        const prepared = await executor.prepare({
          cellId: cell++,
          cell: { kind: "cmd", argv },
          cwd: tmp.dir,
          scriptDir: join(tmp.dir, "scripts"),
          wallTimeMs: 20_000,
          outputLimitBytes: 1 << 16,
          onOutput: collector().onOutput,
        });
        if (prepared.kind === "unlaunchable") {
          assert.equal(prepared.outcome.result, "error");
          assert.ok((prepared.outcome.detail ?? "").length > 0);
          return;
        }
        prepared.release();
        const done = await prepared.done;
        assert.ok(done.result === "success" || done.result === "error", `result ${done.result}`);
      }),
      { seed, numRuns: 40 },
    );
  });
});

describe("whole runs with a hostile model", () => {
  it("each run ends terminal, whatever the model sent first", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(patchArb, { minLength: 1, maxLength: 3 }), async (firsts) => {
        const t = tempDir("cairn-hostile-run-");
        const model = modelOf((req, call) => {
          const r = req.state.revision;
          const id = req.state.runtime.next_cell_id;
          const hostile = firsts[call - 1];
          if (hostile !== undefined) {
            // Aim the hostile patch at the current revision and ids, so it gets past the first checks.
            if (Array.isArray(hostile) && hostile.length > 0) {
              return [{ op: "test", path: "/revision", value: r }, ...hostile.slice(1).map((op) => (op !== null && typeof op === "object" && (op as { value?: { id?: unknown } }).value?.id === 1 ? { ...op, value: { ...(op as { value: object }).value, id } } : op))];
            }
            return hostile;
          }
          return [{ op: "test", path: "/revision", value: r }, { op: "add", path: "/cells/-", value: { id, previous_id: null, kind: "note", role: "conclusion", result: "failure", text: "end" } }];
        });
        await withHarness({ storage: createMemoryStorage(), name: "p", model, workDir: t.dir, limits: { retryBaseMs: 1, outputFlushMs: 20, stopGraceMs: 200, executionWallTimeMs: 20_000, maxAttemptsPerTurn: 10 } }, async (h) => {
          const s = await h.start({ goal: "g", cwd: t.dir });
          let guard: NodeJS.Timeout | undefined;
          const out = await Promise.race([h.wait(s), new Promise<null>((r) => (guard = setTimeout(() => r(null), 60_000)))]).finally(() => clearTimeout(guard));
          assert.ok(out !== null, "the run neither ended nor waited on the model: it is wedged");
          assert.ok(out.result === "failure" || out.result === "success");
          const sp = h.session(s)!;
          for (const ex of sp.executions.values()) assert.equal(ex.phase, "finished", `cell ${ex.cell_id} left ${ex.phase}`);
        }).finally(() => t.remove());
      }),
      { seed, numRuns: 12 },
    );
  });
});
