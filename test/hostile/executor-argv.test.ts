/**
 * Issue 10: an argv the kernel or Node refuses never wedges a launch. The executor is driven directly
 * (admission would refuse these argv first): a NUL byte, one argument over MAX_ARG_STRLEN, and a
 * command line over ARG_MAX all end as an unlaunchable execution with result `error` and a reason.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createExecutor, type LaunchSpec } from "../../src/exec/executor.js";
import { collector, tempDir } from "../exec/helpers.js";

const tmp = tempDir("cairn-hostile-exec-");
after(() => tmp.remove());
const executor = createExecutor({ killGraceMs: 200 });

function spec(argv: string[], cellId: number): LaunchSpec {
  return { cellId, cell: { kind: "cmd", argv }, cwd: tmp.dir, scriptDir: join(tmp.dir, "scripts"), wallTimeMs: 30_000, outputLimitBytes: 1 << 16, onOutput: collector().onOutput };
}

async function settlesUnlaunchable(argv: string[], cellId: number, mentions: RegExp): Promise<void> {
  // A hang guard only (the bug was a launch that never settled); never a timing assertion.
  let guard: NodeJS.Timeout | undefined;
  const prepared = await Promise.race([
    executor.prepare(spec(argv, cellId)),
    new Promise<"hung">((resolve) => {
      guard = setTimeout(() => resolve("hung"), 30_000);
    }),
  ]);
  clearTimeout(guard);
  assert.notEqual(prepared, "hung", "the launch never settled");
  if (prepared === "hung") return;
  if (prepared.kind === "gated") {
    await prepared.abort();
    assert.fail("the launch was gated: the argv reached a process");
  }
  assert.equal(prepared.outcome.result, "error");
  assert.match(prepared.outcome.detail ?? "", mentions);
}

describe("executor: argv the kernel refuses", () => {
  test("a NUL byte in an argument: unlaunchable with a reason (no synchronous throw)", async () => {
    await settlesUnlaunchable(["echo", "a\u0000b"], 1, /NUL/);
  });
  test("one argument of 65,536 three-byte characters (192 KiB of UTF-8, over MAX_ARG_STRLEN): unlaunchable, E2BIG", async () => {
    await settlesUnlaunchable(["echo", "€".repeat(65_536)], 2, /too long|E2BIG/);
  });
  test("a command line over ARG_MAX: unlaunchable, E2BIG", async () => {
    await settlesUnlaunchable(["echo", ...Array.from({ length: 64 }, () => "x".repeat(100_000))], 3, /too long|E2BIG/);
  });
  test("the executor still launches normally afterwards", async () => {
    const p = await executor.prepare(spec(["true"], 4));
    assert.equal(p.kind, "gated");
    if (p.kind !== "gated") return;
    p.release();
    assert.equal((await p.done).result, "success");
  });
});
