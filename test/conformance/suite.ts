/**
 * The Storage conformance suite: every adapter (memory, sqlite, replicated) runs exactly these cases,
 * once plainly and once in "reopen after every commit" mode. The memory adapter is the reference.
 *
 * Usage, in a `*.test.ts` file:
 *   conformance("sqlite", async () => ({ storage, reopenStorage, storageWithFaults, cleanup }));
 */
import { describe, it } from "node:test";
import type { FaultHook, Storage } from "../../src/storage/contract.js";
import { logCases } from "./cases-log.js";
import { ownershipCases } from "./cases-ownership.js";
import { mailboxCases } from "./cases-mailbox.js";

/** What an adapter's test file provides; `makeHarness` is called once per case (a fresh backing store). */
export interface ConformanceTarget {
  /** The Storage under test. */
  readonly storage: Storage;
  /**
   * A second Storage object on the same backing data, as another process would have. The memory
   * adapter returns the same object. The harness closes every Storage it returned in `cleanup`.
   */
  reopenStorage(): Promise<Storage>;
  /** A Storage on the same kind of backing data (not necessarily the same data) calling `faults` on every commit. */
  storageWithFaults(faults: FaultHook): Promise<Storage>;
  /** Closes every Storage it created and removes temporary data. Called even when a case fails. */
  cleanup(): Promise<void>;
}

/** What a case receives. */
export interface CaseContext {
  readonly target: ConformanceTarget;
  /** True in "reopen after every commit" mode; `Owner` (fixtures.ts) does the reopening. */
  readonly reopen: boolean;
  /** A database name unique to this case. */
  readonly name: string;
}

/** One conformance case. */
export interface ConformanceCase {
  readonly name: string;
  run(ctx: CaseContext): Promise<void>;
}

/** Every case, in the order they run. */
export const CASES: readonly ConformanceCase[] = [...logCases, ...ownershipCases, ...mailboxCases];

/**
 * Registers the suite for adapter `name` with node:test: two `describe` blocks (plain, and reopen
 * after every commit), one `it` per case, each on a fresh harness that is cleaned up even on failure.
 */
export function conformance(name: string, makeHarness: () => Promise<ConformanceTarget>): void {
  for (const reopen of [false, true]) {
    describe(`${name} storage conformance (${reopen ? "reopen after every commit" : "plain"})`, () => {
      for (const [i, c] of CASES.entries()) {
        it(c.name, async () => {
          const target = await makeHarness();
          try {
            await c.run({ target, reopen, name: `conf-${i}${reopen ? "-r" : ""}` });
          } finally {
            await target.cleanup();
          }
        });
      }
    });
  }
}
