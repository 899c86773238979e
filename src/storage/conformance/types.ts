/**
 * The types of the conformance suite: what an adapter hands the suite (`AdapterUnderTest`), the
 * options of a run, and what a case receives.
 */
import type { FaultHook, Storage } from "../contract.js";

/**
 * What an adapter's test file provides; the factory given to `conformance` is called once per case,
 * so each case starts on fresh backing data.
 */
export interface AdapterUnderTest {
  /** The Storage under test. */
  readonly storage: Storage;
  /**
   * A second Storage object on the same backing data, as another process would have. An adapter that
   * keeps nothing beyond its object (memory) returns the same object. `cleanup` closes every Storage
   * the factory created.
   */
  reopenStorage(): Promise<Storage>;
  /** A Storage on the same kind of backing data (not necessarily the same data) calling `faults` on every commit. */
  storageWithFaults(faults: FaultHook): Promise<Storage>;
  /**
   * Adapters that persist (`persists: true`): how a separate OS process creates a Storage on the same
   * backing data. The suite starts `node` on its own driver, which imports `module` and calls
   * `module[exportName](config)`.
   */
  readonly otherProcess?: OtherProcess;
  /** Closes every Storage it created and removes temporary data. Called even when a case fails. */
  cleanup(): Promise<void>;
}

/** How another OS process creates the Storage under test. */
export interface OtherProcess {
  /** An absolute path or a `file:` URL of an ES module. */
  readonly module: string;
  /** The export to call: `(config) => Storage | Promise<Storage>`. */
  readonly exportName: string;
  /** Plain JSON handed to that function (the data directory, the endpoints...). */
  readonly config: unknown;
}

/** "plain": each case as written; "reopen": every resolved commit closes the handle and opens it again. */
export type ConformanceMode = "plain" | "reopen";

/** Options of `conformance(name, factory, options)`. */
export interface ConformanceOptions {
  /**
   * True for an adapter whose data outlives its process (sqlite, replicated): the two-process
   * ownership cases run, and every AdapterUnderTest must provide `otherProcess`. Default false.
   */
  readonly persists?: boolean;
  /** Run only the cases whose id or name matches one of these (a string matches as a substring). Default: all. */
  readonly include?: readonly (string | RegExp)[];
  /** Leave out the cases whose id or name matches one of these. */
  readonly exclude?: readonly (string | RegExp)[];
  /** The modes to run (default both). Cases marked `once` run in the first mode listed only. */
  readonly modes?: readonly ConformanceMode[];
  /**
   * Node flags for the other process (default: this process's loader flags, such as `--import tsx`,
   * so an adapter written in TypeScript loads there the way it loads here).
   */
  readonly execArgv?: readonly string[];
  /** How long a case waits for an asynchronous signal or another process before failing (default 30 000 ms). A hang guard, not a latency assertion. */
  readonly waitBoundMs?: number;
}

/** What a case receives. */
export interface CaseContext {
  readonly target: AdapterUnderTest;
  /** True in "reopen" mode; `Owner` (fixtures.ts) does the reopening. */
  readonly reopen: boolean;
  /** A database name unique to this case. */
  readonly name: string;
  /** See ConformanceOptions.waitBoundMs. */
  readonly waitBoundMs: number;
  /** The resolved options (execArgv filled in). */
  readonly options: Required<Pick<ConformanceOptions, "execArgv" | "persists">>;
}

/** One conformance case. */
export interface ConformanceCase {
  /** A stable id, `area.what` (e.g. "mailbox.full"): what filters match, with the name. */
  readonly id: string;
  readonly name: string;
  /** Runs in one mode only: reopening after commits would add nothing (or the case opens processes). */
  readonly once?: boolean;
  /** Only for adapters that persist (the other process must find the data). */
  readonly persistsOnly?: boolean;
  run(ctx: CaseContext): Promise<void>;
}
