/**
 * The Storage conformance suite, importable by any adapter (`cairn/storage/conformance`): every
 * adapter runs exactly these cases, once plainly and once reopening the database after every commit.
 * The memory adapter is the reference. An adapter whose data outlives its process (`persists: true`)
 * also runs the two-process ownership cases, with a real second OS process.
 *
 * Usage, in a `*.test.ts` file run by node:test:
 *
 *   import { conformance } from "cairn/storage/conformance";
 *   conformance("my-adapter", async () => ({ storage, reopenStorage, storageWithFaults, cleanup }), { persists: false });
 *
 * `include` / `exclude` filter the cases by id or name (see CASES); `modes` picks plain, reopen or both.
 */
import { describe, it } from "node:test";
import { ConfigError } from "../../errors.js";
import { logCases } from "./cases-log.js";
import { limitCases } from "./cases-limits.js";
import { mailboxCases } from "./cases-mailbox.js";
import { ownershipCases } from "./cases-ownership.js";
import { snapshotCases } from "./cases-snapshot.js";
import { defaultExecArgv, twoProcessCases } from "./two-process.js";
import type { AdapterUnderTest, ConformanceCase, ConformanceMode, ConformanceOptions } from "./types.js";

export type { AdapterUnderTest, CaseContext, ConformanceCase, ConformanceMode, ConformanceOptions, OtherProcess } from "./types.js";
export { COMMIT_FLOOR, MAILBOX_LIMIT } from "../contract.js";

/** Every case, in the order they run. */
export const CASES: readonly ConformanceCase[] = [...logCases, ...ownershipCases, ...mailboxCases, ...limitCases, ...snapshotCases, ...twoProcessCases];

const DEFAULT_WAIT_BOUND_MS = 30_000;

/** The cases `options` selects, in order (also what `conformance` registers). Throws ConfigError when none is left. */
export function selectCases(options: ConformanceOptions = {}): ConformanceCase[] {
  const matches = (c: ConformanceCase, p: string | RegExp) => (typeof p === "string" ? c.id.includes(p) || c.name.includes(p) : p.test(c.id) || p.test(c.name));
  const include = options.include ?? [];
  const exclude = options.exclude ?? [];
  const chosen = CASES.filter(
    (c) =>
      (options.persists === true || c.persistsOnly !== true) &&
      (include.length === 0 || include.some((p) => matches(c, p))) &&
      !exclude.some((p) => matches(c, p)),
  );
  if (chosen.length === 0) {
    throw new ConfigError(`conformance: no case matches include ${String(include)} / exclude ${String(exclude)}; the case ids are ${CASES.map((c) => c.id).join(", ")}.`);
  }
  return chosen;
}

/**
 * Registers the suite for adapter `name` with node:test: one `describe` per mode, one `it` per case,
 * each on a fresh AdapterUnderTest from `factory` that is cleaned up even when the case fails.
 */
export function conformance(name: string, factory: () => Promise<AdapterUnderTest>, options: ConformanceOptions = {}): void {
  const modes: readonly ConformanceMode[] = options.modes ?? ["plain", "reopen"];
  if (modes.length === 0 || modes.some((m) => m !== "plain" && m !== "reopen")) {
    throw new ConfigError(`conformance: modes must list "plain" and/or "reopen", got ${JSON.stringify(modes)}.`);
  }
  const waitBoundMs = options.waitBoundMs ?? DEFAULT_WAIT_BOUND_MS;
  if (!Number.isFinite(waitBoundMs) || waitBoundMs <= 0) throw new ConfigError(`conformance: waitBoundMs must be a positive number of ms, got ${String(waitBoundMs)}.`);
  const resolved = { persists: options.persists === true, execArgv: [...(options.execArgv ?? defaultExecArgv())] };
  const cases = selectCases(options);
  for (const [m, mode] of modes.entries()) {
    const reopen = mode === "reopen";
    describe(`${name} storage conformance (${reopen ? "reopen after every commit" : "plain"})`, () => {
      for (const c of cases) {
        if (c.once === true && m > 0) continue;
        it(c.name, async () => {
          const target = await factory();
          try {
            await c.run({ target, reopen, name: `conf-${c.id.replace(/[^A-Za-z0-9-]/g, "-")}${reopen ? "-r" : ""}`, waitBoundMs, options: resolved });
          } finally {
            await target.cleanup();
          }
        });
      }
    });
  }
}
export * as fixtures from "./fixtures.js";
